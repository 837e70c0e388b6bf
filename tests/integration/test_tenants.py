"""A server a team shares (`serve start --tenants`): keys, deny by default, isolation, quotas, revoke.

Every test runs twice, on one dedicated real server per database (the session server runs without tenants): SkyRL's
default sqlite, then the tests' own Postgres (`--database-url`), two-tenant training, the CLI and the notebook
included; the database test says where each keeps its state (it was test_postgres.py with a server of its own).
Tenants: alice (at most 2 models), bob (at most 1 model) and carol (no limit, for the
notebook), added with `rlcli tenant add` in the server's home.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rlcli.client import CAPABILITIES_ROUTE
from rlcli.server.private import private_server
from tests.conftest import Background, run_rlcli, shared_compile_cache, shared_server_venv

pytestmark = pytest.mark.server


def call(url: str, method: str = "GET", payload: dict | None = None, key: str | None = None) -> tuple:
    """(status, JSON answer, headers) of one raw request; errors are answers too."""
    data = None if payload is None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json", **({"X-API-Key": key} if key else {})}
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read() or b"{}"), resp.headers
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            answer = json.loads(body or b"{}")
        except ValueError:
            answer = {"raw": body.decode(errors="replace")}
        return e.code, answer, e.headers


@contextlib.contextmanager
def tenant_server(home: Path, model: str, database: list[str]):
    """A --tenants server with alice, bob and carol; yields (server, their keys)."""
    keys = {}
    for name, quota in (("alice", "2"), ("bob", "1"), ("carol", None)):
        env = dict(os.environ, RLCLI_HOME=str(home))
        limit = ["--max-models", quota] if quota else []
        proc = run_rlcli("tenant", "add", name, *limit, env=env, check=True, timeout=60)
        keys[name] = proc.stdout.strip()
    assert (home / "tenants.json").stat().st_mode & 0o077 == 0
    assert all(k.startswith("tml-") and k not in (home / "tenants.json").read_text() for k in keys.values())
    with private_server(model, "--tenants", "--slots", "3", *database, home=home, venv=shared_server_venv(),
                        timeout=900) as srv:
        yield srv, keys


def tenant_server_in_background(home: Path, model: str, database: list[str]) -> Background:
    """Started in a thread: the Postgres one starts while the sqlite one's tests run (each start is ~20 s)."""
    return Background(lambda: tenant_server(shared_compile_cache(home), model, database))


@pytest.fixture(scope="module")
def postgres_tenants(request, tmp_path_factory, embedded_model):
    """The Postgres server, started (by `shared`) as soon as the sqlite one is ready, rather than after its
    tests; skipped (saying why) where there is no Postgres."""
    server = tenant_server_in_background(tmp_path_factory.mktemp("rlcli-tenants-home"), embedded_model,
                                         ["--database-url", request.getfixturevalue("postgres")])
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def shared(request, tmp_path_factory, embedded_model):
    """One server per database: SkyRL's default sqlite, then the tests' own Postgres (conftest.py)."""
    if request.param == "sqlite":
        server = tenant_server_in_background(tmp_path_factory.mktemp("rlcli-tenants-home"), embedded_model, [])
        try:
            ready = server.get()
            # Then the Postgres one, while the sqlite tests run (two starts at once gain nothing on 2 cores).
            with contextlib.suppress(pytest.skip.Exception):  # no Postgres: its tests skip when they get there
                request.getfixturevalue("postgres_tenants")
            yield ready
        finally:
            server.stop()
    else:
        yield request.getfixturevalue("postgres_tenants").get()


