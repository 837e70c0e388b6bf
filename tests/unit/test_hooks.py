"""rlcli.train.hooks: every hook into tinker and tinker-cookbook fits the pinned versions, and says so loudly
when it does not."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from rlcli.errors import RlcliError
from rlcli.train import hooks

REPO = Path(__file__).resolve().parents[2]


def test_pins_are_pyprojects():
    """A pin bump in pyproject.toml fails here until hooks.PINS (and so the hooks) have been looked at."""
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for package, spec in hooks.PINS.items():
        assert f"{package}{spec}" in dependencies, f"pyproject.toml pins {package} otherwise than hooks.PINS"


def test_installed_versions_are_the_pinned_ones():
    assert hooks.version_drift() == []


def test_every_patched_name_is_where_the_hooks_expect_it():
    assert hooks.problems() == []


def test_a_moved_name_stops_the_run_with_its_name(monkeypatch):
    from tinker_cookbook.utils import ml_log

    monkeypatch.delattr(ml_log, "configure_logging_module")
    assert hooks.problems() == ["tinker_cookbook.utils.ml_log.configure_logging_module is gone "
                                "(cookbook_logging: console to warnings)"]
    with pytest.raises(RlcliError, match="ml_log.configure_logging_module is gone"):
        hooks.check()


def test_a_relied_on_text_that_left_the_source_is_named(monkeypatch):
    monkeypatch.setattr(hooks, "PATCHES", (hooks.Patch("tinker_cookbook.rl.train", "main", "why", ("no such text",)),))
    assert hooks.problems() == ["tinker_cookbook.rl.train no longer holds 'no such text' (why)"]


def test_hooks_put_back_what_they_replace():
    import tinker
    from tinker_cookbook.rl import train
    from tinker_cookbook.utils import ml_log

    from rlcli.problems.score import HeldOutEvaluator

    before = (tinker.TrainingClient.__init__, train.tqdm, ml_log.setup_logging, ml_log.configure_logging_module,
              train.RLTestSetEvaluator)
    with (hooks.on_training_client(print), hooks.quiet_rl_sampling(), hooks.cookbook_logging(object()),
          hooks.capped_evaluation()):
        assert tinker.TrainingClient.__init__ is not before[0] and train.tqdm is not before[1]
        assert ml_log.setup_logging is not before[2] and ml_log.configure_logging_module is not before[3]
        assert train.RLTestSetEvaluator is HeldOutEvaluator
    assert (tinker.TrainingClient.__init__, train.tqdm, ml_log.setup_logging,
            ml_log.configure_logging_module, train.RLTestSetEvaluator) == before


def test_cookbook_runs_hide_tinkers_deprecations_of_the_cookbooks_calls_only():
    """Inside cookbook_logging a FutureWarning raised at a tinker_cookbook module's call is dropped; one raised at
    rlcli's own code (which must call the replacements) still shows, and so does any other warning category."""
    import warnings

    def warn(module: str, category: type[Warning] = FutureWarning) -> None:
        warnings.warn_explicit("DEPRECATED: x_async()", category, "f.py", 1, module=module)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with hooks.cookbook_logging(object()):
            warn("tinker_cookbook.checkpoint_utils")
            warn("tinker_cookbook")
            warn("rlcli.train.run")
            warn("tinker_cookbook.rl.train", UserWarning)
        warn("tinker_cookbook.completers")  # outside the block: shown
    assert [(w.category, w.filename) for w in seen] == [(FutureWarning, "f.py"), (UserWarning, "f.py"),
                                                         (FutureWarning, "f.py")]


def test_a_save_the_server_refuses_is_one_line_and_leaves_no_record(tmp_path, monkeypatch):
    import asyncio

    from tinker_cookbook import checkpoint_utils

    from rlcli.train.run import save_failed_message

    (tmp_path / "checkpoints.jsonl").write_text('{"name": "000002", "state_path": "tinker://m/weights/000002"}\n')

    async def refused(training_client, name, log_path, loop_state, **kwargs):
        raise ValueError("Error retrieving result: Error code: 400 - {'detail': '[Errno 28] No space left on "
                         "device'} (status 400) for self.request_id='16' — exceeded 3 retries")

    monkeypatch.setattr(checkpoint_utils, "save_checkpoint_async", refused)
    with hooks.failed_saves(save_failed_message(tmp_path)), pytest.raises(RlcliError) as raised:
        asyncio.run(checkpoint_utils.save_checkpoint_async(training_client=None, name="000004",
                                                           log_path=str(tmp_path), loop_state={}))
    assert str(raised.value).startswith("the server could not save checkpoint 000004 ([Errno 28] No space left on "
                                        "device); nothing was recorded for it and the last good checkpoint is 000002")
    assert f"--log-path {tmp_path} --resume" in str(raised.value)
    assert checkpoint_utils.save_checkpoint_async is refused  # put back


def test_the_rl_loops_save_for_its_next_step_refused_is_one_line_too(tmp_path, monkeypatch):
    import asyncio

    import tinker

    from rlcli.train.run import save_failed_message

    async def refused():
        raise ValueError("Error retrieving result: Error code: 400 - {'detail': '[Errno 28] No space left on "
                         "device'} (status 400) for self.request_id='9' — exceeded 3 retries")

    class Client:  # the recipe calls the deprecated _async method; the hook awaits the one that replaces it
        def save_weights_and_get_sampling_client(self):
            return refused()

    original = tinker.TrainingClient.save_weights_and_get_sampling_client_async
    with hooks.failed_saves(save_failed_message(tmp_path)), pytest.raises(RlcliError) as raised:
        asyncio.run(tinker.TrainingClient.save_weights_and_get_sampling_client_async(Client()))
    assert str(raised.value).startswith("the server could not save the sampler weights to sample from ([Errno 28]")
    assert "no checkpoint was saved before it" in str(raised.value)
    assert tinker.TrainingClient.save_weights_and_get_sampling_client_async is original


def test_the_servers_reason_for_a_full_disk_is_one_phrase_however_it_is_worded():
    orbax = ("Error retrieving result: Error code: 400 - {'detail': 'RESOURCE_EXHAUSTED: Error writing \"x\" in OCDBT "
             "database: Failed to write 696237 bytes to file 15: No space left on device [os_error_code=28]'} "
             "(status 400) for self.request_id='16' — exceeded 3 retries")
    assert hooks.server_reason(ValueError(orbax)) == "[Errno 28] No space left on device"
    other = "Error retrieving result: Error code: 400 - {'detail': 'Model 'm' not loaded'} (status 400)"
    assert hooks.server_reason(ValueError(other)) == "Model 'm' not loaded"
