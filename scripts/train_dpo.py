"""DPO on preference pairs against a running server (same as `rlcli train dpo`).

    python scripts/train_dpo.py --dataset pairs.jsonl --beta 0.1 --epochs 2
    python scripts/train_dpo.py --dataset pairs.jsonl --load-checkpoint runs/sl-1 --max-steps 20   # after SFT
    cat pairs.jsonl | python scripts/train_dpo.py --dataset - --dry-run                          # the plan only
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("train", "dpo")
