"""Sampler weights out of the server as a PEFT adapter or a merged model (the same command as `rlcli export`).

    python scripts/export.py tinker://RUN/sampler_weights/ID --format peft --output my-adapter
    python scripts/export.py tinker://RUN/sampler_weights/ID --format merged --output my-model --force
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("export")
