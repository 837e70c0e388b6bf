"""The jax backend on a local Ray cluster (`rlcli serve start --processes 2 --ray-address ...`), on CPU.

One server on one Ray head serves every test here: it trains and samples, its actors load rlcli's server
extensions (runtime/ray_actors.py: gspo fused in one forward_backward, sampler checkpoints kept apart from the
live model), and stopping it leaves no actor.

Needs Ray in the server venv (`rlcli serve install --ray`; the default lock has none): without it the test
checks the one-line refusal instead and skips the rest, saying how to enable it. A Ray head is started on
loopback in its own session, used by a private server, and ended by its process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

from rlcli.client import CAPABILITIES_ROUTE, request_json, unload_model, unload_models
from rlcli.server.commands import RUNTIME_DIR
from rlcli.server.private import free_port, private_server
from rlcli.server.runtime import manifest
from rlcli.server.server_venv import has_extra
from rlcli.train.losses import gspo_reference, install_loss_route, plan_loss, served_losses
from tests.conftest import run_rlcli, shared_compile_cache, shared_server_venv
from tests.integration.test_fused_gspo import (
    CLIP,
    clean_client,
    current_logprobs,
    rl_data,
    sequence_mean_loss,
    token_batch,
)
from tests.integration.test_sampler_checkpoints import TOKENS, _close, _live, _sampled, _train

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


def _head_groups(temp: str) -> set[int]:
    out = subprocess.run(["ps", "-ww", "-eo", "pgid,args"], capture_output=True, text=True).stdout
    return {int(line.split()[0]) for line in out.splitlines()[1:] if temp in line}


def _end_head(temp: str) -> None:
    """ray start's daemons keep the process group start_new_session gave them (found by their --temp-dir):
    SIGTERM, up to 3 s for them to go, then SIGKILL whatever is left."""
    groups = _head_groups(temp)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
        deadline = time.monotonic() + 3
        while (groups := _head_groups(temp)) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not groups:
            return


def test_ray_actor_hook_targets_the_pinned_skyrl_and_ray():
    """runtime/ray_actors.py relies on SkyRL's RayJaxBackend, RayJaxBackendImpl.setup building JaxBackendImpl after
    jax's runtime, and Ray's actors (the manifest's Ray entries); its proxy class overrides what the manifest says."""
    venv = shared_server_venv()
    if not has_extra(venv, "ray"):
        pytest.skip(f"no Ray in {venv}: `rlcli serve install --ray` adds it (server-ray.lock)")
    check = ("import manifest, ray_actors\nfrom skyrl.backends import ray_jax\n"
             "assert not manifest.problems({manifest.RAY}), manifest.problems({manifest.RAY})\n"
             "cls = ray_actors.backend_class(ray_jax.RayJaxBackend)\n"
             "assert ray_jax.JaxBackendImpl.__name__ == 'RlcliJaxImpl', ray_jax.JaxBackendImpl\n"
             "print('present', sorted(n for n in vars(cls) if not n.startswith('__') or n == '__init__'))")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", check], cwd=RUNTIME_DIR, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "present" in proc.stdout, proc.stdout + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def ray_server(ray_head, embedded_model, tmp_path_factory):
    """One private server on the Ray head for every test here (its start is most of their time)."""
    with private_server(embedded_model, "--processes", "2", "--ray-address", ray_head, "--slots", "3",
                        "--sampler-snapshots", "1",  # the actors must get it: it is part of rlcli_samplers' version
                        venv=shared_server_venv(),
                        home=shared_compile_cache(tmp_path_factory.mktemp("rlcli-ray-home"))) as srv:
        yield srv


@pytest.fixture
def service(ray_server, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    return tinker.ServiceClient(base_url=ray_server.url)


def test_jax_on_ray_trains_and_saves(ray_server, service):
    import tinker

    assert len(_ray_actors()) == 2  # every jax process is an actor, the coordinator too
    client = service.create_lora_training_client(base_model=ray_server.model, rank=4, seed=0).result()
    tokens = list(range(5, 30))
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                         loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    losses = []
    for _ in range(4):  # seeded, and a rate whose first Adam step does not overshoot (2e-2 did, now and then)
        out = client.forward_backward([datum], "cross_entropy").result()
        losses.append(-float(out.loss_fn_outputs[0]["logprobs"].to_numpy().mean()))
        client.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()
    assert losses[-1] < losses[0]
    assert client.save_weights_for_sampler("ray").result().path.startswith("tinker://")
    unload_model(ray_server.url, client.model_id)  # sampling: the checkpoint test below


def test_every_ray_actor_loads_the_extensions(ray_server):
    caps = request_json(ray_server.url + CAPABILITIES_ROUTE)
    assert "note" not in caps and "gspo" in caps["losses"], caps
    actors = caps["ray_actors"]
    assert actors["actors"] == 2 and actors["runtime"] == f"rlcli runtime {manifest.VERSION}, keep=1", actors
    log = ray_server.log.read_text()
    assert "all 2 Ray actors loaded the same extensions as the engine" in log
    # The actors' lines reach the log through Ray's driver, which folds lines repeated across actors into one.
    assert any("RayJaxBackendImpl pid=" in line and "registered gspo as jax loss" in line
               for line in log.splitlines()), log[-3000:]
    assert "gspo is registered in each Ray actor" in log  # the engine only proxies to them


def test_fused_gspo_on_ray_is_one_forward_backward(ray_server, service):
    import numpy as np

    served = served_losses(ray_server.url)[1]
    plan = plan_loss("gspo", json.dumps(CLIP), "auto", served)
    assert plan.passes == 1
    client = clean_client(service, ray_server.model, seed=5)
    try:
        tokens = token_batch(7, n=2)
        lp = current_logprobs(client, tokens)
        data, old, adv, mask = rl_data(tokens, lp)
        calls = {"forward": 0, "forward_backward": 0}
        for name in calls:
            setattr(client, name, _counted(getattr(client, name), name, calls))
        install_loss_route(client, plan)
        output = client.forward_backward(data, "gspo").result()  # stock SkyRL's jax actors refuse gspo
        assert calls == {"forward": 0, "forward_backward": 1}
        want, _ = gspo_reference(lp, old, adv, mask, 0.2, 0.2)
        assert abs(sequence_mean_loss(output, np.asarray(mask)) - want) < 1e-5
    finally:
        unload_model(ray_server.url, client.model_id)


def _counted(method, name: str, calls: dict):
    def counted(*args, **kwargs):
        calls[name] += 1
        return method(*args, **kwargs)

    return counted


def test_sampling_an_old_checkpoint_on_ray_leaves_the_live_model_alone(ray_server, service):
    """test_sampler_checkpoints.py's sequence, shortened: train, save s1, train, sample s1, look at the live model."""
    client = service.create_lora_training_client(base_model=ray_server.model, rank=8, seed=0).result()
    try:
        _train(client, 1)
        s1 = client.save_weights_for_sampler("s1").result().path
        at_s1 = _live(client)
        _train(client, 1)
        before = _live(client)
        s1_logprobs, s1_tokens = _sampled(service, s1)
        after = _live(client)
    finally:
        unload_model(ray_server.url, client.model_id)
    assert not _close(at_s1, before, 1e-3), "training did not move the model: the test shows nothing"
    assert after == before, (before, after)  # bit for bit; stock SkyRL's actors load s1 over the live model
    assert _close(s1_logprobs, at_s1), (s1_logprobs, at_s1)  # s1's samples come from s1's weights
    assert len(s1_tokens) == 4  # one prompt on a 2-process mesh: padded to the mesh in the actors


def _ask(sampler):
    """The sampling call of test_sampler_checkpoints.py's _sampled (a shape the actors compiled there)."""
    import tinker

    params = tinker.SamplingParams(max_tokens=4, temperature=0.0, seed=0)
    return sampler.sample(tinker.ModelInput.from_ints(TOKENS), 1, params, include_prompt_logprobs=True).result()


def test_unnamed_snapshots_on_ray_keep_the_newest_and_refuse_a_deleted_one(ray_server, service):
    """--sampler-snapshots 1: a second unnamed snapshot deletes the first (the actors' files, the engine's row),
    and a sample of the first is refused in one line by the engine, before any actor is asked."""
    client = service.create_lora_training_client(base_model=ray_server.model, rank=8, seed=0).result()
    folder = ray_server.home / "servers" / "default" / "checkpoints" / client.model_id / "sampler_weights"
    try:
        first = client.save_weights_and_get_sampling_client().result()
        _ask(first)  # sampled as saved, as the RL loops do
        client.save_weights_and_get_sampling_client().result()
        assert len(list(folder.glob("ss*.tar.gz"))) == 1
        listed = request_json(f"{ray_server.url}/api/v1/training_runs/{client.model_id}/checkpoints")["checkpoints"]
        assert len([c for c in listed if c["checkpoint_type"] == "sampler"]) == 1, listed
        with pytest.raises(Exception, match="were deleted"):  # the engine's line, from the book kept on its proxy
            _ask(first)
    finally:
        assert unload_models(ray_server.url, [client.model_id]) == []  # waits for the unload to be done
    assert not list(folder.glob("ss*"))  # unload takes the rest


def test_stopping_the_server_leaves_no_actor(ray_server):
    """Last here: stops the module's server (the fixture's own stop then finds nothing to do)."""
    proc = run_rlcli("serve", "stop", env=ray_server.env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 90  # Ray ends a driver's actors when the driver (the engine) is gone
    while _ray_actors() and time.monotonic() < deadline:
        time.sleep(0.5)
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
