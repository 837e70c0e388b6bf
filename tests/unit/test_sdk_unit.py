"""What today's tinker SDKs need of the server, without SkyRL (runtime/rlcli_sdk.py, the tenant gate's part in it);
the real server answers the client venv's tinker (the newest) and the oldest locked SDK in
tests/integration/test_sdk_compat.py."""

from __future__ import annotations

from pathlib import Path

from rlcli import locks
from tests.unit.test_tenant_fair_unit import runtime

REPO = Path(__file__).resolve().parents[2]


def test_sequence_ids_name_the_request_and_each_samples_place():
    sdk = runtime("rlcli_sdk")
    assert sdk.sequence_ids("41", 3) == ["sample-41-0", "sample-41-1", "sample-41-2"]
    assert sdk.sequence_ids("41", 0) == []
    assert not set(sdk.sequence_ids("4", 12)) & set(sdk.sequence_ids("41", 2))  # distinct across requests


def test_a_created_models_id_is_the_one_tinker_038_derives():
    # tinker 0.38's service_client: model_id = f"{session_id}:train:{model_seq_id}"
    assert runtime("rlcli_sdk").created_model_id("session_ab12", 3) == "session_ab12:train:3"


def test_the_tenant_gate_counts_a_load_that_names_a_session_as_a_new_model():
    creates = runtime("rlcli_tenants")._creates_model
    assert creates("/api/v1/create_model", {"session_id": "s"})
    assert creates("/api/v1/load_weights", {"session_id": "s", "model_seq_id": 2, "path": "tinker://m/weights/c"})
    assert not creates("/api/v1/load_weights", {"model_id": "m", "path": "tinker://m/weights/c"})
    assert not creates("/api/v1/load_weights", None) and not creates("/api/v1/forward_backward", {"session_id": "s"})


def test_the_oldest_supported_sdk_is_locked_apart_from_the_client_venv():
    oldest, client = locks.pins(REPO / "env/compat-oldest.lock"), locks.pins(REPO / "env/client.lock")
    assert oldest["tinker"] == "0.25.0" and client["tinker"] == "0.38.0"
    assert "rlcli" not in oldest and "tinker-cookbook" not in oldest  # the SDK alone, as an application has it


def test_checkpoint_routes_take_skyrls_ids_and_the_ids_a_load_creates_only():
    import re

    pattern = re.compile(runtime("rlcli_sdk").MODEL_ID_PATTERN)
    assert pattern.match("model_ab12") and pattern.match("session_ab12:train:3")
    for refused in ("session:train:", "a:b", "../x", "s:train:1/x", "s:sample:1", ""):
        assert not pattern.match(refused), refused