def test_every_route_is_checked_or_public(shared):
    srv, keys = shared
    status, caps, _ = call(srv.url + CAPABILITIES_ROUTE, key=keys["alice"])
    assert status == 200, caps
    gate = caps["rlcli_tenants"]
    public = set(gate["public"])
    assert public == {"GET /api/v1/healthz"}
    assert len(gate["routes"]) > 20  # SkyRL's ~30 routes, the docs and rlcli's own
    unchecked = []
    for route in gate["routes"]:
        methods, path = route.split(" ", 1)
        path = path.replace("{", "").replace("}", "").replace(":path", "")  # any value: it must not get that far
        for method in methods.split(","):
            method = "GET" if method in ("*", "HEAD") else method
            for key in (None, "tml-wrong", keys["alice"] + "x"):
                got, _, _ = call(srv.url + path, method, {} if method in ("POST", "PUT") else None, key=key)
                if got != 401 and f"{method} {path}" not in public:
                    unchecked.append((method, path, key, got))
    assert unchecked == [], f"answered without a valid key: {unchecked}"
    assert call(srv.url + "/api/v1/healthz")[0] == 200
    assert call(srv.url + "/api/v1/no-such-route")[0] == 401  # unknown paths too: deny by default
    assert call(srv.url + "/profiling_status", key=keys["alice"])[0] == 404  # server-wide: not a tenant's
    assert call(srv.url + "/api/v1/rlcli/forget_readiness_models", "POST", {}, key=keys["alice"])[0] == 404


def _alice_trains(srv, key: str, monkeypatch):
    """The stock tinker client, unchanged, with TINKER_API_KEY: a model, one step, a sampler checkpoint."""
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", key)
    service = tinker.ServiceClient(base_url=srv.url)
    client = service.create_lora_training_client(base_model=srv.model, rank=2, seed=0).result()
    tokens = list(range(5, 21))
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                         loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
    fb = client.forward_backward([datum], "cross_entropy")
    fb.result()
    client.optim_step(tinker.AdamParams(learning_rate=1e-3)).result()
    path = client.save_weights_for_sampler("t0").result().path
    return client, path


