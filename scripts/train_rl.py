"""RL with a server-side loss on tinker-cookbook's RL loop, against a running server (same as `rlcli train rl`).

    python scripts/train_rl.py --loss gspo --dataset arithmetic --max-steps 50       # fused GSPO when served
    python scripts/train_rl.py --loss gspo --passes 2 --dataset gsm8k --dataset-path gsm8k_train.jsonl
    python scripts/train_rl.py --loss ppo --dataset problems.jsonl --dry-run         # print the plan only
    python scripts/train_rl.py --loss cispo --dataset arithmetic --log-path runs/a --resume   # after a crash
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("train", "rl")
