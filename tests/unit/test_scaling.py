"""--processes, --local-processes and --coordinator as SkyRL's jax backend config (no server)."""

from __future__ import annotations

import pytest

from rlcli.errors import UsageError
from rlcli.server import commands, scaling


def config(processes=2, local=None, coordinator=None, gpus=None, tp=1, insecure=False, backend="jax", given=None):
    cfg = dict(given or {})
    workers = scaling.processes_config(backend, processes, local, coordinator, gpus, tp, insecure, cfg)
    return workers, cfg


def test_local_processes_get_a_loopback_coordinator_and_fsdp_over_all():
    workers, cfg = config(processes=3)
    assert workers == 2 and cfg["num_processes"] == 3 and cfg["fully_sharded_data_parallel_size"] == 3
    host, port = cfg["coordinator_address"].rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0


def test_one_process_changes_nothing_and_gpus_multiply_the_mesh():
    assert config(processes=1) == (0, {})
    _, cfg = config(processes=2, gpus=4, tp=2, given={"fully_sharded_data_parallel_size": 2})  # as --gpus mapped it
    assert cfg["fully_sharded_data_parallel_size"] == 4  # 2 processes x 4 GPUs / tp 2
    _, cfg = config(given={"fully_sharded_data_parallel_size": 1, "tensor_parallel_size": 2}, tp=2)
    assert cfg["fully_sharded_data_parallel_size"] == 1  # 2 devices / tp 2


def test_remote_workers_need_a_reachable_coordinator_and_insecure():
    assert config(processes=3, local=1, coordinator="10.0.0.5:7777", insecure=True)[0] == 0
    with pytest.raises(UsageError, match="--coordinator HOST:PORT"):
        config(processes=3, local=1)
    with pytest.raises(UsageError, match="--insecure"):
        config(processes=3, local=1, coordinator="10.0.0.5:7777")
    with pytest.raises(UsageError, match="not HOST:PORT"):
        config(coordinator="10.0.0.5")


@pytest.mark.parametrize("kwargs, words", [
    (dict(processes=2, backend="fsdp"), "for the jax backend"),
    (dict(processes=2, given={"use_ray": True}), "use_ray"),
    (dict(processes=1, local=2), "go with --processes"),
])
def test_bad_combinations_are_one_line_usage_errors(kwargs, words):
    with pytest.raises(UsageError, match=words):
        config(**kwargs)


@pytest.mark.parametrize("kwargs, words", [
    (dict(processes=0), "--processes must be at least 1, got 0"),
    (dict(processes=2, local_processes=3), "--local-processes 3 must be 1..2"),
    (dict(gpus=0), "--gpus must be at least 1"), (dict(nodes=0), "--nodes must be at least 1"),
    (dict(tp=0), "--tp must be at least 1"), (dict(slots=0), "--slots must be at least 1"),
    (dict(port=0), "--port must be 1 to 65535"), (dict(sampler_snapshots=0), "--sampler-snapshots must be at least 1"),
])
def test_start_options_out_of_range_are_refused_before_anything(kwargs, words):
    with pytest.raises(UsageError, match=words):
        commands.StartOptions(**kwargs)


def test_worker_refuses_a_bad_process_id_before_building_anything():
    with pytest.raises(UsageError, match="must be 1..2"):
        commands.WorkerOptions(coordinator="127.0.0.1:7777", processes=3, process_id=0)


def test_lost_worker_line_is_read_from_the_log():
    tail = "x\n[rlcli launcher] jax worker process 1 exited with code -9; the server cannot run without it: stopping\n"
    assert scaling.lost_worker_line(tail).startswith("jax worker process 1 exited with code -9")
    assert scaling.lost_worker_line("nothing here") is None
    restarted = tail + "INFO Starting background engine\n"  # a start after the loss: that server has its workers
    assert scaling.lost_worker_line(restarted) is None


def test_every_request_to_a_server_that_lost_a_worker_names_the_worker(tmp_path, monkeypatch):
    """A local server stopped by its launcher: the watchdog's line says which worker, not only that none answers."""
    import json

    from rlcli import watchdog
    from rlcli.server import process

    monkeypatch.setenv("RLCLI_HOME", str(tmp_path))
    folder = tmp_path / "servers" / "default"
    folder.mkdir(parents=True)
    url = "http://127.0.0.1:9"  # the discard port: nothing answers
    (folder / process.STATE_FILE).write_text(json.dumps(dict(pid=1, pgid=1, start_ticks=0, host="127.0.0.1", port=9,
                                                              base_model="m", backend="jax", started_at=0.0)))
    (folder / process.LOG_FILE).write_text("INFO Starting background engine\n[rlcli launcher] jax worker process 1 "
                                           "exited with code -9; the server cannot run without it: stopping\n")
    with pytest.raises(watchdog.ServerGone) as gone, watchdog.watch(url, 0.5):
        raise ConnectionError("refused")
    assert str(gone.value) == (f"the server at {url} stopped (its jax worker process 1 exited with code -9): restart "
                               "it (`rlcli serve restart`), then run the command again")
    assert watchdog.lost_worker("http://127.0.0.1:10") is None  # no server of this home there


def test_on_ray_every_process_is_an_actor_and_samples_fit_the_mesh():
    cfg: dict = {}
    assert scaling.processes_config("jax", 2, None, None, None, 1, False, cfg, ray_address="127.0.0.1:6379") == 0
    assert cfg == {"use_ray": True, "num_processes": 2, "fully_sharded_data_parallel_size": 2}  # actors pad
    stock: dict = {}  # --no-extensions: stock actors pad a sampling batch only up to a cap
    scaling.processes_config("jax", 2, None, None, None, 1, False, stock, ray_address="127.0.0.1:6379",
                             extensions=False)
    assert stock == {**cfg, "sample_max_num_sequences": 2}
    with pytest.raises(UsageError, match="Ray places the jax processes"):
        scaling.processes_config("jax", 2, 1, None, None, 1, False, {}, ray_address="127.0.0.1:6379")


def test_the_ray_lock_changes_no_pin_of_the_jax_lock():
    from rlcli.locks import ROOT, pins

    jax, ray = (pins(ROOT / f"rlcli/server/env/server-{name}.lock") for name in ("jax", "ray"))
    assert "ray" in ray and not {name for name in ray.keys() & jax.keys() if ray[name] != jax[name]}
