"""The jax backend over two processes (`rlcli serve start --processes 2`), on the real server, on CPU.

A private 2-process server (JAX's distributed runtime, gloo collectives, fsdp = 2) trains, samples, saves and
exports, and its numbers match the session's 1-process server on the same batch; every process loads rlcli's
extensions (fused gspo served); a worker killed with -9 stops the server, `serve status` names the worker, the
training run in flight and every request after fail with one line naming it, and `serve stop` leaves no process
behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from rlcli.client import unload_model
from rlcli.errors import EXIT_SERVER_GONE
from rlcli.server.private import RLCLI, free_port, private_env, private_server
from rlcli.server.process import group_members, read_state, wait_ready
from rlcli.train.losses import served_losses
from tests.conftest import REPO, run_rlcli, shared_compile_cache, shared_server_venv
from tests.faults.conftest import SL_DATA, step_rows, trainer, wait_for

pytestmark = [pytest.mark.server, pytest.mark.slow]

STEPS = 3
ADAM = dict(learning_rate=2e-2)


@pytest.fixture(scope="module")
def two_processes(embedded_model, tmp_path_factory):
    # The session server's --slots, so both tables have the same shape.
    with private_server(embedded_model, "--processes", "2", "--slots", "7", venv=shared_server_venv(),
                        home=shared_compile_cache(tmp_path_factory.mktemp("rlcli-2proc-home")), timeout=900) as srv:
        yield srv


def _batch():
    """Three sequences of different lengths: an odd batch that the 2-device mesh pads, as real ones are."""
    import tinker

    out = []
    for i, n in enumerate((17, 9, 23)):
        tokens = [(7 * i + 3 * j) % 200 + 5 for j in range(n)]
        out.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (n - 1)}))
    return out


def _logprobs(output) -> list[np.ndarray]:
    return [o["logprobs"].to_numpy() for o in output.loss_fn_outputs]


def _train(url: str, model: str) -> dict:
    """STEPS SFT steps on the fixed batch from a seeded LoRA: each step's loss, then logprobs after them."""
    import tinker

    client = tinker.ServiceClient(base_url=url).create_lora_training_client(base_model=model, rank=4, seed=0).result()
    try:
        losses = []
        for _ in range(STEPS):
            out = client.forward_backward(_batch(), "cross_entropy").result()
            losses.append(float(np.mean([-lp.mean() for lp in _logprobs(out)])))
            client.optim_step(tinker.AdamParams(**ADAM)).result()
        after = _logprobs(client.forward(_batch(), "cross_entropy").result())
        saved = client.save_weights_for_sampler("after").result().path
        sample = client.create_sampling_client(model_path=saved).result().sample(
            tinker.ModelInput.from_ints([5, 6, 7]), num_samples=1,
            sampling_params=tinker.SamplingParams(max_tokens=4, temperature=0.0)).result()
        return dict(losses=losses, after=after, saved=saved, sampled=sample.sequences[0].tokens, id=client.model_id)
    finally:
        unload_model(url, client.model_id)


