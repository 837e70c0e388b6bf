"""`rlcli serve` against the real SkyRL server on CPU (jax backend, embedded model)."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
import urllib.error

import pytest

from rlcli.client import request_json, unload_model
from rlcli.server import process
from tests.conftest import free_port, run_rlcli, shared_server_venv

pytestmark = pytest.mark.server


def test_tinker_client_trains_saves_and_samples(server, monkeypatch):
    """A LoRA training client: 5 cross_entropy steps on a fixed batch, the loss falls, save, sample."""
    import tinker
    from transformers import AutoTokenizer

    from rlcli.demo import DEMO_CHATS, chat_datum, mean_nll

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    tokenizer = AutoTokenizer.from_pretrained(server.model)
    service = tinker.ServiceClient(base_url=server.url)
    trainer = service.create_lora_training_client(base_model=server.model, rank=8, seed=1).result()
    batch = [chat_datum(tokenizer, p, r) for p, r in DEMO_CHATS]
    losses = []
    for _ in range(5):
        fb = trainer.forward_backward(batch, "cross_entropy")
        trainer.optim_step(tinker.AdamParams(learning_rate=3e-3))
        losses.append(mean_nll(fb.result(), batch))
    assert losses[-1] < losses[0] - 0.3, losses
    saved = trainer.save_weights_for_sampler(name="t-final").result()
    assert saved.path.startswith("tinker://")
    sampler = service.create_sampling_client(model_path=saved.path).result()
    out = sampler.sample(prompt=tinker.ModelInput.from_ints(batch[0].model_input.to_ints()[:10]), num_samples=2,
                         sampling_params=tinker.SamplingParams(max_tokens=8, temperature=1.0, seed=3)).result()
    assert len(out.sequences) == 2 and all(len(s.tokens) > 0 for s in out.sequences)
    unload_model(server.url, trainer.model_id)


QUIESCE_PROBE = """
import asyncio, json, sys
import tinker
from tinker.lib.internal_client_holder import _internal_client_holder_thread_singleton as singleton
from rlcli.client import quiesce_tinker

tinker.ServiceClient(base_url=sys.argv[1]).create_sampling_client(base_model=sys.argv[2]).result()

async def names():
    return sorted(t.get_coro().__qualname__ for t in asyncio.all_tasks()
                  if t is not asyncio.current_task() and not t.done())

def pending():
    return asyncio.run_coroutine_threadsafe(names(), singleton.get_loop()).result(10)

