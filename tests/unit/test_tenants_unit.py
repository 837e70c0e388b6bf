"""rlcli/tenants.py and the server gate's pieces that need no server (runtime/rlcli_tenants.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys

import pytest

from rlcli import tenants
from rlcli.errors import UsageError
from rlcli.server import commands


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path))
    return tmp_path


def gate_module():
    if str(commands.RUNTIME_DIR) not in sys.path:  # its siblings (tenant_owners.py), as in the launcher
        sys.path.insert(0, str(commands.RUNTIME_DIR))
    spec = importlib.util.spec_from_file_location("rlcli_tenants_under_test", commands.RUNTIME_DIR / "rlcli_tenants.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_add_prints_the_key_once_and_keeps_only_its_hash(home, capsys):
    assert tenants.add(tenants.AddOptions(name="alice", max_models=2)) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("tml-") and len(key) > 40
    stored = (home / "tenants.json").read_text()
    assert key not in stored and tenants.key_hash(key) in stored
    assert (home / "tenants.json").stat().st_mode & 0o777 == 0o600
    tenants.list_(tenants.ListOptions())
    listed = capsys.readouterr().out
    assert "alice" in listed and key not in listed


@pytest.mark.parametrize("name", ["Alice", "-x", "", "a" * 33, "a/b"])
def test_bad_names_are_refused(home, name):
    with pytest.raises(UsageError, match="tenant name"):
        tenants.add(tenants.AddOptions(name=name))


def test_duplicate_quota_and_revoke(home):
    tenants.add(tenants.AddOptions(name="bob"))
    with pytest.raises(UsageError, match="exists already"):
        tenants.add(tenants.AddOptions(name="bob"))
    with pytest.raises(UsageError, match="--max-models must be at least 1, got 0"):
        tenants.add(tenants.AddOptions(name="carol", max_models=0))
    tenants.revoke(tenants.Tenant(name="bob"))
    assert tenants.load() == {}
    with pytest.raises(UsageError, match="no tenant 'bob'"):
        tenants.revoke(tenants.Tenant(name="bob"))


def test_exposure_needs_tenants_or_insecure(home):
    with pytest.raises(UsageError, match="--tenants.*--insecure"):
        tenants.check_exposure("0.0.0.0", tenants=False, insecure=False, loopback=False)
    tenants.check_exposure("0.0.0.0", tenants=False, insecure=True, loopback=False)
    tenants.check_exposure("0.0.0.0", tenants=True, insecure=False, loopback=False)
    tenants.check_exposure("127.0.0.1", tenants=False, insecure=False, loopback=True)
    with pytest.raises(UsageError, match="no tenants yet"):
        tenants.server_env()


def test_api_key_flag(monkeypatch):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    with pytest.raises(UsageError, match="starts with 'tml-'"):
        tenants.api_key("secret")
    assert tenants.api_key("tml-abc") == "tml-abc"


def test_gate_rereads_the_file_and_knows_the_internal_key(home, capsys):
    gate = gate_module()
    tenants.add(tenants.AddOptions(name="alice"))
    key = capsys.readouterr().out.strip()
    keys = gate.Keys(home / "tenants.json", tenants.key_hash("tml-internal"))
    assert keys.tenant(key)[0] == "alice"
    assert keys.tenant("tml-internal")[0] == gate.INTERNAL_TENANT
    assert keys.tenant("tml-wrong") is None and keys.tenant("") is None
    tenants.revoke(tenants.Tenant(name="alice"))
    assert keys.tenant(key) is None


def test_gate_refuses_unchecked_requests_without_reaching_the_app(home):
    gate = gate_module()
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    middleware = gate.TenantGate(app, gate.Keys(home / "tenants.json", None), gate.Owners(home / "owners.jsonl"))
    scope = {"type": "http", "method": "GET", "path": "/api/v1/training_runs", "headers": [], "query_string": b""}
    asyncio.run(middleware(scope, receive, send))
    assert reached == [] and sent[0]["status"] == 401
    asyncio.run(middleware(dict(scope, path="/api/v1/healthz"), receive, send))
    assert reached == ["/api/v1/healthz"]


def test_owners_survive_a_restart(tmp_path):
    gate = gate_module()
    owners = gate.Owners(tmp_path / "owners.jsonl")
    owners.record("model", "model_a", "alice")
    owners.record("future", "7", "alice")
    owners.record("unload", "model_a", "alice")
    again = gate.Owners(tmp_path / "owners.jsonl")
    assert again.owner == {"model_a": "alice", "7": "alice"} and again.models == {"alice": set()}
    assert (tmp_path / "owners.jsonl").stat().st_mode & 0o777 == 0o600
    assert json.loads((tmp_path / "owners.jsonl").read_text().splitlines()[0]) == ["model", "model_a", "alice"]


def test_database_url_keeps_the_password_off_the_command_line(monkeypatch):
    from rlcli.server import database

    monkeypatch.delenv(database.ENV, raising=False)
    assert database.resolve(None) == (None, {})
    url, env = database.resolve("postgresql://team:s3cret@db.local:5432/tinker")
    assert url == "postgresql+psycopg2://team@db.local:5432/tinker" and env == {"PGPASSWORD": "s3cret"}
    assert database.redacted("postgresql://team:s3cret@db:5432/t") == "postgresql://team:***@db:5432/t"
    monkeypatch.setenv(database.ENV, "sqlite:////tmp/x.db")
    assert database.resolve(None) == ("sqlite:////tmp/x.db", {})
    with pytest.raises(UsageError, match="--database-url"):
        database.resolve("mysql://x@y/z")
    with pytest.raises(UsageError) as e:  # no scheme: the URL is quoted back, never its password
        database.resolve("//team:s3cret@db:5432/t")
    assert "s3cret" not in str(e.value) and "team:***@db" in str(e.value)


def test_a_recorded_database_url_keeps_its_password_in_the_password_file_alone(monkeypatch, tmp_path):
    """`serve start` records the URL without its password; libpq's password file (0600) holds it for a restart."""
    from rlcli.server import database

    monkeypatch.delenv(database.ENV, raising=False)
    recorded = database.keep_password("postgresql://team:s3c%3Aret@db.local:5432/tinker", tmp_path)
    assert recorded == "postgresql://team@db.local:5432/tinker"
    passfile = tmp_path / database.PASSFILE
    assert passfile.read_text() == "db.local:5432:tinker:team:s3c\\:ret\n" and passfile.stat().st_mode & 0o777 == 0o600
    assert database.resolve(recorded, tmp_path) == ("postgresql+psycopg2://team@db.local:5432/tinker",
                                                    {"PGPASSFILE": str(passfile)})
    assert database.keep_password("sqlite:////x.db", tmp_path) == "sqlite:////x.db"
    assert database.resolve("postgresql://team@h/db", tmp_path / "none") == ("postgresql+psycopg2://team@h/db", {})


