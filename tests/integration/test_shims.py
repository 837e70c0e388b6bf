"""rlcli's changes to SkyRL against the SkyRL the server venv really has: the manifest's targets and versions, and
behavioural checks of each change against SkyRL's own code (tests/integration/server_checks.py).

Every check runs in one interpreter of the server venv (importing SkyRL and jax there costs seconds, once instead of
once per check), each with its output and outcome kept apart, in ORDER: the lazy-torch check first (it needs a
process that has not imported torch), the LoRA exactness check (which switches jax to float64) and the torch-free
engine's (its record imports the real peft and torch) last.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from rlcli.server import commands
from tests.conftest import shared_jax_cache_env, shared_server_venv

pytestmark = pytest.mark.server

CHECKS = Path(__file__).with_name("server_checks.py")
ORDER = ["lazy_torch", "manifest", "submit", "look", "results", "model_checks", "engine_command", "decode", "lora",
         "no_torch"]
DRIVER = """
import contextlib, importlib.util, io, json, sys, traceback
runtime, checks, order = json.loads(sys.stdin.read())
sys.path.insert(0, runtime)
spec = importlib.util.spec_from_file_location("server_checks", checks)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
results = {}
for name in order:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            print(getattr(module, f"check_{name}")())
        ok = True
    except BaseException:  # SystemExit included: a check's failure is its own, not the others'
        ok = False
        out.write(traceback.format_exc())
    results[name] = {"ok": ok, "out": out.getvalue()}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def checks() -> dict[str, dict]:
    python = shared_server_venv() / "bin" / "python"
    job = json.dumps([str(commands.RUNTIME_DIR), str(CHECKS), ORDER])
    proc = subprocess.run([str(python), "-c", DRIVER], input=job, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **shared_jax_cache_env()})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def passed(checks: dict[str, dict], name: str, words: str) -> bool:
    return checks[name]["ok"] and words in checks[name]["out"]


def test_every_target_of_the_manifest_is_in_the_pinned_skyrl_and_every_override_is_listed(checks):
    """manifest.py against the installed SkyRL and jax; the methods of rlcli_engine's and rlcli_backend's classes
    that override SkyRL's are exactly the manifest's overrides, and TenantsEngine's method order is declared."""
    assert passed(checks, "manifest", "overrides listed"), checks["manifest"]["out"][-2000:]


def test_engine_command_targets_the_pinned_skyrl(checks):
    assert passed(checks, "engine_command", "rlcli's launcher"), checks["engine_command"]["out"][-2000:]


def test_one_statement_submit_matches_skyrls_create_future(checks):
    """A new request, an SDK retry, a reused seq_id, no seq_id and a staged write, on scratch sqlite databases."""
    assert passed(checks, "submit", "submit in one statement matches"), checks["submit"]["out"][-2000:]


def test_a_look_with_pending_types_first_finds_what_skyrls_finders_find(checks):
    """With --tenants and one tenant too: the round-robin sits on top of the looks (method resolution order)."""
    assert passed(checks, "look", "finds what SkyRL's finders find"), checks["look"]["out"][-2000:]


def test_the_engines_results_rows_match_skyrls_complete_futures(checks):
    assert passed(checks, "results", "results rows match SkyRL's"), checks["results"]["out"][-2000:]


def test_a_known_models_row_is_read_once_by_the_submit_routes(checks):
    assert passed(checks, "model_checks", "a known model's row is read once"), checks["model_checks"]["out"][-2000:]


def test_lazy_torch_defers_torch_in_the_api(checks):
    """runtime/rlcli_lazy_torch.py: SkyRL's API imports without loading torch, torch loads on first use."""
    assert passed(checks, "lazy_torch", "torch loads on first use"), checks["lazy_torch"]["out"][-2000:]


def test_per_sequence_lora_matches_the_stock_ragged_dot_path(checks):
    """runtime/rlcli_lora.py against SkyRL's own LoRA layers: values and gradients (float64 to 1e-12, float32 to
    1e-5) on a batch that mixes adapters and leaves slots unused."""
    assert passed(checks, "lora", "matches SkyRL's ragged_dot path"), checks["lora"]["out"][-2000:]


def test_greedy_decode_matches_skyrls_decode_loop(checks):
    """runtime/rlcli_decode.py against SkyRL's own decode program: tokens, stop reasons and logprobs bit for bit;
    greedy, drawn, filtered and mixed batches, ragged prompts, stop tokens."""
    assert passed(checks, "decode", "matches SkyRL's bit for bit"), checks["decode"]["out"][-2000:]


def test_a_failing_check_fails_only_its_own_test(tmp_path):
    """The driver itself: a check that raises is reported as failed, and the next one still runs."""
    import sys

    script = tmp_path / "checks.py"
    script.write_text("def check_bad():\n    raise SystemExit('bad: target missing')\n\n"
                      "def check_good():\n    return 'good: present'\n")
    job = json.dumps([str(tmp_path), str(script), ["bad", "good"]])
    proc = subprocess.run([sys.executable, "-c", DRIVER], input=job, capture_output=True, text=True, timeout=60)
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not results["bad"]["ok"] and "target missing" in results["bad"]["out"]
    assert passed(results, "good", "present")


def test_torch_free_engine_record_and_imports_hold_in_the_pinned_skyrl(checks):
    """runtime/rlcli_no_torch.py against the real peft and SkyRL: peft's adapter config varies with SkyRL's three
    inputs only and the record reproduces its text; SkyRL's jax engine uses peft only as LoraConfig + save; in a
    fresh process the prepared imports leave torch unloaded, load the embedded model's configuration and
    tokenizer, and save the real peft's exact text."""
    assert passed(checks, "no_torch", "imports without torch"), checks["no_torch"]["out"][-3000:]
