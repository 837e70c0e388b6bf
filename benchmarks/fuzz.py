"""Every HTTP surface rlcli exposes, fuzzed from its own OpenAPI schema (schemathesis over hypothesis), with the
hand-made cases a schema cannot express (benchmarks/fuzz_cases.py), while a well-behaved client works beside it.

    python -m benchmarks.fuzz                    # the full run (~10 min on 2 cores): receipt in benchmarks/receipts/
    python -m benchmarks.fuzz --examples 40      # a larger one

Surfaces: SkyRL's API as `rlcli serve start` runs it (its /openapi.json), the same with `--tenants` (tenant alice's
key over tenant bob's ids), and `rlcli endpoint` (rlcli/endpoint/openapi.json, which a unit test holds to the app's
route table). Each operation gets `--examples` positive and as many negative cases, seeded: the counts do not depend
on the machine. What must hold, per surface: no 5xx with a traceback in its body and no 500 at all (a client's input
is never the server's fault), no request left unanswered, the server alive and healthy after, the client beside it
never failed, no file written outside the server's folder, and no answer to alice that carries bob's data.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import fuzz_cases
from benchmarks.common import stop_servers_on_sigterm, versions, write_receipt

ENDPOINT_SCHEMA = Path(__file__).resolve().parent.parent / "rlcli" / "endpoint" / "openapi.json"
TRACEBACK = "Traceback (most recent call last)"
TIMEOUT = 60.0  # one request; SkyRL's own retrieve_future waits up to 45 s
# Ids the generated requests name: in the tenant run each is replaced by bob's, so every one asks for his data.
ID_KEYS = ("model_id", "session_id", "sampling_session_id", "sampler_id", "unique_id")


class Tally:
    """What one surface's requests got: counts per operation and status, and the findings (at most 50 kept)."""

    def __init__(self) -> None:
        self.operations: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.findings: list[dict] = []
        self.lock = threading.Lock()

    def add(self, label: str, status: int | str, finding: str | None = None, detail: str = "") -> None:
        with self.lock:
            self.operations[label] += 1
            self.statuses[str(status)] += 1
            if finding and len(self.findings) < 50:
                self.findings.append({"operation": label, "status": status, "kind": finding, "detail": detail[:300]})

    def judge(self, label: str, status: int, text: str, foreign: bool = False, secrets: tuple = ()) -> None:
        """One answer against what must hold; `foreign`: the request named another tenant's ids."""
        finding = None
        if status >= 500 and TRACEBACK in text:
            finding = "5xx with a traceback"
        elif status == 500:
            finding = "500"
        elif 200 <= status < 300 and (foreign or any(s in text for s in secrets)):
            finding = "another tenant's data"
        self.add(label, status, finding, text)

    def body(self) -> dict:
        return {"requests": sum(self.operations.values()), "per_operation": dict(sorted(self.operations.items())),
                "statuses": dict(sorted(self.statuses.items())), "findings": self.findings}


def fuzz_schema(schema: Any, url: str, tally: Tally, *, examples: int, seed: int, headers: dict | None = None,
                foreign: dict[str, str] | None = None, secrets: tuple = ()) -> None:
    """Each operation of `schema`: `examples` positive and negative cases (schemathesis generates them), sent to
    `url` and judged. `foreign`: ids put in place of the generated ones (path and body), bob's in the tenant run."""
    import requests
    from schemathesis import GenerationMode

    session = requests.Session()

    def send(case: Any, named: bool, label: str) -> None:
        try:
            r = case.call(base_url=url, session=session, headers=headers, timeout=TIMEOUT)
        except Exception as e:  # noqa: BLE001 - an unanswered request is a finding, whatever raised
            tally.add(label, "no answer", "no answer", f"{type(e).__name__}: {e}")
            return
        tally.judge(label, r.status_code, r.text, foreign=named, secrets=secrets)

    for result in schema.get_all_operations():
        op = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz_operation(op, mode, lambda case, named, op=op: send(case, named, op.label), examples, seed, foreign)


