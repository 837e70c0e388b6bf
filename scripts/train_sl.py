"""Supervised fine-tuning on chat JSONL against a running server (same as `rlcli train sl`).

    python scripts/train_sl.py --dataset chats.jsonl --epochs 3
    rlcli import logs.jsonl -f openai | python scripts/train_sl.py --dataset - --dry-run
    python scripts/train_sl.py --dataset chats.jsonl --log-path runs/a --resume   # after a crash
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("train", "sl")