def test_two_tenants_train_and_sample_at_once(shared):
    """alice and bob, each through a stock tinker client with its own key, at the same time."""
    import tinker

    srv, keys = shared
    results, errors = {}, []

    def work(name: str) -> None:
        try:
            service = tinker.ServiceClient(base_url=srv.url, api_key=keys[name])
            client = service.create_lora_training_client(base_model=srv.model, rank=2, seed=0).result()
            tokens = list(range(5, 21))
            datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                                 loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})
            client.forward_backward([datum], "cross_entropy").result()
            client.optim_step(tinker.AdamParams(learning_rate=1e-3)).result()
            sampler = client.save_weights_and_get_sampling_client().result()
            out = sampler.sample(tinker.ModelInput.from_ints(tokens[:4]), 1,
                                 tinker.SamplingParams(max_tokens=4, temperature=1.0)).result()
            results[name] = (client.model_id, len(out.sequences[0].tokens))
            _, unloaded, _ = call(srv.url + "/api/v1/unload_model", "POST", {"model_id": client.model_id},
                                  key=keys[name])
            call(srv.url + "/api/v1/retrieve_future", "POST", {"request_id": unloaded["request_id"]}, key=keys[name])
        except Exception as e:  # reported below, with the tenant's name
            errors.append(f"{name}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=work, args=(name,)) for name in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert errors == [] and set(results) == {"alice", "bob"}, errors
    assert "[rlcli tenants] the engine takes pending work round-robin" in srv.log.read_text()
    assert all(n > 0 for _, n in results.values())
    for name, other in (("alice", "bob"), ("bob", "alice")):
        listing = call(srv.url + "/api/v1/training_runs", key=keys[name])[1]["training_runs"]
        runs = [r["training_run_id"] for r in listing]
        assert results[name][0] in runs and results[other][0] not in runs


def _proto_forward_backward(url: str, model_id: str, key: str) -> tuple[int, bytes]:
    """A forward_backward body exactly as the tinker SDK encodes it."""
    import tinker
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.types import ForwardBackwardInput, ForwardBackwardRequest

    tokens = list(range(5, 13))
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                         loss_fn_inputs={"target_tokens": tokens[1:], "weights": [0.0] * (len(tokens) - 1)})
    request = ForwardBackwardRequest(model_id=model_id, forward_backward_input=ForwardBackwardInput(
        data=[datum], loss_fn="cross_entropy"))
    req = urllib.request.Request(f"{url}/api/v1/forward_backward",
                                 data=forward_backward_request_to_proto(request).SerializeToString(),
                                 headers={"Content-Type": "application/x-protobuf", "X-API-Key": key})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_isolation_between_tenants(shared, monkeypatch):
    srv, keys = shared
    alice, bob = keys["alice"], keys["bob"]
    client, path = _alice_trains(srv, alice, monkeypatch)
    model_id = client.model_id
    assert path.startswith(f"tinker://{model_id}/")
    api = srv.url + "/api/v1"
    # bob sees nothing of alice's: her model, run, checkpoints, futures and sampler path answer 404 ...
    status, own_session, _ = call(f"{api}/create_session", "POST", {"tags": [], "sdk_version": "t"}, key=bob)
    assert status == 200
    foreign = [
        ("POST", f"{api}/get_info", {"model_id": model_id}),
        ("GET", f"{api}/training_runs/{model_id}", None),
        ("GET", f"{api}/training_runs/{model_id}/checkpoints", None),
        ("GET", f"{api}/models/{model_id}/checkpoints", None),
        ("POST", f"{api}/retrieve_future", {"request_id": "1"}),
        ("POST", f"{api}/create_sampling_session",
         {"session_id": own_session["session_id"], "model_path": path, "sampling_session_seq_id": 0}),
        ("POST", f"{api}/optim_step", {"model_id": model_id, "adam_params": {"learning_rate": 1.0}}),
        ("POST", f"{api}/unload_model", {"model_id": model_id}),
        ("DELETE", f"{api}/training_runs/{model_id}/checkpoints/sampler_weights/t0", None),
    ]
    for method, url, payload in foreign:
        status, answer, _ = call(url, method, payload, key=bob)
        assert status == 404, (url, status, answer)
    # forward_backward as the tinker SDK sends it (protobuf, not JSON) on alice's model: 404 too
    assert _proto_forward_backward(srv.url, model_id, bob)[0] == 404
    assert _proto_forward_backward(srv.url, model_id, alice)[0] == 200
    assert call(f"{api}/forward_backward", "POST", None, key=bob)[0] in (404, 415, 422)  # names nothing
    # every route of the server, with alice's ids in every path parameter and id field: all 404 for bob
    gate = call(srv.url + CAPABILITIES_ROUTE, key=alice)[1]["rlcli_tenants"]
    body = {"session_id": own_session["session_id"], "model_id": model_id, "request_id": "1", "path": path,
            "model_path": path, "tinker_path": path}
    leaked, tried = [], 0
    for route in gate["routes"]:
        methods, template = route.split(" ", 1)
        if "{" not in template and "POST" not in methods:
            continue
        url = srv.url + re.sub(r"\{[^}]*\}", model_id, template)
        for method in set(methods.split(",")) - {"HEAD"}:
            needs_id = "{" in template or method == "POST"
            if not needs_id or template in ("/api/v1/create_session", "/api/v1/client/config",
                                            "/api/v1/telemetry", "/start_profiling", "/stop_profiling"):
                continue
            got, tried = call(url, method, body if method == "POST" else None, key=bob), tried + 1
            if got[0] != 404:
                leaked.append((method, template, got[0]))
    assert leaked == [] and tried >= 15, f"answered bob with alice's ids: {leaked} ({tried} tried)"
    # ... exactly as an id that does not exist at all
    assert call(f"{api}/get_info", "POST", {"model_id": "model_nothere"}, key=bob)[:2] == \
        call(f"{api}/get_info", "POST", {"model_id": model_id}, key=bob)[:2]
    # listings: each sees only its own runs
    assert model_id not in json.dumps(call(f"{api}/training_runs", key=bob)[1])
    runs = call(f"{api}/training_runs", key=alice)[1]["training_runs"]
    assert model_id in [r["training_run_id"] for r in runs]
    # nothing changed for alice: her model is still there and her checkpoint listed
    status, info, _ = call(f"{api}/get_info", "POST", {"model_id": model_id}, key=alice)
    assert status == 200 and info["model_id"] == model_id
    status, ckpts, _ = call(f"{api}/training_runs/{model_id}/checkpoints", key=alice)
    assert status == 200 and "t0" in json.dumps(ckpts)


