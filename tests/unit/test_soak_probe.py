"""The soak's trend rule and readings (benchmarks/soak_probe.py) on made-up series and a made-up server folder."""

from __future__ import annotations

import random

from benchmarks import soak_probe as probe


def minutes(n: int) -> list[float]:
    return [i / 6 for i in range(n)]  # a reading every 10 s


def test_a_noisy_level_series_is_flat():
    rng = random.Random(0)
    values = [1000 + rng.gauss(0, 20) for _ in range(180)]
    assert probe.trend(minutes(180), values, 1 / 3)["verdict"] == "flat"


def test_a_slow_leak_under_the_noise_is_found():
    rng = random.Random(1)
    values = [1000 + 4 * t + rng.gauss(0, 20) for t in minutes(180)]  # 4 MB a minute: 80 MB over the window
    got = probe.trend(minutes(180), values, 1 / 3)
    assert got["verdict"] == "growing" and 3 < got["slope_per_min"] < 5


def test_warm_up_growth_is_left_out():
    values = [min(t, 5) * 100 for t in minutes(180)]  # grows for 5 minutes, then level
    assert probe.trend(minutes(180), values, 1 / 3)["verdict"] == "flat"
    assert probe.trend(minutes(180), values, 0)["verdict"] == "growing"


def test_missing_windows_are_skipped_and_too_few_said():
    assert probe.trend([0, 1, 2], [None, 1, None], 0)["verdict"] == "too few samples"
    assert probe.trend([0, 1, 2, 3], [5, None, 5, 5], 0)["verdict"] == "flat"


def test_checkpoints_split_into_training_named_sampler_and_snapshots(tmp_path):
    model = tmp_path / "m1"
    (model / "sampler_weights").mkdir(parents=True)
    for name, size in (("000003", 100), ("final", 40)):  # a training state is a folder named NAME.tar.gz
        (model / f"{name}.tar.gz").mkdir()
        (model / f"{name}.tar.gz" / "state.bin").write_bytes(b"x" * size)
    (model / "sampler_weights" / "final.tar.gz").write_bytes(b"x" * 10)
    for n in range(3):
        (model / "sampler_weights" / f"ss1_seq{n}.tar.gz").write_bytes(b"x" * 7)
    got = probe.checkpoint_bytes(tmp_path)
    assert got == {"training": 140, "sampler_named": 10, "sampler_snapshots": 21, "snapshot_files": 3,
                   "most_of_a_model": 3, "final": 50, "most_states_of_a_model": 1, "loop": 0, "finals": 1}
    looped = probe.checkpoint_bytes(tmp_path, frozenset({"m1"}))  # a model a loop's ledger names: its history
    assert looped | {"loop": 0, "final": 50, "finals": 1} == got and looped["loop"] == 150 and looped["final"] == 0
    assert looped["finals"] == 0


def test_server_processes_are_told_apart_by_their_launcher_role():
    assert probe.role_of("python /x/runtime/launcher.py preload") == "engine"
    assert probe.role_of("python /x/runtime/launcher.py api --port 1") == "api"
    assert probe.role_of("python /x/runtime/launcher.py supervise --log l") == "launcher"
    assert probe.role_of("python -m rlcli endpoint run --port 1 --capture-max-hours 0.1") == "endpoint"
    assert probe.role_of("python -m tinker_cookbook.capture.store.daemon --data-dir d") == "capture"
    assert probe.pct([3, 1, 2, 4], 0.5) == 2 and probe.pct([], 0.5) is None


def test_descriptors_are_judged_by_their_floor_so_connections_in_flight_are_not_a_leak():
    rng = random.Random(2)
    t = minutes(180)
    bursts = [40 + (rng.random() < 0.3) * rng.randint(0, 110) for _ in t]  # a flat floor, connections on top
    bursts[-12:] = [40, *[150] * 11]  # a burst of them at the end tips a line through every reading
    assert probe.trend(t, bursts, 1 / 3)["verdict"] == "growing"
    assert probe.trend(t, bursts, 1 / 3, probe.FLOOR_MINUTES)["verdict"] == "flat"
    leak = [40 + 3 * m + (rng.random() < 0.3) * rng.randint(0, 110) for m in t]  # 3 fds a minute that never go
    assert probe.trend(t, leak, 1 / 3, probe.FLOOR_MINUTES)["verdict"] == "growing"
    assert probe.floors([(0, 5), (1, 3), (2.5, 9), (3, 7)], 2) == [(0.5, 3), (2.75, 7)]
    short = probe.trend(minutes(6), [40, 90, 41, 80, 40, 41], 0, probe.FLOOR_MINUTES)  # under 3 windows: readings
    assert short["verdict"] == "flat" and short["n"] == 6


def test_a_sawtooth_under_retention_is_bounded_and_rising_peaks_are_not():
    t = minutes(360)
    saw = [(i % 30) * 3.0 for i in range(len(t))]  # grows for 5 minutes, deleted back to nothing, again
    assert probe.peaks(t, saw, 1 / 3)["verdict"] == "bounded"
    rising = [v + 0.5 * m for v, m in zip(saw, t, strict=True)]  # what each cycle leaves behind
    got = probe.peaks(t, rising, 1 / 3)
    assert got["verdict"] == "growing" and got["second_peak"] > got["first_peak"]
    assert probe.peaks([0, 1], [1, 2], 0)["verdict"] == "too few samples"


