"""Sampler weights out of the server as a PEFT adapter or a merged model (the same function as `rlcli export`).

    python scripts/export.py tinker://RUN/sampler_weights/ID --format peft --output my-adapter
    python scripts/export.py tinker://RUN/sampler_weights/ID --format merged --output my-model --force
"""

from rlcli.export import export
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main(export)