def test_the_state_is_in_the_database_and_the_password_nowhere(shared, request):
    """Where SkyRL's state goes: by default the sqlite file in the server's folder; with `serve start --database-url`
    Postgres (the sqlite file is never made), and the password is on no command line and in no doctor output. A
    fresh connection finds alice's models either way."""
    srv, keys = shared
    api = srv.url + "/api/v1"
    runs = call(f"{api}/training_runs", key=keys["alice"])[1]["training_runs"]
    assert runs, "test_isolation_between_tenants leaves alice a model"
    sqlite_file = srv.home / "servers" / "default" / "tinker.db"
    if request.node.callspec.params["shared"] == "sqlite":
        database = f"sqlite:///{sqlite_file}"
    else:
        database = request.getfixturevalue("postgres")
        password = database.split(":")[2].split("@")[0]
        cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in os.listdir("/proc") if pid.isdigit()
                    and Path(f"/proc/{pid}/cmdline").exists()]
        assert not any(password.encode() in c for c in cmdlines), "the database password is on a command line"
        assert not sqlite_file.exists()  # sqlite unused
        doctor = run_rlcli("doctor", env=dict(srv.env, TINKER_API_KEY=keys["alice"]), timeout=120)
        assert "ok    database" in doctor.stdout and password not in doctor.stdout, doctor.stdout
        database = database.replace("postgresql://", "postgresql+psycopg2://")
    code = ("import sys, sqlalchemy; e = sqlalchemy.create_engine(sys.argv[1]); c = e.connect(); "
            "print(c.execute(sqlalchemy.text('select model_id from models')).fetchall())")
    rows = subprocess.run([str(shared_server_venv() / "bin" / "python"), "-c", code, database],
                          capture_output=True, text=True, timeout=60)
    assert all(run["training_run_id"] in rows.stdout for run in runs), rows.stdout + rows.stderr


def test_weight_decay_refused_and_quota_answers_429(shared, monkeypatch):
    srv, keys = shared
    api = srv.url + "/api/v1"
    bob = keys["bob"]
    _, session, _ = call(f"{api}/create_session", "POST", {"tags": [], "sdk_version": "t"}, key=bob)
    create = {"session_id": session["session_id"], "base_model": srv.model, "lora_config": {"rank": 1, "seed": 0}}
    status, first, _ = call(f"{api}/create_model", "POST", create, key=bob)
    assert status == 200, first
    status, answer, _ = call(f"{api}/optim_step", "POST",
                             {"model_id": first["model_id"], "adam_params": {"weight_decay": 0.1}}, key=bob)
    assert status == 400 and "weight_decay" in answer["detail"]
    status, answer, headers = call(f"{api}/create_model", "POST", create, key=bob)  # bob's limit is 1 model
    assert status == 429 and int(headers["Retry-After"]) > 0, answer
    assert call(f"{api}/retrieve_future", "POST", {"request_id": first["request_id"]}, key=bob)[0] == 200
    status, unloaded, _ = call(f"{api}/unload_model", "POST", {"model_id": first["model_id"]}, key=bob)
    assert status == 200
    call(f"{api}/retrieve_future", "POST", {"request_id": unloaded["request_id"]}, key=bob)
    status, second, _ = call(f"{api}/create_model", "POST", create, key=bob)  # room again after the unload
    assert status == 200, second
    call(f"{api}/retrieve_future", "POST", {"request_id": second["request_id"]}, key=bob)


