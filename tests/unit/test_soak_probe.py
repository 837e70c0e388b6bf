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
                   "most_of_a_model": 3, "final": 50, "most_states_of_a_model": 1, "loop": 0}
    looped = probe.checkpoint_bytes(tmp_path, frozenset({"m1"}))  # a model a loop's ledger names: its history
    assert looped | {"loop": 0, "final": 50} == got and looped["loop"] == 150 and looped["final"] == 0


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
