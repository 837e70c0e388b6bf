"""Secrets never leak and user data stays its owner's, after one full run under the ordinary umask 022; and the
fuzzer's tenant surface (benchmarks/fuzz.py, at test_fuzz.py's size), on the same team server first.

One team server (`serve start --tenants`, SkyRL's state in Postgres where the tests have it: the password in
--database-url). First the fuzzer: alice's key over bob's ids from the schema, by hand, and the gate's own inputs
(tenants alice, bob, carol as in test_tenants.py). Then, through the same server: `import -o`, `train sl`, `export`,
a loop iteration, the endpoint answering a tenant, refusing a wrong key and failing a request, a CLI command
refused for a wrong key, `serve restart`, then `serve status` and `doctor`. Then every file under the private
RLCLI_HOME (the fuzzer's hostile requests' traces in the server's log included), the run, loop, export and import
outputs, and every command's stdout and stderr is searched for each secret, raw, base64 and URL-encoded (`tenant
add` excepted: printing the new key is its job); and every file and folder rlcli wrote must be its owner's alone.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import stat
import urllib.parse
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import fuzz, fuzz_cases
from rlcli.loop import batches, settings
from rlcli.server import database
from rlcli.server.private import free_port
from tests.conftest import run_rlcli, shared_compile_cache
from tests.integration.test_endpoint import post
from tests.integration.test_fuzz import EXAMPLES, SEED, must_hold
from tests.integration.test_tenants import call, tenant_server

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(900)]
# A key nobody was given, with characters that URL-encoding changes; and the tests' own key for the wrong tenant.
WRONG_KEY = "tml-Wr0ng+Key/that=nobody-holds-7f3a"
LOOP = dict(match="number", steps=2, lr=1e-2, save_every=2, max_tokens=8, eval_limit=4, regression_margin=1.0)


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def database_url(request) -> list[str]:
    """--database-url of the tests' Postgres, or nothing where there is none (the keys are still checked)."""
    try:
        return ["--database-url", request.getfixturevalue("postgres")]
    except pytest.skip.Exception:
        return []


class Run:
    """The commands' outputs and the folders they wrote."""

    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.env, self.outputs = root, env, []

    def rlcli(self, *args: str, ok: bool | None = True, **kw) -> str:
        """Its stdout; ok: that it succeeds (True), fails (False), or either (None)."""
        proc = run_rlcli(*args, env=kw.pop("env", self.env), timeout=kw.pop("timeout", 300), **kw)
        assert ok is None or (proc.returncode == 0) == ok, f"rlcli {' '.join(args)}: {proc.stderr[-3000:]}"
        self.outputs.append((" ".join(args), proc.stdout + proc.stderr))
        return proc.stdout


def train_and_loop(run: Run, carol: str) -> None:
    """import -o, train sl, export its weights, one loop iteration: every folder of the user's data."""
    root = run.root
    made = batches.write_all(str(root / "batches"), n=24)
    run.rlcli("import", str(made[0]), "-f", "openai", "-o", str(root / "imported.jsonl"))
    run.rlcli("train", "sl", "--dataset", str(root / "imported.jsonl"), "--batch-size", "4", "--max-steps", "2",
              "--save-every", "0", "--log-path", str(root / "run"))
    final = [json.loads(line) for line in (root / "run" / "checkpoints.jsonl").read_text().splitlines()][-1]
    run.rlcli("export", final["sampler_path"], "-o", str(root / "exported"))
    (root / "inbox").mkdir()
    run.rlcli("loop", "init", str(root / "loop"), "--traces", str(root / "inbox" / "*.jsonl"), "-f", "openai",
              "--regression", str(made[-1]), "--base-url", run.env["TINKER_BASE_URL"])
    settings.write(root / "loop", replace(settings.read(root / "loop"), **LOOP))
    (root / "inbox" / "b1.jsonl").write_bytes(made[0].read_bytes())
    run.rlcli("loop", "run", str(root / "loop"), "--once", timeout=600)
    # A command refused for a key the server does not know: its one line must not repeat the key.
    run.rlcli("--api-key", WRONG_KEY, "run", "list", ok=False, env={**run.env, "TINKER_API_KEY": carol})


def endpoint_requests(run: Run, keys: dict[str, str]) -> None:
    """The endpoint answers a tenant, refuses a wrong key and no key, and fails a bad request, each logged."""
    url = run.rlcli("endpoint", "start", "--port", str(free_port()), "--capture", str(run.root / "capture"),
                    "--loops", str(run.root / "loop")).strip()
    chat = url + "/v1/chat/completions"
    ask = {"model": "base", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}
    try:
        assert post(chat, ask, key=keys["carol"])[0] == 200
        assert post(chat, ask, key=WRONG_KEY)[0] == 401
        assert post(chat, {**ask, "temperature": -3}, key=keys["alice"])[0] == 400
        assert 400 <= post(chat, {**ask, "model": "tinker://nobody/sampler_weights/x"}, key=keys["bob"])[0] < 500
    finally:
        run.rlcli("endpoint", "stop", ok=None)


def restart_and_report(run: Run) -> None:
    """`serve restart` finds the database password where start kept it; then status and doctor say their piece."""
    run.rlcli("serve", "restart", timeout=600)
    assert run.rlcli("run", "list")  # carol's runs, through the restarted server and its database
    run.rlcli("serve", "status")
    run.rlcli("doctor", ok=None)