before = pending()
cancelled = quiesce_tinker()
print(json.dumps({"before": before, "cancelled": cancelled, "after": pending()}))
"""


def test_the_clients_background_requests_end_before_the_interpreter_does(server):
    """rlcli.client.quiesce_tinker (run at exit): the session's heartbeat and the other background tasks on the
    tinker client's loop are cancelled and done, so no request of theirs ends while the interpreter finalizes."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, TINKER_API_KEY="tml-test")
    proc = subprocess.run([sys.executable, "-c", QUIESCE_PROBE, server.url, server.model], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert any("heartbeat" in name for name in seen["before"]), seen
    assert seen["cancelled"] == len(seen["before"]) and seen["after"] == [], seen


def test_status_reports_running_and_a_second_start_is_refused(server):
    proc = run_rlcli("serve", "status", env=server.env)
    assert proc.returncode == 0 and proc.stdout.startswith("running:"), proc.stdout
    assert "slots=7 " in proc.stdout and "--slots N" in proc.stdout  # conftest starts it with --slots 7
    again = run_rlcli("serve", "start", "--port", str(free_port()), env=server.env)
    assert again.returncode == 2 and "already running" in again.stderr


def test_results_travel_by_ring_not_by_timer(server, monkeypatch):
    """runtime/rlcli_wake.py: the engine joined the API's doorbell and rings it when a request finishes; the
    engine's (timing) record for the request is written by a plain handler, one line (rich wraps it at 80)."""
    import tinker

    caps = f"{server.url}/api/v1/rlcli/capabilities"
    before = request_json(caps)["rlcli_wake"]
    assert before["wake"] == "notify" and before["engine_joined"] is True and before["log"] == "plain", before
    assert before["submit"] == "one statement" and before["engine_look"] == "pending types first", before
    assert before["results"] == "in the ring" and before["model_check"] == "known models not read again", before
    log = server.log
    assert "each look asks for the pending request types first" in log.read_text(errors="replace")
    offset = log.stat().st_size
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    client = tinker.ServiceClient(base_url=server.url).create_lora_training_client(base_model=server.model,
                                                                                 rank=4).result()
    try:
        tokens = list(range(5, 21))
        datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                             loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 15})
        out = client.forward([datum], "cross_entropy").result()
        assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == 15
        # The one-statement submit keeps SkyRL's retry rules: the same (model, seq_id) and body is the same
        # future, other data under a used seq_id is 409, another seq_id is a new future.
        step = {"model_id": client.model_id, "adam_params": {"learning_rate": 1e-4}, "seq_id": 1000}
        route = f"{server.url}/api/v1/optim_step"
        first = request_json(route, step)["request_id"]
        assert request_json(route, step)["request_id"] == first
        with pytest.raises(urllib.error.HTTPError) as reused:
            request_json(route, {**step, "adam_params": {"learning_rate": 2e-4}})
        assert reused.value.code == 409, reused.value
        assert request_json(route, {**step, "seq_id": 1001})["request_id"] not in (first, None)
        for _ in range(2):  # an unknown model is 404 every time, also after known ones skipped their read
            with pytest.raises(urllib.error.HTTPError) as unknown_model:
                request_json(route, {**step, "model_id": "no-such-model", "seq_id": None})
            assert unknown_model.value.code == 404, unknown_model.value
        retrieve = f"{server.url}/api/v1/retrieve_future"
        once = request_json(retrieve, {"request_id": first})  # its ring came first: kept for this retrieve
        assert "metrics" in once and request_json(retrieve, {"request_id": first}) == once  # again: the database
        with pytest.raises(urllib.error.HTTPError) as unknown:
            request_json(retrieve, {"request_id": "999999999"})
        assert unknown.value.code == 404, unknown.value
        # A result over the ring's limit (forward of 4 x 600 tokens: ~100 KB of JSON) comes from the database.
        during = request_json(caps)["rlcli_wake"]
        long = [tinker.Datum(model_input=tinker.ModelInput.from_ints([(7 * i + j) % 1000 + 5 for j in range(600)]),
                             loss_fn_inputs={"target_tokens": [(7 * i + j) % 1000 + 6 for j in range(600)],
                                             "weights": [1.0] * 600}) for i in range(4)]
        big = client.forward(long, "cross_entropy").result()
        assert [len(o["logprobs"].tolist()) for o in big.loss_fn_outputs] == [600] * 4
        big_after = request_json(caps)["rlcli_wake"]
        assert big_after["look_rings"] > during["look_rings"], (during, big_after)  # "read it from the database"
        assert big_after["database_reads"] > during["database_reads"], (during, big_after)
    finally:
        unload_model(server.url, client.model_id)
    timing = re.compile(r" - INFO - skyrl: \(timing\) process_batch_requests\(forward, n=1\) took [0-9.]+s$", re.M)
    for _ in range(100):  # the launcher copies the engine's output into the log a moment after it is written
        with log.open("rb") as f:
            f.seek(offset)
            if timing.search(f.read().decode(errors="replace")):
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"no one-line (timing) record for the forward in {log}")
    after = request_json(caps)["rlcli_wake"]
    # create_model and forward (both awaited) completed futures in the engine, which rang the API with their
    # results; the API's commits (the new futures, the unload) rang the engine.
    assert after["rings"]["from_engine"] >= before["rings"]["from_engine"] + 2, (before, after)
    assert after["results_by_ring"] >= before["results_by_ring"] + 3, (before, after)  # create, forward, optim
    # The forward read the new model's row; the optim_steps and the long forward after it did not.
    assert after["model_checks_skipped"] >= before["model_checks_skipped"] + 4, (before, after)
    assert after["rings"]["to_engine"] >= before["rings"]["to_engine"] + 3, (before, after)


