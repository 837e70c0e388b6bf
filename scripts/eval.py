"""Score a checkpoint or the base model on train rl's held-out problems (the same command as `rlcli eval`).

    python scripts/eval.py --dataset arithmetic --max-operand 9 --eval-size 18                       # the base model
    python scripts/eval.py --dataset arithmetic --max-operand 9 --eval-size 18 --checkpoint RUN_FOLDER
    python scripts/eval.py --dataset gsm8k --eval-size 1319 --max-tokens 512 --checkpoint tinker://RUN/sampler_weights/ID
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("eval")
