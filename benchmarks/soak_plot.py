"""The soak's receipt as one small PNG: each resource over time, the warm-up shaded, latency and failures per window.

    .venv/bin/python -m benchmarks.soak_plot benchmarks/receipts/soak-STAMP.json   # writes soak-STAMP.png beside it
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PANELS = (
    ("RSS (MB); the engine's jax arrays; program drops", ("server_rss_mb", "server_rss_mb_engine",
                                                          "engine_trimmed_rss_mb", "server_rss_mb_api",
                                                          "endpoint_rss_mb", "engine_arrays_mb")),
    ("open fds; jax programs compiled", ("server_fds", "endpoint_fds", "compiled_programs")),
    ("futures rows", ("futures_rows",)),
    ("disk (MB)", ("disk_mb_sampler_snapshots", "disk_mb_checkpoints_intermediate", "disk_mb_checkpoints_final",
                   "disk_mb_checkpoints_loop", "disk_mb_capture", "disk_mb_database", "disk_mb_server_log")),
    ("latency per window (ms)", ("latency_p50_ms", "latency_p99_ms")),
    ("requests per window", ("requests", "failed")),
)


def drops(series: list[dict]) -> list[float]:
    """The minutes of the first reading after each new drop of the engine's compiled programs."""
    out, seen = [], 0
    for r in series:
        if (n := r.get("program_drops") or 0) > seen:
            out.append(r["t_s"] / 60)
            seen = n
    return out


def plot(receipt: Path, png: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(receipt.read_text())
    series = data["series"]
    minutes = [r["t_s"] / 60 for r in series]
    warm = minutes[0] + data["config"]["warmup_share"] * (minutes[-1] - minutes[0]) if minutes else 0
    fig, axes = plt.subplots(2, 3, figsize=(12, 6), sharex=True)
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        for key in keys:
            values = [r.get(key) for r in series]
            if any(v is not None for v in values):
                verdict = data["verdict"]["trends"].get(key, {}).get("verdict")
                ax.plot(minutes, values, label=f"{key} ({verdict})" if verdict else key, lw=1)
        ax.axvspan(minutes[0] if minutes else 0, warm, color="0.9")
        if title.startswith("RSS"):  # where the engine dropped its compiled programs (--program-memory)
            for m in drops(series):
                ax.axvline(m, color="0.5", lw=0.6, ls=":")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    for ax in axes[1]:
        ax.set_xlabel("minutes (warm-up shaded)", fontsize=8)
    fig.suptitle(f"rlcli soak {data['created_utc']}: {data['verdict']['requests']} requests, "
                 f"{data['verdict']['failed_requests']} failed", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=72)
    plt.close(fig)
    return png


if __name__ == "__main__":
    print(plot(Path(sys.argv[1]), Path(sys.argv[1]).with_suffix(".png")))
