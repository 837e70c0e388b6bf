"""Convert chat logs to training JSONL (the same command as `rlcli import`).

    python scripts/import.py logs.jsonl --format openai --output train.jsonl
    cat runs.jsonl | python scripts/import.py - --format langsmith --min-score 0.5 --redact
"""

from rlcli.scripting import launch

if __name__ == "__main__":
    launch("import")
