"""Small direct calls to a Tinker API server that the tinker client does not offer."""

from __future__ import annotations

import json
import urllib.request


def _request(url: str, payload: dict | None = None, timeout: float = 30.0) -> dict:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def server_base_model(base_url: str) -> str:
    """The model the server was started with (get_server_capabilities)."""
    caps = _request(f"{base_url}/api/v1/get_server_capabilities")
    return caps["supported_models"][0]["model_name"]


def unload_model(base_url: str, model_id: str) -> None:
    """Free a model's LoRA slot now; SkyRL's jax backend has a fixed number of them."""
    _request(f"{base_url}/api/v1/unload_model", {"model_id": model_id})
