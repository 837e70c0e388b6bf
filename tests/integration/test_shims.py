"""rlcli's SkyRL shims against the SkyRL that the server venv really has.

Every check runs in one interpreter of the server venv (`checks` below): importing SkyRL and jax there costs
seconds, once instead of once per check. Each check runs as it would alone (the extension's own `python
rlcli_X.py`, run as __main__), its output and outcome kept apart; the checks that only look for their targets
come before the two that patch SkyRL (rlcli_samplers installs its wrappers, the engine-command shim applies
itself), so no check can find a target that an earlier one put there, and the LoRA exactness check (which
switches jax to float64) comes last.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rlcli.server import commands
from tests.conftest import shared_jax_cache_env, shared_server_venv

pytestmark = pytest.mark.server

CHECK = """
import importlib, sys
import skyrl_shims
for module, attr in skyrl_shims.PATCHED:
    assert callable(getattr(importlib.import_module(module), attr)), (module, attr)
skyrl_shims.apply_api_shims()
import skyrl.tinker.api as api
from skyrl.tinker.config import EngineConfig
cfg = EngineConfig(base_model="m", backend="jax")
cmd = api._build_uv_run_cmd_engine(["anything"], cfg)
assert cmd[0] == sys.executable and cmd[1].endswith("launcher.py") and cmd[2] == "engine", cmd
assert "--base-model" in cmd and "uv" not in cmd, cmd
print("shims ok")
"""

# The engine loads rlcli_wake before rlcli_fair: fair's check must find SkyRL's finders under wake's wrappers.
FAIR_AFTER_WAKE = """
import rlcli_fair, rlcli_wake
from skyrl.tinker.engine import TinkerEngine
rlcli_wake.look_for_pending_kinds(TinkerEngine)
assert TinkerEngine.find_single_requests.__wrapped__
rlcli_fair.check_targets()
print("fair finds the finders under wake's wrappers")
"""
INLINE = {"shims": CHECK, "fair_after_wake": FAIR_AFTER_WAKE}

# In this order (see the module's docstring); "shims" and "fair_after_wake" are INLINE above, the others are
# runtime/<name>.py. rlcli_no_torch last: its record imports the real peft (and torch) in this process.
ORDER = ["rlcli_lazy_torch", "rlcli_slots", "rlcli_wake", "rlcli_warmup", "rlcli_fair",
         "rlcli_samplers", "shims", "fair_after_wake", "rlcli_lora", "rlcli_no_torch"]
DRIVER = """
import contextlib, io, json, runpy, sys, traceback
runtime, inline, order = json.loads(sys.stdin.read())
sys.path.insert(0, runtime)
results = {}
for name in order:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            if name in inline:
                exec(compile(inline[name], name, "exec"), {"__name__": "__main__"})
            else:
                runpy.run_path(f"{runtime}/{name}.py", run_name="__main__")
        ok = True
    except BaseException:  # SystemExit included: a script's failure is its check's failure, not the others'
        ok = False
        out.write(traceback.format_exc())
    results[name] = {"ok": ok, "out": out.getvalue()}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def checks() -> dict[str, dict]:
    python = shared_server_venv() / "bin" / "python"
    job = json.dumps([str(commands.RUNTIME_DIR), INLINE, ORDER])
    proc = subprocess.run([str(python), "-c", DRIVER], input=job, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **shared_jax_cache_env()})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def passed(checks: dict[str, dict], name: str, words: str) -> bool:
    return checks[name]["ok"] and words in checks[name]["out"]


def test_engine_command_shim_targets_the_pinned_skyrl(checks):
    assert passed(checks, "shims", "shims ok"), checks["shims"]["out"][-2000:]


def test_slot_extension_targets_the_pinned_skyrl(checks):
    """runtime/rlcli_slots.py wraps JaxBackendImpl.create_model; fail here if SkyRL moves it."""
    assert passed(checks, "rlcli_slots", "present"), checks["rlcli_slots"]["out"][-2000:]