def fuzz_operation(op: Any, mode: Any, send: Callable[[Any, bool], None], examples: int, seed: int,
                   foreign: dict[str, str] | None) -> None:
    """hypothesis draws `examples` cases of `op` from schemathesis' strategy (seeded) and hands each to `send`, with
    whether it names `foreign` ids."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis.errors import Unsatisfiable

    params = {p.name: foreign[p.name] for p in op.path_parameters if foreign and p.name in foreign}

    @hseed(seed)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(op.as_strategy(generation_mode=mode, path_parameters=params or None))
    def draw(case: Any) -> None:
        named = bool(params)
        if foreign and isinstance(case.body, dict):
            for key in set(case.body) & set(foreign):
                case.body[key], named = foreign[key], True
        send(case, named)

    with contextlib.suppress(Unsatisfiable):  # an operation with no negative cases: it takes no input
        draw()


class Beside:
    """A well-behaved client in a thread, calling `step()` until stopped; every exception it meets is a failure."""

    def __init__(self, step: Callable[[], None]):
        self.step, self.calls, self.failures = step, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
                self.calls += 1
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                self.failures.append(f"{type(e).__name__}: {str(e)[:200]}")
                time.sleep(0.5)

    def __enter__(self) -> Beside:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=300)

    def body(self) -> dict:
        return {"calls": self.calls, "failures": len(self.failures), "first_failures": self.failures[:5]}


def tinker_step(url: str, model: str, key: str) -> Callable[[], None]:
    """forward_backward, then a sample of the base model: what a trainer and an RL loop send, over and over."""
    import tinker

    from tests import sdk_scenario

    service = tinker.ServiceClient(base_url=url, api_key=key)
    trainer = service.create_lora_training_client(base_model=model, rank=2, seed=0).result()
    sampler = service.create_sampling_client(base_model=model)
    sampler = sampler.result() if hasattr(sampler, "result") else sampler
    prompt = tinker.ModelInput.from_ints(sdk_scenario.PROMPT)

    def step() -> None:
        trainer.forward_backward([sdk_scenario.datum(tinker)], "cross_entropy").result(timeout=300)
        sampler.sample(prompt, 1, tinker.SamplingParams(max_tokens=2, temperature=0.0)).result(timeout=300)

    return step


def openai_step(url: str, key: str) -> Callable[[], None]:
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=300)

    def step() -> None:
        answer = client.chat.completions.create(model="base", max_tokens=2, temperature=0,
                                                messages=[{"role": "user", "content": "1 + 1 ="}])
        assert answer.choices[0].message.content is not None

    return step


def tree(root: Path, skip: Path | None = None) -> dict[str, int]:
    """Every file under `root` (but `skip`) with its size: taken before and after, to see what was written."""
    out = {}
    for folder, dirs, files in os.walk(root):
        if skip is not None and Path(folder) == skip.parent:
            dirs[:] = [d for d in dirs if Path(folder) / d != skip]
        for f in files:
            p = Path(folder) / f
            with contextlib.suppress(OSError):
                out[str(p.relative_to(root))] = p.lstat().st_size
    return out


def healthy(url: str, path: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + path, timeout=30) as r:
            return r.status == 200
    except OSError:
        return False


def api_pid(home: Path) -> int | None:
    """The SkyRL API process of the server under `home` (launcher.py's `api` role: it holds the port)."""
    from rlcli.server.process import group_members, read_state

    state = read_state(home / "servers" / "default")
    for pid in group_members(state.pgid) if state else []:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[2:3] == [b"api"]:
                return pid
    return None


@contextlib.contextmanager
def watched_root() -> Iterator[tuple[Path, Path]]:
    """(root, home): the server's RLCLI_HOME inside a private root with a canary folder; whatever appears in the
    root outside the home, or changes in the canary, was written where the server must not write."""
    root = Path(tempfile.mkdtemp(prefix="rlcli-fuzz-"))
    (root / "canary").mkdir()
    (root / "canary" / "keep.txt").write_text("the fuzzer's canary: nothing may change here\n")
    try:
        yield root, root / "home"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def outside_writes(root: Path, home: Path, before: dict[str, int]) -> list[str]:
    after = tree(root, skip=home)
    return sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))


def check_surface(name: str, url: str, health: str, tally: Tally, beside: Beside, root: Path, home: Path,
                  before: dict[str, int], cases: dict) -> dict:
    """The surface's figures and every must-hold in one record."""
    writes = outside_writes(root, home, before)
    alive = healthy(url, health)
    record = {"surface": name, **tally.body(), "hand_made": cases, "beside": beside.body(),
              "healthy_after": alive, "written_outside": writes[:20]}
    problems = [f["kind"] for f in tally.findings] + [f["kind"] for c in cases.values() for f in c.get("findings", [])]
    problems += ["unhealthy after"] * (not alive) + ["beside client failed"] * bool(beside.failures)
    problems += ["file written outside the server's folder"] * bool(writes)
    record["must_hold"] = not problems
    record["problems"] = dict(collections.Counter(problems))
    return record


def fuzz_skyrl(model: str, root: Path, home: Path, examples: int, seed: int, big_mb: int,
               connections: int) -> dict:
    """SkyRL's API without tenants: schemathesis, then the hand-made cases, the tinker client beside."""
    import schemathesis

    from rlcli.server.private import private_server
    from tests.conftest import shared_server_venv

    before = tree(root, skip=home)
    with private_server(model, "--slots", "3", home=home, venv=shared_server_venv()) as srv:
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
        tally = Tally()
        t0 = time.monotonic()
        with Beside(tinker_step(srv.url, srv.model, "tml-self-hosted")) as beside:
            fuzz_schema(schema, srv.url, tally, examples=examples, seed=seed)
            cases = fuzz_cases.all_cases(srv.url, root, pid=api_pid(home), big_mb=big_mb, connections=connections)
        record = check_surface("skyrl", srv.url, "/api/v1/healthz", tally, beside, root, home, before, cases)
        record["seconds"] = round(time.monotonic() - t0, 1)
        record["endpoint"] = fuzz_endpoint(srv, root, home, examples, seed, connections)
    return record