@pytest.fixture(scope="module")
def team(tmp_path_factory, embedded_model, request):
    """(root, server, keys, --database-url) of the module's team server, started under umask 022."""
    root = tmp_path_factory.mktemp("secrets")
    database = database_url(request)
    with umask(0o022), tenant_server(shared_compile_cache(root / "home"), embedded_model, database) as (srv, keys):
        yield root, srv, keys, database


@pytest.fixture(scope="module")
def tenants(team):
    _, srv, keys, _ = team
    return srv, keys, fuzz_cases.tenant_data(srv.url, srv.model, keys["bob"])


def test_tenant_api_from_its_schema_with_alices_key_over_bobs_ids(tenants):
    import schemathesis

    srv, keys, bob = tenants
    alice = {"X-API-Key": keys["alice"]}
    schema = schemathesis.openapi.from_url(srv.url + "/openapi.json", headers=alice)
    tally = fuzz.Tally()
    with fuzz.Beside(fuzz.tinker_step(srv.url, srv.model, keys["alice"])) as beside:
        fuzz.fuzz_schema(schema, srv.url, tally, examples=EXAMPLES, seed=SEED, headers=alice,
                         foreign={k: bob[k] for k in fuzz.ID_KEYS}, secrets=(bob["model_id"], bob["checkpoint"]))
    body = tally.body()
    assert body["requests"] > 150 and body["findings"] == [], body["findings"]
    assert beside.calls > 0 and beside.failures == [], beside.failures


def test_alice_asks_for_each_of_bobs_things_by_hand(tenants):
    srv, keys, bob = tenants
    must_hold(fuzz_cases.other_tenant(srv.url, keys["alice"], bob))


def test_the_tenant_gates_own_inputs(tenants):
    """Regression: `?offset=abc` was a 500 from the gate's int(); a 64 MB body is read once (and refused by the cap)."""
    srv, keys, _ = tenants
    result = fuzz_cases.gate_inputs(srv.url, keys["carol"], pid=None)
    must_hold(result)
    assert result["statuses"].get("500", 0) == 0 and "413" in result["statuses"], result


def free_slots(srv, keys: dict[str, str]) -> None:
    """Unload every model alice and bob hold (the fuzzer's): the team server has 3 LoRA slots, the full run needs
    them for carol."""
    for key in (keys["alice"], keys["bob"]):
        for run in call(srv.url + "/api/v1/training_runs", key=key)[1]["training_runs"]:
            status, queued, _ = call(srv.url + "/api/v1/unload_model", "POST", {"model_id": run["training_run_id"]},
                                     key=key)
            if status == 200:
                call(srv.url + "/api/v1/retrieve_future", "POST", {"request_id": queued["request_id"]}, key=key)


@pytest.fixture(scope="module")
def full_run(team):
    root, srv, keys, database = team
    free_slots(srv, keys)
    run = Run(root, {**srv.env, "TINKER_BASE_URL": srv.url, "TINKER_API_KEY": keys["carol"]})
    train_and_loop(run, keys["carol"])
    endpoint_requests(run, keys)
    restart_and_report(run)
    password = database[1].split(":")[2].split("@")[0] if database else None
    return run, srv, [*keys.values(), WRONG_KEY, *([password] if password else [])]


def encodings(secret: str) -> list[bytes]:
    """The secret as written, URL-encoded, and in base64 (at each of its 3 alignments, padding cut off)."""
    raw = secret.encode()
    found = [raw, urllib.parse.quote(secret, safe="").encode(), urllib.parse.quote_plus(secret).encode()]
    for shift in range(3):
        coded = base64.b64encode(raw[shift:])
        found.append(coded[:len(raw[shift:]) * 4 // 3 - 4])
    return found


def written(run: Run, srv) -> list[Path]:
    """Every file and folder rlcli wrote in this run (the tests' own inputs and the shared cache link left out)."""
    tops = [srv.home, *(run.root / name for name in ("run", "exported", "loop", "capture", "imported.jsonl"))]
    paths = []
    for top in tops:
        paths.append(top)
        for folder, dirs, files in os.walk(top):
            paths += [Path(folder) / name for name in dirs + files]
    return [p for p in paths if not p.is_symlink()]


def test_no_secret_in_any_file_or_output(full_run):
    run, srv, secrets = full_run
    # The one file meant to hold a secret: libpq's password file, for `serve restart` (0600, as the next test checks).
    places = [(str(p), p.read_bytes()) for p in written(run, srv) if p.is_file() and p.name != database.PASSFILE]
    places += [(f"output of rlcli {cmd}", text.encode()) for cmd, text in run.outputs]
    assert len(places) > 20 and any("server.log" in name for name, _ in places)
    leaks = [(name, secret[:8] + "...") for secret in secrets for coded in encodings(secret)
             for name, data in places if coded in data]
    assert not leaks, leaks


def test_every_file_rlcli_wrote_is_its_owners_alone(full_run):
    run, srv, _ = full_run
    paths = written(run, srv)
    assert any(p.name == "checkpoints.jsonl" for p in paths) and any(p.name == "tenants.json" for p in paths)
    open_to_others = [f"{p} {oct(stat.S_IMODE(p.lstat().st_mode))}" for p in paths if p.lstat().st_mode & 0o077]
    assert not open_to_others, open_to_others