def test_wake_extension_targets_the_pinned_skyrl(checks):
    """runtime/rlcli_wake.py replaces the engine's loop, the API's future poller and its create_future, and wraps
    the engine's finders; fail here if SkyRL moves them, or if the one-statement submit and SkyRL's create_future,
    or a look with the pending types first and SkyRL's finders, or the engine's results rows and SkyRL's
    _complete_futures, part ways, or the submit routes stop answering 404 for unknown models (scratch sqlite)."""
    assert passed(checks, "rlcli_wake", "present"), checks["rlcli_wake"]["out"][-2000:]
    assert passed(checks, "rlcli_wake", "submit in one statement matches"), checks["rlcli_wake"]["out"][-2000:]
    assert passed(checks, "rlcli_wake", "finds what SkyRL's finders find"), checks["rlcli_wake"]["out"][-2000:]
    assert passed(checks, "rlcli_wake", "results rows match SkyRL's"), checks["rlcli_wake"]["out"][-2000:]
    assert passed(checks, "rlcli_wake", "a known model's row is read once"), checks["rlcli_wake"]["out"][-2000:]


def test_lazy_torch_extension_defers_torch_in_the_api(checks):
    """runtime/rlcli_lazy_torch.py: SkyRL's API imports without loading torch, torch loads on first use. First in
    ORDER: the check needs a process that has not imported torch yet."""
    assert passed(checks, "rlcli_lazy_torch", "torch loads on first use"), checks["rlcli_lazy_torch"]["out"][-2000:]


def test_per_sequence_lora_matches_the_stock_ragged_dot_path(checks):
    """runtime/rlcli_lora.py against SkyRL's own LoRA layers: values and gradients (float64 to 1e-12, float32 to
    1e-5) on a batch that mixes adapters and leaves slots unused."""
    assert passed(checks, "rlcli_lora", "matches SkyRL's ragged_dot path"), checks["rlcli_lora"]["out"][-2000:]


def test_sampler_extension_targets_the_pinned_skyrl(checks):
    """runtime/rlcli_samplers.py wraps JaxBackendImpl's sample, saves, optim_step and load; fail here if they move."""
    assert passed(checks, "rlcli_samplers", "present"), checks["rlcli_samplers"]["out"][-2000:]


def test_warmup_extension_targets_the_pinned_skyrl(checks):
    """runtime/rlcli_warmup.py wraps the jax backend's passes, create_model and the engine's run."""
    assert passed(checks, "rlcli_warmup", "present"), checks["rlcli_warmup"]["out"][-2000:]


def test_fair_extension_targets_the_pinned_skyrl(checks):
    """runtime/rlcli_fair.py chooses in TinkerEngine._load_requests, called by the engine's finders, which
    rlcli_wake (loaded first in the engine) has wrapped by then."""
    assert passed(checks, "rlcli_fair", "present"), checks["rlcli_fair"]["out"][-2000:]
    assert passed(checks, "fair_after_wake", "under wake's wrappers"), checks["fair_after_wake"]["out"][-2000:]


def test_a_failing_check_fails_only_its_own_test():
    """The driver itself: a script that exits non-zero is reported as failed, and the next one still runs."""
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bad.py").write_text("raise SystemExit('bad: target missing')\n")
        (Path(tmp) / "good.py").write_text("print('good: present')\n")
        job = json.dumps([tmp, {"shims": "print('shims ok')"}, ["bad", "good", "shims"]])
        proc = subprocess.run([sys.executable, "-c", DRIVER], input=job, capture_output=True, text=True, timeout=60)
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not results["bad"]["ok"] and "target missing" in results["bad"]["out"]
    assert passed(results, "good", "present") and passed(results, "shims", "shims ok")


def test_torch_free_engine_record_and_imports_hold_in_the_pinned_skyrl(checks):
    """runtime/rlcli_no_torch.py against the real peft and SkyRL: peft's adapter config varies with SkyRL's three
    inputs only and the record reproduces its text; SkyRL's jax engine uses peft only as LoraConfig + save; in a
    fresh process the prepared imports leave torch unloaded, load the embedded model's configuration and
    tokenizer, and save the real peft's exact text."""
    assert passed(checks, "rlcli_no_torch", "imports without torch"), checks["rlcli_no_torch"]["out"][-3000:]
