"""Problems synthesized from imported traces (the same commands as `rlcli synth`).

    python scripts/synth.py qa traces.jsonl --output qa.jsonl        # then: train rl --dataset qa.jsonl
    python scripts/synth.py qa traces.jsonl --output qa.jsonl --turn all
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("synth")