def test_two_processes_train_sample_save_export_and_match_one_process(two_processes, server, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    two, one = _train(two_processes.url, two_processes.model), _train(server.url, server.model)
    assert two["losses"][-1] < two["losses"][0]  # it learns
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-4, atol=1e-5)
    for a, b in zip(two["after"], one["after"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    assert two["sampled"] == one["sampled"] and len(two["sampled"]) == 4  # greedy: the same tokens
    proc = run_rlcli("export", two["saved"], "--format", "peft", "-o", str(tmp_path / "peft"),
                     env=two_processes.env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "peft" / "adapter_model.safetensors").stat().st_size > 0


def test_every_process_loads_the_extensions(two_processes):
    log = two_processes.log.read_text()
    assert log.count("registered gspo as jax loss") == 2  # the engine and the worker
    assert "process 0: every process loaded the same extensions" in log
    assert "process 1: every process loaded the same extensions" in log
    assert "gspo" in served_losses(two_processes.url)[1]
    status = run_rlcli("serve", "status", env=two_processes.env)
    assert status.returncode == 0 and status.stdout.startswith("running:")


def _local_worker(srv) -> int:
    state = read_state(srv.home / "servers" / "default")
    workers = [pid for pid in group_members(state.pgid)
               if b"launcher.py\0worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(workers) == 1
    return workers[0]


def test_a_dead_worker_stops_the_server_and_stop_leaves_nothing(two_processes, tmp_path):
    """Last in this file: it ends the module's server. A training run in flight ends within its --server-timeout,
    and every request after fails at once, each with one line naming the worker."""
    state = read_state(two_processes.home / "servers" / "default")
    workers = [_local_worker(two_processes)]
    folder = tmp_path / "run"
    training = trainer("train", "sl", "--dataset", str(SL_DATA), "--batch-size", "2", "--epochs", "1", "--base-url",
                       two_processes.url, "--log-path", str(folder), "--server-timeout", "10", env=two_processes.env)
    wait_for(lambda: len(step_rows(folder)) >= 1, 600, training, "a training step")
    os.kill(workers[0], signal.SIGKILL)
    _, err = training.communicate(timeout=180)
    lost = "jax worker process 1 exited with code -9"
    assert training.returncode == EXIT_SERVER_GONE and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith(f"rlcli: error: the server at {two_processes.url} stopped (its "
                                                   f"{lost}) after step "), err[-2000:]
    deadline = time.monotonic() + 60
    status = run_rlcli("serve", "status", env=two_processes.env)
    while time.monotonic() < deadline and not status.stdout.startswith("dead:"):  # stopping: unresponsive first
        time.sleep(1)
        status = run_rlcli("serve", "status", env=two_processes.env)
    assert status.stdout.startswith("dead:") and lost in status.stdout
    sample = run_rlcli("sample", "--prompt", "hi", "--max-tokens", "2", env=two_processes.env, timeout=120)
    assert sample.returncode != 0 and len(sample.stderr.strip().splitlines()) == 1, sample.stderr
    assert f"stopped (its {lost})" in sample.stderr, sample.stderr
    run_rlcli("serve", "stop", env=two_processes.env, check=True)
    assert group_members(state.pgid) == []


# Two jax processes on CPU run one program over both devices and print the persistent-cache hits each had
# (jax's monitoring events); with "patched", process 1 writes its entries as rlcli's workers do.
_SHARED_PROGRAM = """
import sys
sys.path.insert(0, sys.argv[4])
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import distributed

hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
pid = int(sys.argv[1])
jax.distributed.initialize(coordinator_address="127.0.0.1:" + sys.argv[2], num_processes=2, process_id=pid)
if sys.argv[3] == "patched" and pid == 1:
    distributed.cache_worker_programs()
sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), PartitionSpec("x"))
x = jax.make_array_from_callback((4,), sharding, lambda index: np.arange(4.0)[index])
print(f"process {pid} result {float(jax.jit(lambda a: (a * 2.5 + 1).sum())(x))} hits {len(hits)}", flush=True)
jax.distributed.shutdown()
"""


def _shared_program(cache: Path, mode: str) -> str:
    """Run the 2-process script above on `cache`; both processes' output lines."""
    python = str(shared_server_venv() / "bin" / "python")
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    runtime, port = str(REPO / "rlcli" / "server" / "runtime"), str(free_port())
    procs = [subprocess.Popen([python, "-c", _SHARED_PROGRAM, str(pid), port, mode, runtime], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for pid in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    return "".join(out for out, _ in outs)


def test_a_stopped_worker_is_named_by_requests_and_status(embedded_model, tmp_path_factory):
    """A worker stopped with SIGSTOP (alive, not dead) while its engine beats on: a request fails within its
    --server-timeout with one line naming the worker, `serve status` says it. A server of its own: jax's
    coordination service declares a process silent for 30 s dead (distributed.HEARTBEAT_S) and the worker then
    aborts once continued, and on a loaded machine this test's stop can last that long."""
    home = shared_compile_cache(tmp_path_factory.mktemp("rlcli-2proc-stop-home"))
    with private_server(embedded_model, "--processes", "2", "--slots", "7", venv=shared_server_venv(), home=home,
                        timeout=900) as pair:
        worker, timeout_s = _local_worker(pair), 5
        beat = pair.home / "servers" / "default" / "rlcli-worker-1-heartbeat"
        assert json.loads(beat.read_text())["pid"] == worker and time.time() - beat.stat().st_mtime < 3
        os.kill(worker, signal.SIGSTOP)
        try:
            wait_for(lambda: time.time() - beat.stat().st_mtime > 11, 60, None, "the worker's heartbeat to age")
            with concurrent.futures.ThreadPoolExecutor(2) as both:  # at once: the stop stays short of jax's 30 s
                asked = both.submit(run_rlcli, "sample", "--prompt", "hi", "--max-tokens", "2", "--server-timeout",
                                    str(timeout_s), env=pair.env, timeout=120)
                status = both.submit(run_rlcli, "serve", "status", env=pair.env).result()
                sample = asked.result()
            lines = sample.stderr.strip().splitlines()
            assert sample.returncode == EXIT_SERVER_GONE and len(lines) == 1, sample.stderr
            assert f"has a frozen engine (jax worker process 1 (pid {worker}) gave no heartbeat for" in lines[0], lines
            assert status.returncode == 3 and status.stdout.startswith("frozen:"), status.stdout
            assert f"jax worker process 1 (pid {worker})" in status.stdout, status.stdout
        finally:
            os.kill(worker, signal.SIGCONT)  # a stopped process would hold the stop's SIGTERM


def test_a_worker_writes_its_own_compilation_cache_entries(tmp_path):
    """jax writes the persistent cache from process 0 only, and a worker's key for the same program is not
    process 0's: a worker compiled every program at every start (most of a 2-process start's model building
    and first step). rlcli's worker writes its own entries, and the next start loads them."""
    first = _shared_program(tmp_path, "stock")
    assert "process 0 result 19.0 hits 0" in first and "process 1 result 19.0 hits 0" in first, first
    written = set(tmp_path.iterdir())
    assert written  # process 0 wrote the program
    second = _shared_program(tmp_path, "patched")
    assert "process 0 result 19.0 hits 1" in second, second
    assert "process 1 result 19.0 hits 0" in second, second  # process 0's entry is not the worker's
    assert set(tmp_path.iterdir()) > written  # the worker wrote one of its own
    third = _shared_program(tmp_path, "patched")
    assert "process 0 result 19.0 hits 1" in third and "process 1 result 19.0 hits 1" in third, third


def test_a_worker_started_by_hand_joins_a_coordinator_on_loopback(embedded_model, tmp_path):
    """The other-machine form, on one machine: the server runs process 0 only; `rlcli serve worker` joins it;
    the server becomes ready through both; after `serve stop` the worker ends with one closing line.

    The coordinator is on a second loopback address, 127.0.0.2 (Linux routes all of 127/8 to lo), as machine
    A's address would be: the worker reaches it there and the coordination service listens there only, not on
    every interface (SkyRL's own call would bind [::]). The gloo collectives still use the address this
    machine's hostname resolves to: jax 0.12 builds them with no host or interface (docs/decisions.md)."""
    home = shared_compile_cache(tmp_path / "home")
    env = private_env(home, shared_server_venv())
    port = free_port()
    coordinator = f"127.0.0.2:{port}"
    start = run_rlcli("serve", "start", "--base-model", embedded_model, "--port", str(free_port()),
                      "--processes", "2", "--local-processes", "1", "--coordinator", coordinator, "--wait", "0",
                      env=env, timeout=300, check=True)
    assert "2 jax processes" in start.stderr
    worker = subprocess.Popen([*RLCLI, "serve", "worker", "--coordinator", coordinator, "--processes", "2",
                               "--process-id", "1"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        state = read_state(home / "servers" / "default")
        wait_ready(state, home / "servers" / "default" / "server.log", 600)  # a LoRA made and unloaded on both
        log = (home / "servers" / "default" / "server.log").read_text()
        assert "process 0: every process loaded the same extensions" in log  # the worker joined
        assert _listening(port) == {"127.0.0.2"}
        run_rlcli("serve", "stop", env=env, check=True)
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 1 and err.strip().splitlines()[-1].startswith("rlcli: jax process 1 ended")
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        run_rlcli("serve", "stop", env=env)


def _listening(port: int) -> set[str]:
    """The addresses with a TCP socket listening on `port` (from /proc/net/tcp and tcp6; v4-mapped as IPv4)."""
    import ipaddress

    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state != "0A" or int(hex_port, 16) != port or len(address) != width:
                    continue
                raw = bytes.fromhex(address)  # little-endian 32-bit words
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                address = ipaddress.ip_address(raw)
                found.add(str(getattr(address, "ipv4_mapped", None) or address))  # gRPC listens on ::ffff:a.b.c.d
    return found
