"""Convert chat logs to training JSONL (the same function as `rlcli import`).

    python scripts/import.py logs.jsonl --format openai --output train.jsonl
    cat runs.jsonl | python scripts/import.py --input=- --format langsmith --min-score 0.5 --redact

Stdin is `--input=-`: fire reads a bare `-` as its own separator.
"""

from rlcli.data.import_cmd import import_cmd
from rlcli.scripting import fire_main

if __name__ == "__main__":
    fire_main(import_cmd)
