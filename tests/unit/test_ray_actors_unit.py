"""The Ray actors' check (runtime/ray_actors.py): its pure pieces, with stand-ins for Ray's handles.
The real thing runs in tests/integration/test_ray_jax.py on a local Ray cluster."""

from __future__ import annotations

import json
import sys

import pytest

from tests.unit.test_tenant_fair_unit import runtime


class FakeRay:
    """ray.get over the stand-in handles below: each answers what its actor loaded."""

    @staticmethod
    def get(refs):
        return list(refs)


class FakeActor:
    def __init__(self, loaded):
        self.__ray_call__ = type("Call", (), {"remote": staticmethod(lambda fn: loaded)})


def test_only_the_jax_backend_with_use_ray_is_on_ray():
    actors = runtime("ray_actors")
    assert actors.on_ray(["--backend", "jax", "--backend-config", json.dumps({"use_ray": True})])
    assert not actors.on_ray(["--backend", "jax", "--backend-config", json.dumps({"num_processes": 2})])
    assert not actors.on_ray(["--backend", "fsdp", "--backend-config", json.dumps({"use_ray": True})])
    assert not actors.on_ray(["--backend", "jax"]) and not actors.on_ray(["--backend-config", "not json"])


def test_actors_that_run_what_the_engine_does_are_reported_to_the_api(tmp_path, monkeypatch):
    actors = runtime("ray_actors")
    monkeypatch.chdir(tmp_path)
    same = runtime("distributed").identity({"rlcli"})
    assert actors.describe()["runtime"] is None  # before the engine set its actors up
    actors.check_actors(FakeRay, [FakeActor(same), FakeActor(same)])
    assert actors.describe() == {"actors": 2, "runtime": same}
    assert oct((tmp_path / "rlcli-ray-actors.json").stat().st_mode & 0o777) == "0o600"

    with pytest.raises(RuntimeError) as caught:  # an actor that kept stock SkyRL (or another rlcli) stops the engine
        actors.check_actors(FakeRay, [FakeActor(same), FakeActor(None)])
    message = str(caught.value)
    assert message.startswith("Ray actor 1 loaded the server extensions None") and "\n" not in message
    assert "ray start" in message


def test_gspo_is_fused_on_ray_only_where_the_launcher_prepared_the_actors(monkeypatch):
    losses = runtime("rlcli_losses")
    monkeypatch.delenv("RLCLI_DISTRIBUTED", raising=False)
    assert "Ray actors" in losses.jax_fused_blocker({"use_ray": True, "num_processes": 2})  # SkyRL started by hand
    monkeypatch.setenv("RLCLI_DISTRIBUTED", "ray")  # what the supervisor tells the API and engine on Ray
    assert losses.jax_fused_blocker({"use_ray": True, "num_processes": 2}) is None


class FakeJax:
    """jax.config's two calls the actors' cache hook makes."""

    def __init__(self, own_cache=None):
        self.config = type("Config", (), {"jax_compilation_cache_dir": own_cache})()
        self.updates = {}
        self.config.update = lambda option, value: self.updates.__setitem__(option, value)


def test_actors_compile_into_the_engines_cache_where_they_can(tmp_path, monkeypatch, capsys):
    actors = runtime("ray_actors")
    folder = tmp_path / "home" / "cache" / "jax"
    settings = {"JAX_COMPILATION_CACHE_DIR": str(folder), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    monkeypatch.setenv(actors.CACHE_ENV, json.dumps(settings))
    jax = FakeJax()
    actors.use_engines_cache(jax)
    assert jax.updates == {"jax_compilation_cache_dir": str(folder), "jax_persistent_cache_min_compile_time_secs": 0.0,
                           "jax_persistent_cache_min_entry_size_bytes": 0}
    assert folder.is_dir() and oct(folder.stat().st_mode & 0o777) == "0o700"

    node_own = FakeJax(own_cache="/elsewhere")  # the node's own setting wins
    actors.use_engines_cache(node_own)
    assert node_own.updates == {}

    (tmp_path / "file").write_text("")  # a home that cannot exist on this node
    unmakeable = {**settings, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "file" / "x")}
    monkeypatch.setenv(actors.CACHE_ENV, json.dumps(unmakeable))
    elsewhere = FakeJax()
    actors.use_engines_cache(elsewhere)
    assert elsewhere.updates == {}
    assert "no jax compilation cache" in capsys.readouterr().err


def test_the_engine_forwards_its_cache_settings_to_the_actors(monkeypatch, tmp_path):
    actors = runtime("ray_actors")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/c")
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    monkeypatch.setenv("RLCLI_SAMPLER_SNAPSHOTS", "2")
    seen = {}
    monkeypatch.setitem(sys.modules, "ray", type(sys)("ray"))
    sys.modules["ray"].init = lambda runtime_env: seen.update(runtime_env)
    monkeypatch.chdir(tmp_path)  # connect() clears the actors' report in its working folder
    actors.connect()
    assert json.loads(seen["env_vars"][actors.CACHE_ENV]) == {"JAX_COMPILATION_CACHE_DIR": "/c",
                                                              "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    assert seen["env_vars"]["RLCLI_SERVER_EXTENSIONS"] == "rlcli" and seen["env_vars"]["RLCLI_SAMPLER_SNAPSHOTS"] == "2"
    assert seen["worker_process_setup_hook"] == "ray_actors.setup" and seen["working_dir"] == str(actors.HERE)
