"""What the soak (benchmarks/soak.py) reads every few seconds, and how it judges a series flat.

Readings: the server's processes (its process group: the launcher, the API, the engine and their children) and the
endpoint's (its group: the app and the capture daemon), RSS and open file descriptors per role; the rows of SkyRL's
futures table (sqlite, read-only); bytes on disk under the server's home: training checkpoints, named sampler
weights, unnamed sampler snapshots (the RL loop's per-step weights, which `--sampler-snapshots` bounds), the capture
store, SkyRL's database and the server log.

Trend: a least-squares line through a series after warm-up. A series is flat when the line's rise over that window
is within twice its standard error (no trend beyond the noise) or within FLAT_SHARE of the series' mean there (a
trend too small to matter at this length). Open file descriptors are judged by their floor: the least reading of each
FLOOR_MINUTES, since connections in flight (a trainer's, a request's) come and go between readings and a leak is
what never goes, which lifts the floor.

Peaks: a series a retention bounds (checkpoints deleted as runs end or are pruned, captures past their age) is a
sawtooth whose slope says nothing; it is bounded when the highest reading of the second half of the window after
warm-up is within FLAT_SHARE of the first half's highest (a leak lifts every peak after the first).
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil

from rlcli.server import process

FLAT_SHARE = 0.05
FLOOR_MINUTES = 5.0
# SkyRL names an unnamed (per-step, sampling-session) sampler save ss<session>_seq<n>; a name a client gave is kept
UNNAMED = re.compile(r"^ss.*_seq\d+")
FINAL = "final"  # the name the recipes save a run's last checkpoint under (what --keep-checkpoints always keeps)


def roles(pgid: int) -> dict[str, list[psutil.Process]]:
    """The live processes of a process group, by role: what its command line runs."""
    out: dict[str, list[psutil.Process]] = {}
    for pid in process.group_members(pgid):
        try:
            p = psutil.Process(pid)
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        out.setdefault(role_of(cmd), []).append(p)
    return out


# rlcli's launcher runs every server process as `launcher.py ROLE`; the engine starts as the preloaded process
LAUNCHER_ROLES = {"supervise": "launcher", "api": "api", "preload": "engine", "engine": "engine", "worker": "worker"}


def role_of(cmd: str) -> str:
    words = cmd.split()
    for i, word in enumerate(words[:-1]):
        if word.endswith("launcher.py"):
            return LAUNCHER_ROLES.get(words[i + 1], words[i + 1])
    # the endpoint app's own flags say "capture" (--capture-max-hours): it is told apart by its command first
    return "endpoint" if " endpoint " in f" {cmd} " else "capture" if "capture" in cmd else "other"


def process_readings(prefix: str, pgid: int | None) -> dict[str, float]:
    """RSS (MB), its anonymous part (heap: what a leak or malloc's arenas grow; the rest is mapped files) and open
    file descriptors of a group, in all and per role; the group's descriptors by kind; the count of its processes."""
    by_role = roles(pgid) if pgid else {}
    out: dict[str, float] = {f"{prefix}_processes": sum(len(ps) for ps in by_role.values())}
    rss_all = fds_all = 0.0
    kinds = dict.fromkeys(FD_KINDS, 0)
    for role, procs in sorted(by_role.items()):
        rss = anon = fds = 0.0
        for p in procs:
            try:
                rss += p.memory_info().rss / 2**20
                fds += p.num_fds()
            except psutil.Error:
                pass
            anon += anonymous_kb(p.pid) / 1024
            for kind, n in fd_kinds(p.pid).items():
                kinds[kind] += n
        out[f"{prefix}_rss_mb_{role}"], out[f"{prefix}_fds_{role}"] = round(rss, 1), fds
        out[f"{prefix}_anon_mb_{role}"] = round(anon, 1)
        rss_all, fds_all = rss_all + rss, fds_all + fds
    out[f"{prefix}_rss_mb"], out[f"{prefix}_fds"] = round(rss_all, 1), fds_all
    return out | {f"{prefix}_fds_{kind}": n for kind, n in kinds.items()}


FD_KINDS = ("socket", "pipe", "anon", "file")


def fd_kinds(pid: int) -> dict[str, int]:
    """A process's open descriptors by what they point at: sockets, pipes, anon inodes (eventfd, epoll), files."""
    out = dict.fromkeys(FD_KINDS, 0)
    for fd in _entries(Path(f"/proc/{pid}/fd")):
        try:
            target = os.readlink(fd)
        except OSError:  # closed while we looked
            continue
        kind = target.split(":", 1)[0] if target.startswith(("socket:", "pipe:")) else (
            "anon" if target.startswith("anon_inode:") else "file")
        out[kind] += 1
    return out


def anonymous_kb(pid: int) -> int:
    """The anonymous resident memory of a process (/proc/PID/smaps_rollup's Anonymous), 0 when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def compiled_programs(cache: Path) -> dict[str, float]:
    """Programs jax compiled on this server so far: entries of its persistent compilation cache (the server writes
    every one, however fast: rlcli/server/commands.py's compilation_cache_env), each an executable in the engine's
    memory. A new batch shape or sequence length adds one; a fixed set of shapes bounds them."""
    return {"compiled_programs": sum(not f.name.endswith("-atime") for f in _entries(cache))}


def futures_rows(db: Path, retention_minutes: float | None = None) -> dict[str, float]:
    """Rows of SkyRL's futures table (all, and still pending), read-only so the engine's writes never wait on us;
    with retention_minutes, the finished rows older than it and the pruner's minute (`futures_past_retention`:
    what the retention failed to delete; 0 when it holds, whatever the request rate)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            total = conn.execute("SELECT count(*) FROM futures").fetchone()[0]
            pending = conn.execute("SELECT count(*) FROM futures WHERE status = 'PENDING'").fetchone()[0]
            out = {"futures_rows": total, "futures_pending": pending}
            if retention_minutes is not None:
                cutoff = datetime.now(UTC) - timedelta(minutes=retention_minutes + PRUNE_SLACK_MINUTES)
                out["futures_past_retention"] = conn.execute(
                    "SELECT count(*) FROM futures WHERE status != 'PENDING' AND completed_at < ?",
                    (cutoff.strftime("%Y-%m-%d %H:%M:%S"),)).fetchone()[0]
    except sqlite3.Error:
        return {}
    return out


# The engine's pruner runs at most once a minute, after a look: a row may outlive the retention by that much
PRUNE_SLACK_MINUTES = 2.0
ENGINE_MEMORY = re.compile(r"\[rlcli memory\] trimmed the heap .*?RSS (\d+) -> (\d+) MB; jax arrays alive (\d+) "
                           r"\(([\d.]+) MB\)")
PROGRAM_DROP = re.compile(r"\[rlcli memory\] dropped the compiled programs .*; drop (\d+)")


# A minute of the server log under the soak's mix: its requests' access lines came to more than 256 KB (the steady
# soak's last third read no memory line at 256 KB)
LOG_TAIL_BYTES = 4 * 2**20


def engine_memory(log: Path) -> dict[str, float]:
    """The engine's newest memory line in the server log (runtime/rlcli_memory.py, once a minute): its RSS after
    the heap trim and the jax arrays it holds alive (count, MB), and how many times it has dropped its compiled
    programs (--program-memory) when the log's tail shows one; nothing before its first trim."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except OSError:
        return {}
    found = ENGINE_MEMORY.findall(tail)
    drops = {"program_drops": int(d[-1])} if (d := PROGRAM_DROP.findall(tail)) else {}
    if not found:
        return drops
    _, after, count, mb = found[-1]
    return {"engine_trimmed_rss_mb": int(after), "engine_arrays": int(count), "engine_arrays_mb": float(mb), **drops}


def tree_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # deleted while we walked: the snapshots' retention at work
                pass
    return total


def checkpoint_bytes(base: Path, loop_models: frozenset[str] = frozenset()) -> dict[str, int]:
    """Training checkpoints, named sampler weights, unnamed sampler snapshots under checkpoints/MODEL/KIND/NAME; of
    those, the bytes of final checkpoints and of the models a loop's ledger names (`loop_models`: its stages' runs,
    kept as its history whatever the retention); `finals`: how many models outside the loop's have a final."""
    out = {"training": 0, "sampler_named": 0, "sampler_snapshots": 0, "snapshot_files": 0, "most_of_a_model": 0,
           "final": 0, "most_states_of_a_model": 0, "loop": 0, "finals": 0}
    for model in _entries(base):
        files = states = 0
        looped = model.name in loop_models
        out["finals"] += not looped and any(k.name.startswith(f"{FINAL}.") for k in _entries(model))
        for kind in _entries(model):
            if kind.name != "sampler_weights":
                size = tree_bytes(kind) if kind.is_dir() else _size(kind)
                out["training"] += size
                out["loop" if looped else "final"] += size if looped or kind.name.startswith(f"{FINAL}.") else 0
                states += kind.name.endswith(".tar.gz") and not kind.name.startswith(f"{FINAL}.")
                continue
            for f in _entries(kind):
                unnamed = bool(UNNAMED.match(f.name))
                out["sampler_snapshots" if unnamed else "sampler_named"] += _size(f)
                if not unnamed:
                    out["loop" if looped else "final"] += _size(f) if looped or f.name.startswith(f"{FINAL}.") else 0
                files += unnamed and f.name.endswith(".tar.gz")
        out["snapshot_files"] += files
        out["most_of_a_model"] = max(out["most_of_a_model"], files)
        out["most_states_of_a_model"] = max(out["most_states_of_a_model"], states)
    return out


