"""The jax backend on a local Ray cluster (`rlcli serve start --processes 2 --ray-address ...`), on CPU.

Needs Ray in the server venv (`rlcli serve install --ray`; the default lock has none): without it the test
checks the one-line refusal instead and skips the rest, saying how to enable it. A Ray head is started on
loopback in its own session, used by a private server, and ended by its process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest

from rlcli.client import unload_model
from rlcli.server.private import free_port, private_server
from rlcli.server.server_venv import has_extra
from tests.conftest import run_rlcli, shared_server_venv

pytestmark = [pytest.mark.server, pytest.mark.slow]


def _ray_actors() -> list[int]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "ray::RayJaxBackendImpl" in line]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    venv = shared_server_venv()
    if not has_extra(venv, "ray"):
        pytest.skip(f"no Ray in {venv}: `rlcli serve install --ray` adds it (server-ray.lock)")
    port, temp = free_port(), tmp_path_factory.mktemp("ray")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    head = subprocess.run([str(venv / "bin" / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
                           "--port", str(port), "--num-cpus", "2", "--include-dashboard", "false",
                           "--temp-dir", str(temp), "--disable-usage-stats"],
                          capture_output=True, text=True, env=env, timeout=300, start_new_session=True)
    assert head.returncode == 0, head.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        _end_head(str(temp))


def _end_head(temp: str) -> None:
    """ray start's daemons keep the process group start_new_session gave them (found by their --temp-dir)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pgid,args"], capture_output=True, text=True).stdout
    groups = {int(line.split()[0]) for line in out.splitlines()[1:] if temp in line}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        time.sleep(3)


def test_jax_on_ray_trains_samples_and_leaves_no_actor(ray_head, embedded_model, tmp_path_factory, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    with private_server(embedded_model, "--processes", "2", "--ray-address", ray_head, "--slots", "3",
                        venv=shared_server_venv(), home=tmp_path_factory.mktemp("rlcli-ray-home")) as srv:
        assert len(_ray_actors()) == 2  # every jax process is an actor, the coordinator too
        client = tinker.ServiceClient(base_url=srv.url).create_lora_training_client(base_model=srv.model, rank=4)
        tokens = list(range(5, 30))
        datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                             loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
        losses = []
        for _ in range(3):
            out = client.forward_backward([datum], "cross_entropy").result()
            losses.append(-float(out.loss_fn_outputs[0]["logprobs"].to_numpy().mean()))
            client.optim_step(tinker.AdamParams(learning_rate=2e-2)).result()
        assert losses[-1] < losses[0]
        saved = client.save_weights_for_sampler("ray").result().path
        sample = client.create_sampling_client(model_path=saved).sample(
            tinker.ModelInput.from_ints(tokens[:5]), num_samples=1,
            sampling_params=tinker.SamplingParams(max_tokens=3, temperature=0.0)).result()
        assert len(sample.sequences[0].tokens) == 3  # one prompt on a 2-process mesh
        unload_model(srv.url, client.model_id)
    deadline = time.monotonic() + 90  # Ray ends a driver's actors when the driver (the engine) is gone
    while _ray_actors() and time.monotonic() < deadline:
        time.sleep(2)
    assert _ray_actors() == []


def test_jax_on_ray_without_ray_in_the_venv_is_one_line(tmp_path, embedded_model):
    """A venv without Ray (a fake one: the check runs before anything starts) is refused in one line."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(shared_server_venv() / "bin" / "python")
    from rlcli.server import server_venv

    (venv / server_venv.MARKER).write_text(f"jax:{server_venv._pins_digest('jax')}\n")
    env = dict(os.environ, RLCLI_HOME=str(tmp_path / "home"), RLCLI_SERVER_VENV=str(venv))
    proc = run_rlcli("serve", "start", "--base-model", embedded_model, "--processes", "2", "--ray-address",
                     "127.0.0.1:1", "--port", str(free_port()), env=env, timeout=120)
    assert proc.returncode != 0 and "rlcli serve install --ray" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