def test_gate_counts_queued_requests_and_releases_them_when_done(home, capsys):
    """max_queued against a stand-in app: the third queued request answers 429 + Retry-After; a retrieved
    future (done, even failed) frees its place, a pending one (408) does not."""
    gate = gate_module()
    tenants.add(tenants.AddOptions(name="carol", max_queued=2))
    key = capsys.readouterr().out.strip()
    answers = iter(range(100))
    retrieve_status = {"code": 408}

    async def app(scope, receive, send):
        body = json.loads((await receive())["body"] or b"{}")
        if scope["path"] == "/api/v1/retrieve_future":
            await send({"type": "http.response.start", "status": retrieve_status["code"], "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        answer = {"request_id": str(next(answers)), "model_id": body.get("model_id")}
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})

    owners = gate.Owners(home / "owners.jsonl")
    owners.owner["model_c"] = "carol"
    middleware = gate.TenantGate(app, gate.Keys(home / "tenants.json", None), owners)

    def post(path: str, payload: dict) -> tuple[int, dict]:
        sent = []

        async def receive():
            return {"type": "http.request", "body": json.dumps(payload).encode(), "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                 "headers": [(b"x-api-key", key.encode())]}
        asyncio.run(middleware(scope, receive, send))
        return sent[0]["status"], dict(sent[0]["headers"])

    step = {"model_id": "model_c"}
    assert post("/api/v1/forward_backward", step)[0] == 200
    assert post("/api/v1/forward_backward", step)[0] == 200
    status, headers = post("/api/v1/forward_backward", step)
    assert status == 429 and int(headers[b"retry-after"]) > 0
    assert post("/api/v1/retrieve_future", {"request_id": "0"})[0] == 408  # still pending: still counted
    assert post("/api/v1/forward_backward", step)[0] == 429
    retrieve_status["code"] = 400  # done, with an error: no longer waiting
    post("/api/v1/retrieve_future", {"request_id": "0"})
    assert post("/api/v1/forward_backward", step)[0] == 200
    assert post("/api/v1/retrieve_future", {"request_id": "99"})[0] == 404  # not carol's: as if absent


def test_gate_refuses_a_body_it_cannot_read(home, capsys):
    """Fail closed: a body that is neither JSON nor forward_backward's proto could name any id unseen."""
    gate = gate_module()
    tenants.add(tenants.AddOptions(name="dave"))
    key = capsys.readouterr().out.strip()
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def receive():
        return {"type": "http.request", "body": b"\x08\x01model_x", "more_body": False}

    async def send(message):
        sent.append(message)

    middleware = gate.TenantGate(app, gate.Keys(home / "tenants.json", None), gate.Owners(home / "owners.jsonl"))
    scope = {"type": "http", "method": "POST", "path": "/api/v1/optim_step", "query_string": b"",
             "headers": [(b"x-api-key", key.encode()), (b"content-type", b"application/octet-stream")]}
    asyncio.run(middleware(scope, receive, send))
    assert reached == [] and sent[0]["status"] == 422


def test_runs_from_before_tenants_are_listed_and_claimed(home, capsys):
    import sqlite3

    from rlcli import config

    state = config.server_state_dir("default")
    state.mkdir(parents=True)
    with sqlite3.connect(state / "tinker.db") as db:  # SkyRL's models table, as far as orphans reads it
        db.execute("create table models (model_id text, created_at text)")
        db.executemany("insert into models values (?, ?)", [("model_old", "1"), ("model_new", "2")])
    (state / tenants.OWNERS_FILE).write_text('["model", "model_new", "alice"]\n')
    tenants.add(tenants.AddOptions(name="alice"))
    tenants.add(tenants.AddOptions(name="bob"))
    capsys.readouterr()
    assert tenants.orphans(tenants.OrphansOptions()) == 0 and capsys.readouterr().out.split() == ["model_old"]
    with pytest.raises(UsageError, match="already owned: model_new"):
        tenants.claim(tenants.ClaimOptions(name="bob", runs="model_old,model_new"))
    with pytest.raises(UsageError, match="no tenant 'carol'"):
        tenants.claim(tenants.ClaimOptions(name="carol", runs="model_old"))
    assert tenants.claim(tenants.ClaimOptions(name="bob", runs="model_old")) == 0
    assert tenants.orphans(tenants.OrphansOptions()) == 0 and capsys.readouterr().out.split() == []
    assert gate_module().Owners(state / tenants.OWNERS_FILE).owner == {"model_new": "alice", "model_old": "bob"}
    assert tenants.models_held() == {"alice": 1, "bob": 1}
