"""The continual-learning loop over one folder (the same functions as `rlcli loop`).

    python scripts/loop.py init loops/prod --traces 'logs/*.jsonl' --format openai --train sft,distill \
        --regression regression.jsonl
    python scripts/loop.py run loops/prod --once          # or --watch --every 1h
    python scripts/loop.py status loops/prod | history loops/prod
    python scripts/loop.py promote loops/prod 3 | rollback loops/prod
"""

from rlcli.loop import commands
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main({
        "init": commands.init,
        "run": commands.run,
        "status": commands.status,
        "history": commands.history,
        "promote": commands.promote,
        "rollback": commands.rollback,
    })