def loop_models(ledger: Path) -> frozenset[str]:
    """The server models (tinker://MODEL/...) a loop's ledger names: its stages' runs and its champions."""
    from rlcli.train.retention import ledger_paths

    try:
        paths = ledger_paths(ledger)
    except sqlite3.Error:
        return frozenset()
    return frozenset(p.removeprefix("tinker://").split("/")[0] for p in paths if p.startswith("tinker://"))


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def disk_readings(server_dir: Path, capture: Path, checkpoints: Path, ledger: Path | None = None) -> dict[str, float]:
    mb = 2**20
    ck = checkpoint_bytes(checkpoints, loop_models(ledger) if ledger and ledger.is_file() else frozenset())
    db = sum(_size(server_dir / f"tinker.db{s}") for s in ("", "-wal", "-shm"))
    logs = sum(_size(server_dir / f"server.log{s}") for s in ("", ".1"))
    return {"disk_mb_checkpoints_training": round(ck["training"] / mb, 3),
            "disk_mb_sampler_named": round(ck["sampler_named"] / mb, 3),
            "disk_mb_sampler_snapshots": round(ck["sampler_snapshots"] / mb, 3),
            "sampler_snapshot_files": ck["snapshot_files"], "sampler_snapshots_most_per_model": ck["most_of_a_model"],
            "disk_mb_checkpoints_final": round(ck["final"] / mb, 3), "final_checkpoints": ck["finals"],
            "disk_mb_checkpoints_loop": round(ck["loop"] / mb, 3),
            "disk_mb_checkpoints_intermediate": round((ck["training"] + ck["sampler_named"] - ck["final"] - ck["loop"])
                                                      / mb, 3),
            "intermediate_states_most_per_model": ck["most_states_of_a_model"],
            "disk_mb_capture": round(tree_bytes(capture) / mb, 3), "disk_mb_database": round(db / mb, 3),
            "disk_mb_server_log": round(logs / mb, 3)}


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by the nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def floors(pairs: list[tuple[float, float]], minutes: float) -> list[tuple[float, float]]:
    """Per window of `minutes` (from the first reading): its middle and its least reading."""
    windows: dict[int, list[tuple[float, float]]] = {}
    for t, v in pairs:
        windows.setdefault(int((t - pairs[0][0]) // minutes), []).append((t, v))
    return [((w[0][0] + w[-1][0]) / 2, min(v for _, v in w)) for _, w in sorted(windows.items())]


def trend(times_min: list[float], values: list[float | None], warmup_share: float,
          floor_minutes: float | None = None) -> dict:
    """The least-squares slope (per minute) after warm-up, its standard error, the rise over that window, and the
    verdict by the module's rule; with floor_minutes, of the series' floor (`floors`) after warm-up."""
    pairs = [(t, v) for t, v in zip(times_min, values, strict=True) if v is not None]
    if not pairs:
        return {"n": 0, "verdict": "no data"}
    start = pairs[0][0] + warmup_share * (pairs[-1][0] - pairs[0][0])
    kept = [(t, v) for t, v in pairs if t >= start]
    if floor_minutes and kept and kept[-1][0] - kept[0][0] >= 3 * floor_minutes:  # a short soak: every reading
        kept = floors(kept, floor_minutes)
    if len(kept) < 3:
        return {"n": len(kept), "verdict": "too few samples"}
    ts, vs = [t for t, _ in kept], [v for _, v in kept]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    sxx = sum((t - mt) ** 2 for t in ts)
    slope = sum((t - mt) * (v - mv) for t, v in kept) / sxx if sxx else 0.0
    residuals = [v - (mv + slope * (t - mt)) for t, v in kept]
    se = math.sqrt(sum(r * r for r in residuals) / (len(kept) - 2) / sxx) if sxx else 0.0
    span = ts[-1] - ts[0]
    rise, bound = slope * span, 2 * se * span
    small = abs(rise) <= FLAT_SHARE * abs(mv) if mv else rise == 0
    return {"n": len(kept), "from_min": round(ts[0], 2), "to_min": round(ts[-1], 2), "mean": mv,
            "slope_per_min": slope, "slope_stderr": se, "rise_over_window": rise, "noise_bound": bound,
            "per_hour": slope * 60, "verdict": "flat" if abs(rise) <= bound or small else
            ("growing" if slope > 0 else "falling")}


def peaks(times_min: list[float], values: list[float | None], warmup_share: float) -> dict:
    """The highest reading of each half of the window after warm-up, and the verdict by the module's peak rule."""
    pairs = [(t, v) for t, v in zip(times_min, values, strict=True) if v is not None]
    if len(pairs) < 4:
        return {"n": len(pairs), "verdict": "too few samples"}
    start = pairs[0][0] + warmup_share * (pairs[-1][0] - pairs[0][0])
    kept = [(t, v) for t, v in pairs if t >= start]
    middle = (kept[0][0] + kept[-1][0]) / 2
    first = max((v for t, v in kept if t <= middle), default=0.0)
    second = max((v for t, v in kept if t > middle), default=0.0)
    return {"n": len(kept), "from_min": round(kept[0][0], 2), "to_min": round(kept[-1][0], 2), "first_peak": first,
            "second_peak": second, "verdict": "bounded" if second <= first * (1 + FLAT_SHARE) else "growing"}
