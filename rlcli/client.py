"""The direct HTTP calls to a Tinker API server that the tinker client does not offer, and what SkyRL says.

Every request rlcli makes outside the tinker client goes through `request_json` (or `open_url` for a
download); every wait on a server future through `wait_future`, with one rule: HTTP 408 means "not done
yet", anything else is the answer. The SkyRL 0.4.0 message texts rlcli recognises are named here once
(tests/integration/test_slots.py and test_weights_out.py meet them on the real server).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request

from rlcli.config import PLACEHOLDER_API_KEY
from rlcli.errors import RlcliError, UsageError

# SkyRL's messages and rlcli's capabilities route: strings the server runtime uses too (runtime/shared.py).
from rlcli.server.runtime.shared import CAPABILITIES_ROUTE, NO_FREE_SLOT, NOT_LOADED  # noqa: F401

FUTURE_PENDING = 408  # retrieve_future's status while the request is still queued or running


def request_json(url: str, payload: dict | None = None, timeout: float = 30.0,
                 headers: dict[str, str] | None = None) -> dict:
    """GET url (payload None) or POST payload as JSON; the JSON answer ({} when empty). HTTP errors raise
    urllib.error.HTTPError, network ones OSError: callers decide what each means to them."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **key_header(),
                                                          **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def open_url(url: str, timeout: float = 30.0):
    """A GET whose body the caller reads itself (a download); errors as for request_json."""
    return urllib.request.urlopen(urllib.request.Request(url, headers=key_header()), timeout=timeout)


def key_header() -> dict[str, str]:
    """The tenant key (TINKER_API_KEY, set by --api-key too) as the tinker client sends it: X-API-Key."""
    key = os.environ.get("TINKER_API_KEY")
    return {"X-API-Key": key} if key else {}


def key_refused(base_url: str) -> str:
    """What to say when the server answered 401 (a server started with --tenants): the one wording for it."""
    key = os.environ.get("TINKER_API_KEY")
    what = "refuses this key" if key and key != PLACEHOLDER_API_KEY else "wants a tenant key"
    return (f"{base_url} {what}: set TINKER_API_KEY or pass --api-key (the server's owner makes one with "
            "`rlcli tenant add NAME`)")


def wait_future(base_url: str, request_id: str, timeout: float = 90.0, attempts: int = 20) -> dict:
    """The result of a queued request. SkyRL holds retrieve_future open up to its own limit and then answers
    408 while the request is not done: that is asked again (up to `attempts` times); any other HTTP error is
    the request's failure and raises urllib.error.HTTPError."""
    for _ in range(attempts):
        try:
            return request_json(f"{base_url}/api/v1/retrieve_future", {"request_id": request_id}, timeout=timeout)
        except urllib.error.HTTPError as e:
            if e.code != FUTURE_PENDING:
                raise
    raise TimeoutError(f"request {request_id} was not done after {attempts} waits")


def server_base_model(base_url: str) -> str:
    """The model the server was started with (get_server_capabilities)."""
    caps = request_json(f"{base_url}/api/v1/get_server_capabilities")
    return caps["supported_models"][0]["model_name"]


def unload_model(base_url: str, model_id: str) -> None:
    """Free a model's LoRA slot now; SkyRL's jax backend has a fixed number of them."""
    request_json(f"{base_url}/api/v1/unload_model", {"model_id": model_id})


def unload_models(base_url: str, model_ids: list[str], wait_s: float = 30.0) -> list[str]:
    """Free the server's LoRA slots of these models, waiting for each unload to finish (so the next run on
    the same server finds the slot free); return the ids that could not be unloaded. A model the server no
    longer knows (404) counts as freed."""
    failed = []
    for model_id in model_ids:
        try:
            queued = request_json(f"{base_url}/api/v1/unload_model", {"model_id": model_id}, timeout=10)
            wait_future(base_url, queued["request_id"], timeout=wait_s)
        except urllib.error.HTTPError as e:
            if e.code != 404:
                failed.append(model_id)
        except (OSError, ValueError, KeyError):  # TimeoutError is an OSError
            failed.append(model_id)
    return failed


def training_run(base_url: str, run_id: str) -> dict:
    """The server's record of a training run (base_model, lora_rank, ...); a one-line error if it has none."""
    try:
        return request_json(f"{base_url}/api/v1/training_runs/{run_id}")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise UsageError(f"the server at {base_url} has no training run {run_id!r}: "
                             "`rlcli run list` shows the runs it has") from None
        raise RlcliError(f"the server at {base_url} answered HTTP {e.code} for run {run_id!r}") from None
    except OSError as e:
        raise RlcliError(f"cannot reach the server at {base_url} ({e}): is it running? "
                         "(`rlcli serve status`)") from None


def parse_tinker_path(path: str) -> tuple[str, str, str]:
    """tinker://RUN/sampler_weights/ID, tinker://RUN/weights/ID or SkyRL's tinker://RUN/ID (sampler)
    -> (run_id, "sampler_weights" | "weights", checkpoint_id)."""
    parts = path.removeprefix("tinker://").strip("/").split("/") if path.startswith("tinker://") else []
    if len(parts) == 2:
        parts.insert(1, "sampler_weights")
    if len(parts) != 3 or parts[1] not in ("sampler_weights", "weights") or not all(parts):
        raise UsageError(f"{path!r} is not a checkpoint path: expected tinker://RUN/sampler_weights/ID "
                         "(`rlcli checkpoint list --run-id RUN` shows them)")
    return parts[0], parts[1], parts[2]


def quiesce_tinker(timeout_s: float = 3.0) -> int:
    """Cancel the tinker client's background tasks (session heartbeats every 10 s, telemetry flushes, config
    refreshes) and wait until they are done, while the interpreter is still whole. Returns how many it cancelled.

    The client runs them on an event loop in a daemon thread and its HTTP goes through pyqwest, whose Rust
    threads call back into Python when a request ends. One that ends while the interpreter is finalizing is made
    to exit mid-unwind, and the process dies of SIGABRT with nothing on stderr after its work is done (seen once
    in a `train rl` at exit). rlcli runs this at exit (rlcli/__init__.py), so no request of the client's own is
    in flight then. A process that never started the client's loop pays nothing."""
    import asyncio

    holders = sys.modules.get("tinker.lib.internal_client_holder")
    singleton = getattr(holders, "_internal_client_holder_thread_singleton", None)
    loop, thread = getattr(singleton, "_loop", None), getattr(singleton, "_thread", None)
    if (loop is None or thread is None or not thread.is_alive() or loop.is_closed()
            or thread is threading.current_thread()):
        return 0

    async def cancel_all() -> int:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        return len(tasks)

    try:
        return asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout_s + 1.0)
    except Exception:  # the loop stopped or did not answer in time: exit as it would have
        return 0
