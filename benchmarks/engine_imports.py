"""How long the server engine's imports take in a fresh process, with and without the distributions' import
names (top_level.txt) that rlcli writes into the server venv after each install.

    .venv/bin/python -m benchmarks.engine_imports --rounds 8 --label names

Each round starts the server venv's Python twice, once per state of the venv, in alternating order (A B, B A,
...), so a loaded machine's drift falls on both:
- "names": every distribution declares its import names (what `rlcli serve install` leaves);
- "inferred": the files rlcli wrote are removed again (with their RECORD lines), as uv leaves the venv.
Each child imports what the preloaded engine imports (launcher.PRELOAD_MODULES), then times one more call of
importlib.metadata.packages_distributions(), which transformers makes while it is imported. Recorded per start:
wall and CPU seconds of the imports, and that call's time. The venv is left with its names written and its
marker line, as rlcli leaves it. Needs a writable, complete server venv (`rlcli serve install`).
Writes benchmarks/receipts/engine-imports-<date>.json.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import fire

from benchmarks.common import summary, versions, write_receipt
from rlcli.config import server_venv_dir
from rlcli.server import server_venv
from rlcli.server.runtime.shared import PRELOAD_MODULES

CHILD = """
import json, time, importlib
wall, cpu = time.perf_counter(), time.process_time()
for name in %r:
    importlib.import_module(name)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
import importlib.metadata as m
t = time.perf_counter(); m.packages_distributions(); pd = time.perf_counter() - t
from importlib.metadata import version
print(json.dumps({"imports_wall_s": wall, "imports_cpu_s": cpu, "packages_distributions_s": pd,
                  "versions": {p: version(p) for p in ("skyrl", "transformers", "torch", "jax")}}))
"""


def remove_names(venv: Path) -> int:
    """Undo write_top_level_names: the files whose RECORD line rlcli added, those lines, the marker line."""
    removed = 0
    for record in venv.glob("lib/python3*/site-packages/*.dist-info/RECORD"):
        line = f"{record.parent.name}/top_level.txt,,"
        lines = record.read_text().splitlines()
        if line in lines:
            (record.parent / "top_level.txt").unlink(missing_ok=True)
            record.write_text("".join(f"{ln}\n" for ln in lines if ln != line))
            removed += 1
    marker = venv / server_venv.MARKER
    marker.write_text("".join(f"{ln}\n" for ln in marker.read_text().split() if ln != server_venv.TOP_LEVEL))
    return removed


def one_start(venv: Path) -> dict:
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", CHILD % (PRELOAD_MODULES,)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the import child failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(rounds: int = 8, venv: str | None = None, label: str = "", out: str | None = None) -> None:
    path = server_venv_dir(venv)
    if not server_venv.is_complete(path, "jax"):
        raise SystemExit(f"no complete jax server venv at {path}: run `rlcli serve install` first")
    raw: dict[str, list[dict]] = {"names": [], "inferred": []}
    written = removed = 0
    child_versions: dict = {}
    try:
        for i in range(rounds):
            for state in (("names", "inferred") if i % 2 == 0 else ("inferred", "names")):
                if state == "names":
                    server_venv.write_top_level_names(path)
                    written = max(written, sum(1 for _ in path.glob("lib/python3*/site-packages/*.dist-info/"
                                                                    "top_level.txt")))
                else:
                    removed = max(removed, remove_names(path))
                result = one_start(path)
                child_versions = result.pop("versions")
                raw[state].append(result)
                print(f"round {i + 1}/{rounds} {state:8s} imports {result['imports_wall_s']:.2f}s wall "
                      f"{result['imports_cpu_s']:.2f}s cpu, packages_distributions "
                      f"{result['packages_distributions_s']:.3f}s", flush=True)
    finally:
        server_venv.write_top_level_names(path)  # as rlcli leaves it
    results = {state: {key: summary([r[key] for r in runs]) for key in runs[0]} for state, runs in raw.items()}
    delta = {key: results["inferred"][key]["median"] - results["names"][key]["median"] for key in raw["names"][0]}
    body = {"label": label, "versions": {**versions(), "server": child_versions},
            "config": {"rounds": rounds, "modules": list(PRELOAD_MODULES), "order": "alternating, A B then B A",
                       "distributions_with_top_level_txt_when_written": written,
                       "files_removed_for_inferred": removed},
            "raw": raw, "results": results, "median_saving_s": delta}
    receipt = write_receipt("engine-imports", body, Path(out) if out else None)
    print(json.dumps({"median_saving_s": {k: round(v, 3) for k, v in delta.items()}}))
    print(f"receipt: {receipt}")


if __name__ == "__main__":
    fire.Fire(main)
