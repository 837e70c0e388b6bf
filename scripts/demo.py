"""A short real job through the tinker client against a running server (same as `rlcli demo`).

    python scripts/serve.py start && python scripts/demo.py && python scripts/serve.py stop
"""

from rlcli.demo import demo
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main(demo)
