"""What a client process pays before its first request, with rlcli's lean imports (rlcli/lean_imports.py) and
with transformers' stock imports (the finder taken out again after `import rlcli`).

    .venv/bin/python -m benchmarks.client_start --rounds 8 [--base-url http://127.0.0.1:8000] --label L

Each round starts fresh client processes once per arm, in alternating order (A B, B A, ...), so a loaded
machine's drift falls on both arms:
- "imports": what a `train`, `eval` or `loop` process imports and loads before it talks to a server: rlcli's
  CLI, tinker, the cookbook's SFT data module and renderers, and the embedded model's tokenizer. Recorded:
  wall and CPU seconds, and whether transformers' generation module and torch._dynamo were loaded.
- with --base-url (a running server): a whole `rlcli train sl` of the 4 demo chats x 4, one epoch of two steps, no
  checkpoints. Recorded: wall and the process's CPU seconds.
Writes benchmarks/receipts/client-start-<date>.json.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fire

from benchmarks.common import REPO, summary, versions, write_receipt
from rlcli.demo import DEMO_CHATS

MODEL = REPO / "rlcli" / "assets" / "rlcli-tiny-qwen3-v1"
ARMS = ("lean", "stock")
CHILD = """
import json, sys, time
wall, cpu = time.perf_counter(), time.process_time()
import rlcli.cli, tinker
if sys.argv[2] == "stock":
    rlcli.lean_imports.uninstall()
from tinker_cookbook import renderers
from tinker_cookbook.supervised.data import conversation_to_datum
from tinker_cookbook.tokenizer_utils import get_tokenizer
get_tokenizer(sys.argv[1])
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"wall_s": wall, "cpu_s": cpu,
                  "generation_loaded": "transformers.generation.utils" in sys.modules,
                  "dynamo_loaded": "torch._dynamo" in sys.modules}))
"""


STOCK_CLI = "import rlcli; rlcli.lean_imports.uninstall(); from rlcli.cli import entry; entry()"


def arm_env(arm: str) -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def imports(arm: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(MODEL), arm], capture_output=True, text=True,
                          env=arm_env(arm), timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the import child ({arm}) failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def train_sl(arm: str, base_url: str, data: Path, scratch: Path) -> dict:
    run = Path(tempfile.mkdtemp(dir=scratch))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    cli = ["-c", STOCK_CLI] if arm == "stock" else ["-m", "rlcli.cli"]
    proc = subprocess.run([sys.executable, *cli, "train", "sl", "--dataset", str(data), "--base-url",
                           base_url, "--epochs", "1", "--batch-size", "8", "--save-every", "0", "--log-path",
                           str(run / "run")], capture_output=True, text=True, env=arm_env(arm), timeout=900)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"train sl ({arm}) failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def main(rounds: int = 8, base_url: str | None = None, label: str = "", out: str | None = None) -> None:
    raw: dict[str, dict[str, list[dict]]] = {"imports": {a: [] for a in ARMS}}
    if base_url:
        raw["train_sl"] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory(prefix="rlcli-bench-") as tmp:
        scratch = Path(tmp)
        data = scratch / "chats.jsonl"
        data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p},
                                                         {"role": "assistant", "content": r}]}) + "\n"
                                for p, r in (DEMO_CHATS * 4)[:16]))
        for i in range(rounds):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                one = imports(arm)
                raw["imports"][arm].append(one)
                line = f"round {i + 1}/{rounds} {arm:5s} imports {one['wall_s']:.2f}s wall {one['cpu_s']:.2f}s cpu"
                if base_url:
                    run = train_sl(arm, base_url, data, scratch)
                    raw["train_sl"][arm].append(run)
                    line += f"; train sl {run['wall_s']:.2f}s wall {run['cpu_s']:.2f}s cpu"
                print(line, flush=True)
    results = {kind: {arm: {key: summary([r[key] for r in runs]) for key in ("wall_s", "cpu_s")}
                      for arm, runs in arms.items()} for kind, arms in raw.items()}
    saving = {kind: {key: arms["stock"][key]["median"] - arms["lean"][key]["median"] for key in ("wall_s", "cpu_s")}
              for kind, arms in results.items()}
    body = {"label": label, "versions": versions("transformers", "torch", "tinker", "tinker-cookbook"),
            "config": {"rounds": rounds, "order": "alternating, A B then B A", "model": "rlcli-tiny-qwen3-v1",
                       "train_sl": "the 4 demo chats x 4, 1 epoch, batch 8, no checkpoints" if base_url else None,
                       "arms": {"lean": "rlcli's finder (default)", "stock": "rlcli.lean_imports.uninstall()"}},
            "raw": raw, "results": results, "median_saving_s": saving}
    receipt = write_receipt("client-start", body, Path(out) if out else None)
    print(json.dumps({"median_saving_s": {k: {m: round(v, 2) for m, v in s.items()} for k, s in saving.items()}}))
    print(f"receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
