"""The sweep behind `rlcli loop`'s defaults (LoopSettings: steps, lr, replay) for the embedded model on CPU.

    .venv/bin/python -m benchmarks.loop_defaults [--grid full|small] [--label L]

Each configuration runs one loop folder through benchmarks.continual's skill sequence (five skills, one batch each,
no bad candidates) on one private server, and records per iteration whether the candidate learned its skill and kept
the others on the fixed test sets, whether the gate promoted it (and its new slice's interval), and the champion's
accuracy matrix with its average accuracy and backward transfer (rlcli.loop.measures). What a default must do: the
first iteration of a skill learns it, and the next keeps it. Writes benchmarks/receipts/loop-defaults-<date>.json.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from benchmarks import continual

GRIDS = {  # steps, lr, replay share (0: all data so far in proportion); heldout_share 0.25 in every one
    "full": [(16, 1e-2, 0.0), (32, 1e-2, 0.0), (64, 1e-2, 0.0), (32, 2e-2, 0.0), (64, 5e-3, 0.0),
             (32, 1e-2, 0.5), (64, 1e-2, 0.5), (32, 2e-2, 0.5)],
    "more": [(64, 5e-3, 0.5), (128, 5e-3, 0.0), (128, 5e-3, 0.5)],  # around the best of "full"
    "small": [(32, 1e-2, 0.0), (32, 1e-2, 0.5)],
}


def one(url: str, root: Path, size: continual.Size, steps: int, lr: float, replay: float) -> dict[str, Any]:
    """One configuration's run and what it shows."""
    name = f"steps{steps}-lr{lr:g}-replay{replay:g}"
    start = time.monotonic()
    got = continual.run_all(url, root / name, size, ["default"],
                            {"steps": steps, "lr": lr, "replay": replay, "heldout_share": 0.25})
    run = got["default"]
    rows = run["events"]
    return {"steps": steps, "lr": lr, "replay": replay, "minutes": round((time.monotonic() - start) / 60, 2),
            "learned": [r["truth"]["learned"] for r in rows], "kept": [r["truth"]["kept"] for r in rows],
            "promoted": [r["promoted"] for r in rows],
            "slice_low": [r["skill_slice"]["low"] if r["skill_slice"] else None for r in rows],
            "R_champion": run["R_champion"], "R_candidate": run["R_candidate"], **run["summary"],
            "candidate_bwt": run["summary_candidate"]["bwt"]}


def main(grid: str = "full", label: str = "", out: str | None = None) -> None:
    from benchmarks.common import stop_servers_on_sigterm, versions, write_receipt
    from benchmarks.models import server_versions
    from rlcli.model import ensure_embedded_model
    from rlcli.server.private import private_server

    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    size = replace(continual.FULL, bad_every=continual.FULL.skills)  # no bad candidates: what learns, what keeps
    root = Path(tempfile.mkdtemp(prefix="rlcli-loop-defaults-"))
    runs = []
    try:
        with private_server(str(ensure_embedded_model())) as server:
            for steps, lr, replay in GRIDS[grid]:
                runs.append(one(server.url, root, size, steps, lr, replay))
                r = runs[-1]
                continual.say(f"steps {steps} lr {lr:g} replay {replay:g}: learned {sum(r['learned'])}/"
                              f"{len(r['learned'])}, promoted {sum(r['promoted'])}, ACC {r['acc']:.3f}, BWT "
                              f"{r['bwt']:+.3f} (candidates' {r['candidate_bwt']:+.3f}); {r['minutes']:.1f} min")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    body = {"label": label, "versions": {**versions("tinker", "tinker-cookbook"), "server": server_versions()},
            "config": {"grid": grid, "sequence": asdict(size), "heldout_share": 0.25, "model": "rlcli-tiny-qwen3-v1",
                       "skills": [s.name for s in continual.skills.SKILLS[: size.skills]]},
            "runs": runs}
    continual.say(f"receipt: {write_receipt('loop-defaults', body, Path(out) if out else None)}")


if __name__ == "__main__":
    import fire

    fire.Fire(main)
