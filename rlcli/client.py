"""Small direct calls to a Tinker API server that the tinker client does not offer."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from rlcli.errors import RlcliError, UsageError


def request_json(url: str, payload: dict | None = None, timeout: float = 30.0) -> dict:
    """GET url (payload None) or POST payload as JSON; the JSON answer ({} when empty). HTTP errors raise
    urllib.error.HTTPError, network ones OSError: callers decide what each means to them."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def server_base_model(base_url: str) -> str:
    """The model the server was started with (get_server_capabilities)."""
    caps = request_json(f"{base_url}/api/v1/get_server_capabilities")
    return caps["supported_models"][0]["model_name"]


def unload_model(base_url: str, model_id: str) -> None:
    """Free a model's LoRA slot now; SkyRL's jax backend has a fixed number of them."""
    request_json(f"{base_url}/api/v1/unload_model", {"model_id": model_id})


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