def _huge_pages_possible() -> str | None:
    """Why the kernel or C library here cannot give malloc huge pages, or None when they can."""
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "no transparent huge pages in this kernel"
    if "[never]" in mode:
        return "transparent huge pages are off on this machine ([never])"
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    if tuple(map(int, libc.split()[1].split(".")[:2])) < (2, 35):
        return f"{libc} has no glibc.malloc.hugetlb tunable (glibc 2.35 and later)"
    return None


# A forward_backward of 8 x 64 tokens on the session server faulted ~17,600 fresh pages in with glibc as it
# comes (XLA's scratch block mapped and unmapped every step, RLCLI_STOCK_MALLOC=1); kept in the engine's one
# arena, a step faults in about one.
FAULTS_PER_STEP_KEPT = 500


def test_cpu_engine_keeps_its_scratch_memory_between_steps(server, monkeypatch):
    """`serve start` gives a jax engine on CPU one kept malloc arena in huge pages (commands.malloc_env): XLA's
    scratch for a step is not mapped, faulted in page by page and unmapped again every forward_backward."""
    import tinker

    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    if not libc.startswith("glibc "):
        pytest.skip(f"{libc or 'this C library'} is not glibc: GLIBC_TUNABLES means nothing to it")
    from tests.conftest import server_group

    members = process.group_members(server_group(server))
    engine = next(pid for pid in members if b"preload" in open(f"/proc/{pid}/cmdline", "rb").read())

    def minor_faults() -> int:
        return int(open(f"/proc/{engine}/stat").read().rsplit(")", 1)[1].split()[7])

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    client = tinker.ServiceClient(base_url=server.url).create_lora_training_client(base_model=server.model,
                                                                                 rank=8).result()
    try:
        batch = [tinker.Datum(model_input=tinker.ModelInput.from_ints([(7 * i + j) % 1000 + 5 for j in range(64)]),
                              loss_fn_inputs={"target_tokens": [(7 * i + j) % 1000 + 6 for j in range(64)],
                                              "weights": [1.0] * 64}) for i in range(8)]
        client.forward_backward(batch, "cross_entropy").result()  # compiled (or loaded) and run once
        before, steps = minor_faults(), 3
        for _ in range(steps):
            client.forward_backward(batch, "cross_entropy").result()
        per_step = (minor_faults() - before) / steps
    finally:
        unload_model(server.url, client.model_id)
    assert per_step < FAULTS_PER_STEP_KEPT, f"{per_step:.0f} minor page faults per forward_backward"
    why_not = _huge_pages_possible()
    if why_not is None:
        huge_kib = sum(int(line.split()[1]) for line in open(f"/proc/{engine}/smaps_rollup")
                       if line.startswith("AnonHugePages:"))
        assert huge_kib > 0, "the engine holds no transparent huge pages"


