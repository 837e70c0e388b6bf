"""Harbor tasks in local Docker (same as `rlcli harbor run` and `rlcli train harbor`).

    python scripts/harbor.py run tests/fixtures/harbor --policy oracle          # each task's own solution, graded
    python scripts/harbor.py run tests/fixtures/harbor --policy nop             # doing nothing scores 0
    python scripts/harbor.py train --dataset tests/fixtures/harbor --max-steps 20 --group-size 4
    python scripts/harbor.py train --dataset terminal-bench@2.0 --dry-run        # offline: how to download it
"""

from rlcli.scripting import launch_one_of

if __name__ == "__main__":
    launch_one_of({"run": ("harbor", "run"), "train": ("train", "harbor")})
