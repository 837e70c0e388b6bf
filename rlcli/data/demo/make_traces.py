"""Regenerate demo-traces.openai.jsonl: logged Chat Completions traffic the demo imports and trains on.

    .venv/bin/python rlcli/data/demo/make_traces.py > rlcli/data/demo/demo-traces.openai.jsonl

The records mix the layouts real logs use (request+response side by side, {messages, choices},
a response inside a batch-API line) so `make demo` exercises the importer, not just the trainer.
"""

from __future__ import annotations

import json
import random
import sys


def _reply(a: int, b: int) -> str:
    return f"{a} + {b} = {a + b}."


def records(n: int = 64, seed: int = 0):
    rng = random.Random(seed)
    for i in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        question = [{"role": "system", "content": "You are a careful calculator."},
                    {"role": "user", "content": f"What is {a} + {b}?"}]
        answer = {"role": "assistant", "content": _reply(a, b)}
        choice = {"index": 0, "message": answer, "finish_reason": "stop"}
        layout = i % 3
        if layout == 0:
            yield {"request": {"model": "prod-model", "messages": question},
                   "response": {"id": f"chatcmpl-{i}", "choices": [choice]}}
        elif layout == 1:
            yield {"model": "prod-model", "messages": question, "choices": [choice]}
        else:
            yield {"messages": [*question, answer]}
    # Records a careless importer would lose or mistrain on; rlcli counts each under a reason.
    yield {"model": "prod-model", "messages": [{"role": "user", "content": "hello?"}]}  # no reply
    yield {"model": "prod-model", "messages": question,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "1"}, "finish_reason": "length"}]}


if __name__ == "__main__":
    for record in records():
        sys.stdout.write(json.dumps(record) + "\n")
