"""What the notebooks beside this file share: paths, a server of their own, rlcli runs, metrics, plots.

The notebooks run with this folder as their working directory (`make notebooks` and
tests/integration/test_notebooks.py pass it to papermill), so `import notebook_helpers` finds this file.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/*.py import each other by bare name
import fused_vs_2pass as bench  # noqa: E402, F401  (re-exported for the notebook, once the path is set)


@contextlib.contextmanager
def server(base_url: str | None, size: str = "tiny") -> Iterator[str]:
    """base_url as given, or a private server of our own for the `size` model, stopped when the block ends."""
    if base_url:
        yield base_url
        return
    from models import bench_server, model_dir  # benchmarks/, on the path above

    with bench_server(model_dir(size)) as srv:
        yield srv.url


def rlcli(*args: str, timeout: float = 1800) -> str:
    """Run an rlcli command as a person would; its output's last lines are shown, a failure raises."""
    proc = subprocess.run([sys.executable, "-m", "rlcli.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)
    print("\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:]))
    if proc.returncode != 0:
        raise RuntimeError(f"rlcli {' '.join(args)} exited {proc.returncode}")
    return proc.stdout


def read_metrics(run_folder: Path) -> list[dict]:
    """metrics.jsonl of a run folder: the contract every training command writes."""
    path = Path(run_folder) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric; a resumed run logs some steps twice: the last one wins."""
    by_step = {row["step"]: row[key] for row in rows if key in row}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def finite(values: dict) -> bool:
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values.values())


def plot_fused(run: dict, title: str):
    """Per-step times of both paths, pair by pair, and the fused/2-pass ratio with its median and floor."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (steps_ax, ratio_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    pairs = range(1, len(run["raw_s"]["fused"]) + 1)
    for path, label in (("fused", "fused (1 request)"), ("two_pass", "2-pass (2 requests)")):
        steps_ax.plot(pairs, run["raw_s"][path], "o-", label=label)
    steps_ax.set(xlabel="pair", ylabel="step seconds (forward_backward + optim_step)", title=title)
    steps_ax.legend()
    ratio = run["summary"]["ratio"]
    ratio_ax.plot(pairs, run["pair_ratio_fused_over_two_pass"], "o-", color="C2", label="fused / 2-pass")
    ratio_ax.axhline(ratio["median"], color="C2", linestyle="--", label=f"median {ratio['median']:.2f}")
    floor = run["floor"]["floor_fb_over_fwd_plus_fb"]
    ratio_ax.axhline(floor, color="grey", linestyle=":", label=f"compute floor fb/(fwd+fb) {floor:.2f}")
    ratio_ax.set(xlabel="pair", ylabel="ratio", title="fused / 2-pass, per pair")
    ratio_ax.legend()
    for ax in (steps_ax, ratio_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def plot_learning(sl_rows: list[dict], rl_rows: list[dict]):
    """SFT loss (train_mean_nll) and RL reward/correct per step, from the two runs' metrics.jsonl."""
    import matplotlib.pyplot as plt

    fig, (sl_ax, rl_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    sl_ax.plot(*series(sl_rows, "train_mean_nll"), "o-")
    sl_ax.set(xlabel="step", ylabel="train_mean_nll", title="SFT: loss")
    for key in ("env/all/reward/total", "env/all/correct"):
        rl_ax.plot(*series(rl_rows, key), "o-", label=key)
    rl_ax.set(xlabel="step", ylabel="mean over the batch", title="RL (gspo): reward")
    rl_ax.legend()
    fig.tight_layout()
    return fig