def fuzz_endpoint(srv: Any, root: Path, home: Path, examples: int, seed: int, connections: int) -> dict:
    """`rlcli endpoint` over the same server: its OpenAPI document, the hand-made cases, the openai package beside."""
    import schemathesis

    from rlcli.server.private import free_port
    from tests.conftest import run_rlcli

    before = tree(root, skip=home)
    port = free_port()
    out = run_rlcli("endpoint", "start", "--port", str(port), "--max-tokens", "4", "--capture",
                    str(home / "capture"), env=srv.env, check=True, timeout=300)
    url = out.stdout.strip()
    try:
        schema = schemathesis.openapi.from_dict(json.loads(ENDPOINT_SCHEMA.read_text()))
        tally = Tally()
        t0 = time.monotonic()
        with Beside(openai_step(url, "unused")) as beside:
            fuzz_schema(schema, url, tally, examples=examples, seed=seed)
            cases = fuzz_cases.endpoint_cases(url, root, connections=connections)
        record = check_surface("endpoint", url, "/healthz", tally, beside, root, home, before, cases)
        record["seconds"] = round(time.monotonic() - t0, 1)
    finally:
        run_rlcli("endpoint", "stop", env=srv.env, timeout=120)
    return record


def fuzz_tenants(model: str, root: Path, home: Path, examples: int, seed: int) -> dict:
    """SkyRL's API with --tenants: alice's key over bob's ids (a model, a session, a sampler, a checkpoint)."""
    import schemathesis

    from rlcli.server.private import private_server
    from tests.conftest import run_rlcli, shared_server_venv

    keys = {}
    for name in ("alice", "bob"):
        keys[name] = run_rlcli("tenant", "add", name, env=dict(os.environ, RLCLI_HOME=str(home)), check=True,
                               timeout=60).stdout.strip()
    before = tree(root, skip=home)
    with private_server(model, "--tenants", "--slots", "3", home=home, venv=shared_server_venv()) as srv:
        bob = fuzz_cases.tenant_data(srv.url, srv.model, keys["bob"])
        foreign = {k: bob[k] for k in ID_KEYS if k in bob}
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json", headers={"X-API-Key": keys["alice"]})
        tally = Tally()
        t0 = time.monotonic()
        with Beside(tinker_step(srv.url, srv.model, keys["alice"])) as beside:
            fuzz_schema(schema, srv.url, tally, examples=examples, seed=seed, headers={"X-API-Key": keys["alice"]},
                        foreign=foreign, secrets=(bob["model_id"], bob["checkpoint"]))
            cases = {"other_tenants_ids": fuzz_cases.other_tenant(srv.url, keys["alice"], bob),
                     "tenant_gate_inputs": fuzz_cases.gate_inputs(srv.url, keys["alice"], pid=api_pid(home))}
        record = check_surface("skyrl --tenants", srv.url, "/api/v1/healthz", tally, beside, root, home, before,
                               cases)
        record["seconds"] = round(time.monotonic() - t0, 1)
    return record


def run(examples: int, seed: int, big_mb: int, connections: int) -> dict:
    from tests.conftest import install_embedded_model

    model = install_embedded_model()
    surfaces = []
    t0 = time.monotonic()
    with watched_root() as (root, home):
        plain = fuzz_skyrl(model, root, home, examples, seed, big_mb, connections)
        surfaces += [plain, plain.pop("endpoint")]
    with watched_root() as (root, home):
        surfaces.append(fuzz_tenants(model, root, home, examples, seed))
    return {"settings": {"examples_per_operation_and_mode": examples, "seed": seed, "big_body_mb": big_mb,
                         "connections": connections},
            "requests": {s["surface"]: s["requests"] for s in surfaces},
            "must_hold": all(s["must_hold"] for s in surfaces), "seconds": round(time.monotonic() - t0, 1),
            "surfaces": surfaces}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=10, help="generated cases per operation and mode (positive, "
                                                             "negative)")
    p.add_argument("--seed", type=int, default=49)
    p.add_argument("--big-mb", type=int, default=256, help="the size of the oversized bodies (fuzz_cases.BIG_WHY)")
    p.add_argument("--connections", type=int, default=2000, help="raw connections opened and dropped at once")
    p.add_argument("--out", type=Path, default=None, help="receipt folder (default benchmarks/receipts/)")
    a = p.parse_args()
    stop_servers_on_sigterm()
    body = run(a.examples, a.seed, a.big_mb, a.connections)
    body["versions"] = versions("schemathesis", "hypothesis", "skyrl", "tinker", "tinker-cookbook")
    path = write_receipt("fuzz", body, a.out)
    for s in body["surfaces"]:
        print(f"{s['surface']}: {s['requests']} generated requests, statuses {s['statuses']}, "
              f"must hold: {s['must_hold']} {s['problems'] or ''}")
    print(path)
    raise SystemExit(0 if body["must_hold"] else 1)


if __name__ == "__main__":
    main()
