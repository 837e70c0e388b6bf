"""Never train on gradients a previous model left in a SkyRL jax LoRA slot.

SkyRL 0.4.0's jax backend clears a slot's gradient accumulator only in optim_step; a model
unloaded after a forward_backward with no optim_step leaves its gradients to the next model
that gets the slot (grad_norm ~5.4 on a zero-weight step: docs/upstream/slot-gradients.md). Servers
started by rlcli zero the accumulator on create_model (runtime/rlcli_backend.py), and say
so in GET /api/v1/rlcli/capabilities. For any other server, `ensure_clean_next_slot` scrubs
the slot the next create_model will take (SkyRL hands out the lowest free index): it creates
a throwaway model there, applies an optim_step at learning rate 0 (which consumes and clears
the accumulator without moving weights), and unloads it, so the real model gets a slot with
zero gradients and a fresh optimizer.
"""

from __future__ import annotations

import sys
import urllib.error

from rlcli.client import CAPABILITIES_ROUTE, request_json, wait_future
from rlcli.errors import RlcliError
from rlcli.server.runtime.shared import RLCLI


def _result(base_url: str, request_id: str) -> dict:
    try:
        return wait_future(base_url, request_id)
    except urllib.error.HTTPError as e:
        raise RlcliError(f"the server failed a slot-scrub request: HTTP {e.code} "
                         f"{e.read().decode(errors='replace')[:200]}") from None
    except TimeoutError:
        raise RlcliError("the server did not finish a slot-scrub request in time; is its engine running?") from None


def server_cleans_slots(base_url: str) -> bool:
    """True when the server runs rlcli's changes to SkyRL, the slot reset among them (asked, not assumed)."""
    try:
        caps = request_json(base_url + CAPABILITIES_ROUTE, timeout=10)
    except (OSError, ValueError):
        return False
    return RLCLI in caps.get("extensions", [])


def scrub_next_slot(base_url: str, base_model: str) -> float:
    """Consume whatever gradients sit in the next free slot; returns their norm (0.0: it was clean)."""
    session = request_json(f"{base_url}/api/v1/create_session", {"tags": ["rlcli-slot-scrub"], "sdk_version": "rlcli"})
    created = request_json(f"{base_url}/api/v1/create_model", {
        "session_id": session["session_id"], "base_model": base_model, "lora_config": {"rank": 1, "seed": 0}})
    _result(base_url, created["request_id"])
    try:
        step = request_json(f"{base_url}/api/v1/optim_step", {
            "model_id": created["model_id"],
            "adam_params": {"learning_rate": 0.0, "beta1": 0.0, "beta2": 0.0}})
        metrics = _result(base_url, step["request_id"]).get("metrics") or {}
    finally:
        unloaded = request_json(f"{base_url}/api/v1/unload_model", {"model_id": created["model_id"]})
        _result(base_url, unloaded["request_id"])
    return float(next((v for k, v in metrics.items() if "grad_norm" in k), 0.0))


def ensure_clean_next_slot(base_url: str, base_model: str) -> None:
    """Before a run creates its model: make sure that model cannot inherit stale gradients."""
    if server_cleans_slots(base_url):
        return
    leaked = scrub_next_slot(base_url, base_model)
    if leaked > 0:
        print(f"rlcli: cleared gradients (norm {leaked:.3g}) a previous model left in the server's next "
              "LoRA slot; the new model starts clean", file=sys.stderr)
