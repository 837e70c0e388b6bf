"""On-policy distillation from a teacher, against a running server (same as `rlcli train distill`).

    python scripts/train_distill.py --prompts arithmetic --teacher base --load-checkpoint runs/sft   # recover
    python scripts/train_distill.py --prompts arithmetic --teacher runs/rl --lora-rank 4 --dry-run   # plan only
    python scripts/train_distill.py --prompts arithmetic --teacher-url http://127.0.0.1:8001          # 2 servers
    python scripts/train_distill.py --prompts arithmetic --teacher base --log-path runs/d --resume
    python scripts/train_distill.py --prompts traces.jsonl --teacher base --teacher-context answer  # self-distill

--prompts FILE.jsonl takes {"question", "answer"} lines or `rlcli import` conversations (the prompt: the
conversation before its last assistant turn; that reply: the answer). --teacher-context answer computes the
teacher's logprobs on the prompt with that answer noted (written to the run's teacher_prompts.jsonl).
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("train", "distill")
