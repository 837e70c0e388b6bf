"""tinker 0.38's create_training_client_from_state on a team server (`serve start --tenants`): one load_weights that
names the caller's session instead of a model, which rlcli_sdk.create_by_load answers by creating the model.

The model such a load creates must become the caller's (the gate records it from the answer), or the caller could not
train or sample it; and a load of another tenant's state must be refused like every other cross-tenant access: 404,
in the words an id that does not exist gets. One server for the module (test_tenants.tenant_server: alice may hold
2 models, bob 1).
"""

from __future__ import annotations

import json

import pytest

from tests import sdk_scenario
from tests.conftest import shared_compile_cache
from tests.integration.test_tenants import call, tenant_server

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def team(tmp_path_factory, embedded_model):
    with tenant_server(shared_compile_cache(tmp_path_factory.mktemp("rlcli-from-state-home")), embedded_model,
                       []) as (srv, keys):
        yield srv, keys


@pytest.fixture(scope="module")
def alice_state(team):
    """alice's LoRA after one step, its state saved: (the state's path, the loss the saved model scores)."""
    import tinker

    srv, keys = team
    service = tinker.ServiceClient(base_url=srv.url, api_key=keys["alice"])
    trainer = service.create_lora_training_client(base_model=srv.model, rank=2, seed=0).result()
    trainer.forward_backward([sdk_scenario.datum(tinker)], "cross_entropy").result()
    trainer.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()
    path = trainer.save_state("alice-state").result().path
    assert path.startswith(f"tinker://{trainer.model_id}/weights/")
    return path, sdk_scenario.loss(tinker, trainer)


def test_a_tenant_makes_a_client_from_its_state_and_samples_it(team, alice_state):
    import tinker

    srv, keys = team
    path, saved_loss = alice_state
    service = tinker.ServiceClient(base_url=srv.url, api_key=keys["alice"])
    made = service.create_training_client_from_state(path).result()
    assert ":train:" in made.model_id  # created by the load (tinker 0.38's naming), not by create_model
    assert sdk_scenario.loss(tinker, made) == pytest.approx(saved_loss, rel=1e-3)
    sequences = sdk_scenario.sample(tinker, made.save_weights_and_get_sampling_client().result())
    ids = [s["sequence_id"] for s in sequences]
    assert all(isinstance(i, str) and i.startswith("sample-") for i in ids) and len(set(ids)) == 2, ids
    api = srv.url + "/api/v1"
    # the created model is alice's: listed for her, hidden from bob, and counted against her limit of 2 models
    runs = [r["training_run_id"] for r in call(f"{api}/training_runs", key=keys["alice"])[1]["training_runs"]]
    assert made.model_id in runs
    assert made.model_id not in json.dumps(call(f"{api}/training_runs", key=keys["bob"])[1])
    assert call(f"{api}/get_info", "POST", {"model_id": made.model_id}, key=keys["bob"])[0] == 404
    _, session, _ = call(f"{api}/create_session", "POST", {"tags": [], "sdk_version": "t"}, key=keys["alice"])
    third = {"session_id": session["session_id"], "base_model": srv.model, "lora_config": {"rank": 1, "seed": 0}}
    assert call(f"{api}/create_model", "POST", third, key=keys["alice"])[0] == 429


def test_another_tenant_cannot_make_a_client_from_that_state(team, alice_state):
    import tinker

    srv, keys = team
    path, _ = alice_state
    absent = "tinker://model_nothere/weights/alice-state"
    service = tinker.ServiceClient(base_url=srv.url, api_key=keys["bob"])
    refusals = {}
    for name, state in (("alice's", path), ("absent", absent)):
        with pytest.raises(tinker.NotFoundError) as refused:
            service.create_training_client_from_state(state).result()
        refusals[name] = (refused.value.status_code, refused.value.body)
    # the gate's answer to another tenant's id, word for word what an id that does not exist gets
    assert refusals["alice's"] == refusals["absent"] and refusals["absent"][0] == 404, refusals
    assert refusals["absent"][1] == {"detail": "Model not found"}, refusals
    # the same on the wire, as the SDK sends it: bob's own session, alice's checkpoint
    api = srv.url + "/api/v1"
    _, session, _ = call(f"{api}/create_session", "POST", {"tags": [], "sdk_version": "t"}, key=keys["bob"])
    load = {"session_id": session["session_id"], "model_seq_id": 0, "path": path, "optimizer": False}
    assert call(f"{api}/load_weights", "POST", load, key=keys["bob"])[:2] == (404, {"detail": "Model not found"})
    assert call(f"{api}/training_runs", key=keys["bob"])[1]["training_runs"] == []  # no model was made for bob


