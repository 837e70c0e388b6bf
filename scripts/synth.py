"""Problems synthesized from imported traces (the same functions as `rlcli synth`).

    python scripts/synth.py qa traces.jsonl --output qa.jsonl        # then: train rl --dataset qa.jsonl
    python scripts/synth.py qa traces.jsonl --output qa.jsonl --turn all
"""

from rlcli.problems.synth import qa
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main({"qa": qa})