def test_cli_takes_the_key_and_doctor_checks_it(shared):
    srv, keys = shared
    env = dict(srv.env, TINKER_BASE_URL=srv.url)
    env.pop("TINKER_API_KEY", None)
    alice_runs = call(srv.url + "/api/v1/training_runs", key=keys["alice"])[1]["training_runs"]
    assert alice_runs, "test_isolation_between_tenants leaves alice a run"
    listed = run_rlcli("--api-key", keys["alice"], "run", "list", env=env, timeout=120)
    assert alice_runs[0]["training_run_id"] in listed.stdout, listed.stdout + listed.stderr
    listed = run_rlcli("run", "list", env=dict(env, TINKER_API_KEY=keys["bob"]), timeout=120)
    assert alice_runs[0]["training_run_id"] not in listed.stdout + listed.stderr
    demo = run_rlcli("demo", "--steps", "2", "--api-key", keys["alice"], env=env, timeout=300)
    assert demo.returncode == 0, demo.stdout + demo.stderr  # rlcli's own commands work under a key
    refused = run_rlcli("doctor", env=env, timeout=120)
    assert "fail  api-key" in refused.stdout and "TINKER_API_KEY" in refused.stdout, refused.stdout
    accepted = run_rlcli("doctor", "--api-key", keys["alice"], env=env, timeout=120)
    assert "ok    api-key" in accepted.stdout, accepted.stdout


def test_revoke_takes_effect_on_the_next_request(shared):
    srv, keys = shared
    listed = run_rlcli("tenant", "list", env=srv.env, check=True, timeout=60).stdout
    assert "bob" in listed and keys["bob"] not in listed
    bob_row = next(line for line in listed.splitlines() if line.startswith("bob "))
    assert bob_row.split()[3] == "1"  # the model bob holds after the quota test
    url = srv.url + "/api/v1/training_runs"
    assert call(url, key=keys["bob"])[0] == 200
    run_rlcli("tenant", "revoke", "bob", env=srv.env, check=True, timeout=60)
    assert call(url, key=keys["bob"])[0] == 401
    assert call(url, key=keys["alice"])[0] == 200


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_notebook_takes_the_key_from_the_environment(shared, tmp_path, monkeypatch):
    """learning_curve.ipynb, unchanged, against the shared server: refused in one line without a key, trains
    with TINKER_API_KEY in the environment only (the kernel and the commands it runs inherit it)."""
    import papermill  # the notebook tests' dependencies (env/notebooks.txt)

    from tests.integration.test_notebooks import NOTEBOOKS, execute
    from tests.notebook_kernel import kernels_fork

    srv, keys = shared
    parameters = dict(sl_steps=2, rl_steps=1, base_url=srv.url, run_dir=str(tmp_path / "run"))
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with kernels_fork(tmp_path / "kernel"), pytest.raises(papermill.PapermillExecutionError) as refused:
        papermill.execute_notebook(str(NOTEBOOKS / "learning_curve.ipynb"), str(tmp_path / "refused.ipynb"),
                                   parameters={**parameters, "results_dir": str(tmp_path / "refused")},
                                   cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False,
                                   execution_timeout=600)
    errors = [line for line in refused.value.evalue.splitlines() if line.startswith("rlcli: error:")]
    assert len(errors) == 1 and "TINKER_API_KEY" in errors[0], refused.value.evalue
    monkeypatch.setenv("TINKER_API_KEY", keys["carol"])
    with kernels_fork(tmp_path / "kernel-keyed"):
        result = execute("learning_curve", tmp_path, parameters)
    assert result["sl_steps"] == 2 and result["rl_steps"] == 1
    runs = call(srv.url + "/api/v1/training_runs", key=keys["carol"])[1]["training_runs"]
    assert len(runs) == 2  # the notebook's SFT and RL runs, carol's
