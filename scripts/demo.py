"""A short real job through the tinker client against a running server (same as `rlcli demo`).

    python scripts/serve.py start && python scripts/demo.py && python scripts/serve.py stop
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("demo")
