"""The inference endpoint over the server's weights (the same commands as `rlcli endpoint`).

    python scripts/endpoint.py start --loops loop       # OpenAI/Anthropic API on 127.0.0.1:8100, traffic captured
    python scripts/endpoint.py run --no-record          # in the foreground, recording nothing
    python scripts/endpoint.py status | stop
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("endpoint")
