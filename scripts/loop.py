"""The continual-learning loop over one folder (the same commands as `rlcli loop`).

    python scripts/loop.py init loops/prod --traces 'logs/*.jsonl' --format openai --train sft,distill \
        --regression regression.jsonl
    python scripts/loop.py run loops/prod --once          # or --watch --every 1h
    python scripts/loop.py status loops/prod | history loops/prod
    python scripts/loop.py promote loops/prod 3 | rollback loops/prod
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("loop")