def test_futures_past_their_retention_are_counted(tmp_path):
    import sqlite3
    from datetime import UTC, datetime, timedelta

    db = tmp_path / "tinker.db"
    now = datetime.now(UTC)
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE futures (request_id INTEGER PRIMARY KEY, status TEXT, completed_at TEXT)")
        for i, (status, age) in enumerate([("COMPLETED", 1), ("COMPLETED", 9), ("FAILED", 20), ("PENDING", None)]):
            done = None if age is None else (now - timedelta(minutes=age)).strftime("%Y-%m-%d %H:%M:%S.%f")
            conn.execute("INSERT INTO futures VALUES (?, ?, ?)", (i, status, done))
    got = probe.futures_rows(db, retention_minutes=5)  # older than 5 + 2 minutes: the 9 and the 20
    assert got == {"futures_rows": 4, "futures_pending": 1, "futures_past_retention": 2}
    assert "futures_past_retention" not in probe.futures_rows(db)


def test_the_engines_memory_line_is_read_from_the_log_tail(tmp_path):
    log = tmp_path / "server.log"
    assert probe.engine_memory(log) == {}
    log.write_text("noise\n[rlcli memory] trimmed the heap (malloc_trim): RSS 1500 -> 1210 MB; jax arrays alive 310 "
                   "(96.5 MB); again every 60 s\n" + "x" * (probe.LOG_TAIL_BYTES + 10)
                   + "\n[rlcli memory] trimmed the heap (malloc_trim): RSS 1400 -> 1300 MB; jax arrays alive 320 "
                   "(99.0 MB); again every 60 s\n")
    assert probe.engine_memory(log) == {"engine_trimmed_rss_mb": 1300, "engine_arrays": 320,
                                        "engine_arrays_mb": 99.0}


def test_the_soak_judges_each_series_by_what_bounds_it(tmp_path):
    import json

    from benchmarks import soak

    rows = [{"t_s": i * 10.0, "futures_rows": 100 + 5 * i, "futures_past_retention": 0,
             "disk_mb_database": 1 + 0.1 * i, "disk_mb_server_log": 5 + (i % 30), "server_rss_mb": 1000 + 3 * i}
            for i in range(120)]  # rising rows and file (the rate rose), a log within its cap, RSS climbing
    got = {k: soak.verdict_of(k, rows, 1 / 4)["verdict"] for k in ("futures_rows", "disk_mb_database",
                                                                   "disk_mb_server_log", "server_rss_mb")}
    assert got == {"futures_rows": "bounded", "disk_mb_database": "bounded", "disk_mb_server_log": "bounded",
                   "server_rss_mb": "growing"}
    rows[-1] |= {"futures_past_retention": 3, "disk_mb_server_log": 41}  # the retention or the rotation failed
    assert soak.verdict_of("futures_rows", rows, 1 / 4)["verdict"] == "growing"
    assert soak.verdict_of("disk_mb_database", rows, 1 / 4)["verdict"] == "growing"
    assert soak.verdict_of("disk_mb_server_log", rows, 1 / 4)["verdict"] == "growing"
    receipt = tmp_path / "soak.json"
    zeros = dict.fromkeys((*soak.EXPECTED, "sampler_snapshots_most_per_model"), 0)
    receipt.write_text(json.dumps({"series": [zeros | r for r in rows],
                                   "requests": [], "jobs": [], "config": {"warmup_share": 0.25}, "verdict": {}}))
    soak.rejudge_receipt(receipt, plot=False)
    data = json.loads(receipt.read_text())
    assert data["verdict"]["trends"]["disk_mb_server_log"]["verdict"] == "growing" and data["rejudged_utc"]
    assert "Peaks" not in data["config"]["flat_rule"] and data["config"]["peak_rule"]


def test_finals_are_judged_by_count_against_keep_runs_and_the_runs_ended_since_the_last_prune():
    from benchmarks import soak

    def job(name, start, seconds):
        return {"job": name, "start_s": start, "seconds": seconds, "rc": 0}

    jobs = [job("sl-a", 0, 50), job("sl-b", 0, 55), job("rl", 10, 45),  # three runs end by 55 s
            job("prune", 60, 2),  # lists the runs at 60 s: those three are among its kept
            job("sl-a", 50, 58), job("sl-b", 55, 60)]  # two more end at 108 and 115 s, before the next prune
    assert soak.finals_allowed(30, jobs) == soak.KEEP_RUNS  # nothing ended yet
    assert soak.finals_allowed(56, jobs) == soak.KEEP_RUNS + 3  # no prune finished: every run ended counts
    assert soak.finals_allowed(70, jobs) == soak.KEEP_RUNS  # the prune began after they ended
    assert soak.finals_allowed(120, jobs) == soak.KEEP_RUNS + 2
    rows = [{"t_s": t, "final_checkpoints": n} for t, n in ((30, 2), (56, soak.KEEP_RUNS + 3), (120, 8))]
    assert soak.finals_past_retention(rows, jobs) == 0
    assert soak.verdict_of("disk_mb_checkpoints_final", rows, 1 / 4, jobs)["verdict"] == "bounded"
    rows.append({"t_s": 70, "final_checkpoints": soak.KEEP_RUNS + 1})  # a final the prune should have deleted
    assert soak.finals_past_retention(rows, jobs) == 1
    assert soak.verdict_of("disk_mb_checkpoints_final", rows, 1 / 4, jobs)["verdict"] == "growing"
    assert soak.finals_past_retention([{"t_s": 5}], jobs) is None  # an older receipt: the peak rule judges bytes