def test_managed_url_is_used_without_flags(server):
    env = dict(server.env)
    env.pop("TINKER_BASE_URL", None)
    proc = run_rlcli("demo", "--steps", "2", env=env, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr  # 2 steps may not lower the loss; the round trip must work
    assert f"server {server.url}" in proc.stderr and "saved sampler weights: tinker://" in proc.stdout


def test_kill_9_of_the_api_leaves_nothing_after_stop_and_start_works_again(tmp_path, embedded_model):
    """Its own server: start, kill -9 the API, `serve stop` leaves no process, `serve start` works again."""
    port = free_port()
    env = dict(os.environ, RLCLI_HOME=str(tmp_path / "home"), RLCLI_SERVER_VENV=str(shared_server_venv()))
    try:
        start = ["serve", "start", "--base-model", embedded_model, "--port", str(port),
                 "--backend-config", '{"max_lora_adapters": 2}']
        run_rlcli(*start, env=env, check=True)
        state = process.read_state(tmp_path / "home" / "servers" / "default")
        users_run = _one_sft_step(f"http://127.0.0.1:{port}", embedded_model)  # a shape for the restart to replay
        members = process.live_members(state)
        # launcher, API, the engine (preloaded by the launcher) and its stand-in that the API started
        roles = sorted(_role(p) for p in members)
        assert roles == ["api", "engine", "preload", "supervise"], roles
        api_pid = next(p for p in members if _role(p) == "api")
        os.kill(api_pid, signal.SIGKILL)
        _wait(lambda: run_rlcli("serve", "status", env=env).stdout.startswith("dead"), 30)
        run_rlcli("serve", "stop", env=env, check=True)
        assert process.live_members(state) == []
        assert _port_free(port)

        cache = tmp_path / "home" / "cache" / "jax"
        compiled = sorted(p.name for p in cache.iterdir())
        assert compiled, "the first start's compiled programs were not kept in RLCLI_HOME/cache/jax"
        run_rlcli(*start, env=env, check=True)
        status = run_rlcli("serve", "status", env=env)
        # runtime/rlcli_warmup.py: the restart replayed the step's shape before it was ready, and says so.
        assert status.returncode == 0 and "start-up warmed 1 recorded batch shapes" in status.stdout, status.stdout
        # The restart ran the same programs on the same shapes (readiness round trip, warm-up): all from the cache.
        assert sorted(p.name for p in cache.iterdir()) == compiled
        # Each start's readiness probe (a model made and unloaded) is deleted after it; the user's run is kept.
        runs = request_json(f"http://127.0.0.1:{port}/api/v1/training_runs?limit=100")["training_runs"]
        assert [r["training_run_id"] for r in runs] == [users_run], runs
        state2 = process.read_state(tmp_path / "home" / "servers" / "default")
        run_rlcli("serve", "stop", env=env, check=True)
        assert process.live_members(state2) == [] and _port_free(port)
        log = tmp_path / "home" / "servers" / "default" / "server.log"
        assert "Starting background engine" in log.read_text()
        assert oct(log.stat().st_mode & 0o777) == "0o600"  # the server's files are private
    finally:  # a failed check leaves no server running (a second stop finds none: exit 0)
        run_rlcli("serve", "stop", env=env)


def _one_sft_step(url: str, model: str) -> str:
    """forward_backward (1 x 16 tokens) + optim_step on a new rank-1 LoRA, then unload it; its model id."""
    import tinker

    trainer = tinker.ServiceClient(base_url=url, api_key="tml-test").create_lora_training_client(
        base_model=model, rank=1, seed=0).result()
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(list(range(1, 17))),
                         loss_fn_inputs={"target_tokens": list(range(2, 18)), "weights": [1.0] * 16})
    trainer.forward_backward([datum], "cross_entropy").result()
    trainer.optim_step(tinker.AdamParams(learning_rate=1e-3)).result()
    unload_model(url, trainer.model_id)
    return trainer.model_id


def _role(pid: int) -> str:
    """The launcher role a server process runs (launcher.py ROLE ...)."""
    args = open(f"/proc/{pid}/cmdline").read().split("\0")
    return args[args.index(next(a for a in args if a.endswith("launcher.py"))) + 1]


def _wait(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError("condition not met in time")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_logs_prints_and_follows(server):
    proc = run_rlcli("serve", "logs", "-n", "5", env=server.env)
    assert proc.returncode == 0 and len(proc.stdout.strip().splitlines()) == 5
    import subprocess
    import sys
    import threading

    follower = subprocess.Popen([sys.executable, "-m", "rlcli.cli", "serve", "logs", "-f", "-n", "0"],
                                env=server.env, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in follower.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:  # until a status request's healthz line is followed (the first may come before it follows)
        deadline = time.monotonic() + 60
        while not any("/api/v1/healthz" in line for line in lines) and time.monotonic() < deadline:
            run_rlcli("serve", "status", env=server.env)  # its healthz request lands in the log
            time.sleep(0.3)
    finally:
        follower.kill()
    follower.wait()
    reader.join(timeout=10)
    followed = "".join(lines)
    assert "/api/v1/healthz" in followed, followed[-2000:]