def test_a_load_refused_for_want_of_a_slot_does_not_count_against_the_tenants_limit(team):
    """bob may hold 1 model. While carol's models take every slot, each load of bob's state is refused for the
    slots, never for bob's limit (a refused model holds nothing); once a slot frees, his load is served. Before the
    endpoint's test, which revokes bob."""
    import tinker

    from rlcli.client import NO_FREE_SLOT

    srv, keys = team

    def unload(model_id: str, who: str) -> None:
        assert call(f"{srv.url}/api/v1/unload_model", "POST", {"model_id": model_id}, key=keys[who])[0] == 200
    bob = tinker.ServiceClient(base_url=srv.url, api_key=keys["bob"])
    trainer = bob.create_lora_training_client(base_model=srv.model, rank=1, seed=0).result()
    state = trainer.save_state("bob-state").result().path
    unload(trainer.model_id, "bob")  # bob holds none now
    carol, taken = tinker.ServiceClient(base_url=srv.url, api_key=keys["carol"]), []
    try:
        with pytest.raises(Exception, match=NO_FREE_SLOT):  # noqa: PT012 - however many slots are free
            for _ in range(4):
                taken.append(carol.create_lora_training_client(base_model=srv.model, rank=1).result().model_id)
        for _ in range(2):
            with pytest.raises(Exception, match=NO_FREE_SLOT):
                bob.create_training_client_from_state(state).result()
        unload(taken.pop(), "carol")
        made = bob.create_training_client_from_state(state).result()
        unload(made.model_id, "bob")
    finally:
        for model_id in taken:
            unload(model_id, "carol")


def test_the_endpoint_answers_each_tenant_from_its_own_weights(team, tmp_path):
    """`rlcli endpoint` over a --tenants server: a tenant's key is required, passed on to SkyRL (whose gate keeps
    each tenant to its own weights), and a revoked key is refused from the next request."""
    import tinker

    from rlcli.server.private import free_port
    from tests.conftest import run_rlcli
    from tests.integration.test_endpoint import post

    srv, keys = team
    service = tinker.ServiceClient(base_url=srv.url, api_key=keys["carol"])
    trainer = service.create_lora_training_client(base_model=srv.model, rank=2, seed=0).result()
    weights = trainer.save_weights_for_sampler("carol-weights").result().path
    started = run_rlcli("endpoint", "start", "--port", str(free_port()), "--capture", str(tmp_path / "capture"),
                        env=srv.env)
    assert started.returncode == 0, started.stderr
    chat = started.stdout.strip() + "/v1/chat/completions"
    ask = {"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}
    try:
        code, body, _ = post(chat, {**ask, "model": "base"})
        assert code == 401 and "tenant" in body["error"]["message"], body
        code, body, headers = post(chat, {**ask, "model": weights}, key=keys["carol"])
        assert code == 200 and headers["x-rlcli-weights"] == weights, body
        code, body, _ = post(chat, {**ask, "model": weights}, key=keys["bob"])
        assert code == 404 and body["error"]["code"] == "model_not_found", body
        assert post(chat, {**ask, "model": "base"}, key=keys["bob"])[0] == 200
        run_rlcli("tenant", "revoke", "bob", env=srv.env, check=True)
        assert post(chat, {**ask, "model": "base"}, key=keys["bob"])[0] == 401
    finally:
        run_rlcli("endpoint", "stop", env=srv.env)

