"""On-policy distillation from a teacher, against a running server (same as `rlcli train distill`).

    python scripts/train_distill.py --prompts arithmetic --teacher base --load-checkpoint runs/sft   # recover
    python scripts/train_distill.py --prompts arithmetic --teacher runs/rl --lora-rank 4 --dry-run   # plan only
    python scripts/train_distill.py --prompts arithmetic --teacher-url http://127.0.0.1:8001          # 2 servers
    python scripts/train_distill.py --prompts arithmetic --teacher base --log-path runs/d --resume
"""

from rlcli.scripting import fire_main
from rlcli.train.distill import train_distill

if __name__ == "__main__":
    fire_main(train_distill)
