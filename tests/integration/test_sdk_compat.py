"""The oldest and the newest tinker SDK rlcli supports, each from its own venv, against the real server: a LoRA,
forward_backward, optim_step, sampler weights and samples, save_state, load_state, a client from the saved state, the
checkpoints listed (tests/sdk_scenario.py). The client venv holds the newest (0.38); the oldest (env/compat-oldest.lock,
0.25) gets a venv of its own (tests/sdk_clients.py), built once per lock: `make compat-venv` (CI's .ci/run) or this
test's first run.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests import sdk_clients

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def oldest_python() -> str:
    try:
        venv = sdk_clients.ensure_compat_venv()
    except sdk_clients.CannotBuild as e:
        why = (f"the oldest tinker SDK's venv could not be built from env/compat-oldest.lock ({e}): "
               "run `make compat-venv`")
        if os.environ.get("CI"):  # CI reaches the package index: the test must run there
            pytest.fail(why)
        pytest.skip(why)
    return str(venv / "bin" / "python")


def assert_round_trip(report: dict, version: str) -> None:
    assert report["ok"], f"tinker {report.get('tinker')} failed after {report.get('failed_after')}: " \
                         f"{report.get('error')}\n{report.get('traceback', '')[-1500:]}"
    assert report["tinker"] == version and report["exit"] == 0
    steps = report["steps"]
    assert steps["load_state"]["loaded"] == pytest.approx(steps["load_state"]["saved"], rel=1e-3)
    assert steps["training_client_from_state"] == pytest.approx(steps["load_state"]["saved"], rel=1e-3)
    assert {"compat-sampler", "compat-state"} <= set(steps["list_checkpoints"])
    assert all(len(s["tokens"]) > 0 for s in steps["sample"] + steps["sample_again"])


def test_the_oldest_supported_sdk_trains_samples_saves_and_loads(server, oldest_python):
    report = sdk_clients.run_scenario(oldest_python, server.url, server.model, server.env)
    assert_round_trip(report, sdk_clients.locked_version())
    assert report["tinker"] == "0.25.0"


def test_the_newest_supported_sdk_trains_samples_saves_and_loads(server):
    from importlib import metadata

    report = sdk_clients.run_scenario(sys.executable, server.url, server.model, server.env)
    assert_round_trip(report, metadata.version("tinker"))
    assert report["tinker"].startswith("0.38.")
    # 0.26 and later stamp the ids the server fixed at submission: one per sample, distinct, in the answer's order
    for key in ("sample", "sample_again"):
        ids = [s["sequence_id"] for s in report["steps"][key]]
        assert len(set(ids)) == 2 and all(i.startswith("sample-") for i in ids), ids
        request = {i.rsplit("-", 1)[0] for i in ids}
        assert len(request) == 1 and [i.rsplit("-", 1)[1] for i in ids] == ["0", "1"], ids
    # tinker 0.38 made the client from the saved state with one load_weights, which created the model
    assert any(":train:" in m for m in report["models"]), report["models"]


def test_a_model_made_from_a_saved_state_has_its_checkpoints_listed_downloaded_and_deleted(server, tmp_path,
                                                                                          monkeypatch):
    """tinker 0.38 names the model create_training_client_from_state makes `<session>:train:<seq>`; SkyRL's
    checkpoint routes refused that id (a 422: `rlcli export` and the loop's promote of a run that started from a
    checkpoint); rlcli_sdk serves them with a pattern that takes it."""
    import tinker

    from rlcli.client import unload_model
    from rlcli.export import download_archive

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    service = tinker.ServiceClient(base_url=server.url)
    first = service.create_lora_training_client(base_model=server.model, rank=4, seed=0).result()
    made = None
    try:
        state = first.save_state("compat-from").result().path
        made = service.create_training_client_from_state(state).result()
        assert ":train:" in made.model_id
        made.save_weights_for_sampler(name="compat-made").result()
        rest = tinker.RestClient(base_url=server.url)
        listed = rest.list_checkpoints(made.model_id).result()
        assert [c.checkpoint_id for c in listed.checkpoints] == ["compat-made"]
        download_archive(server.url, made.model_id, "compat-made", tmp_path / "made.tar.gz")
        assert (tmp_path / "made.tar.gz").stat().st_size > 0
        rest.delete_checkpoint(made.model_id, "sampler_weights/compat-made").result()
        assert rest.list_checkpoints(made.model_id).result().checkpoints == []
    finally:
        for client in (first, made):
            if client is not None:
                unload_model(server.url, client.model_id)
