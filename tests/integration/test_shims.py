"""rlcli's SkyRL shims against the SkyRL that the server venv really has."""

from __future__ import annotations

import subprocess

import pytest

from rlcli.server import commands
from tests.conftest import shared_server_venv

pytestmark = pytest.mark.server

CHECK = """
import importlib, sys
sys.path.insert(0, {runtime!r})
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


def test_engine_command_shim_targets_the_pinned_skyrl():
    python = shared_server_venv() / "bin" / "python"
    code = CHECK.format(runtime=str(commands.RUNTIME_DIR))
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "shims ok" in proc.stdout, proc.stderr[-2000:]


def test_slot_extension_targets_the_pinned_skyrl():
    """runtime/rlcli_slots.py wraps JaxBackendImpl.create_model; fail here if SkyRL moves it."""
    python = shared_server_venv() / "bin" / "python"
    script = commands.RUNTIME_DIR / "rlcli_slots.py"
    proc = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "present" in proc.stdout, proc.stderr[-2000:]


def test_wake_extension_targets_the_pinned_skyrl():
    """runtime/rlcli_wake.py replaces the engine's loop and the API's future poller; fail here if SkyRL moves them."""
    python = shared_server_venv() / "bin" / "python"
    script = commands.RUNTIME_DIR / "rlcli_wake.py"
    proc = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "present" in proc.stdout, proc.stderr[-2000:]


def test_per_sequence_lora_matches_the_stock_ragged_dot_path():
    """runtime/rlcli_lora.py against SkyRL's own LoRA layers: values and gradients (float64 to 1e-12, float32 to
    1e-5) on a batch that mixes adapters and leaves slots unused."""
    python = shared_server_venv() / "bin" / "python"
    script = commands.RUNTIME_DIR / "rlcli_lora.py"
    proc = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "matches SkyRL's ragged_dot path" in proc.stdout, proc.stderr[-2000:]


def test_sampler_extension_targets_the_pinned_skyrl():
    """runtime/rlcli_samplers.py wraps JaxBackendImpl's sample, saves, optim_step and load; fail here if they move."""
    python = shared_server_venv() / "bin" / "python"
    script = commands.RUNTIME_DIR / "rlcli_samplers.py"
    proc = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "present" in proc.stdout, proc.stderr[-2000:]


def test_warmup_extension_targets_the_pinned_skyrl():
    """runtime/rlcli_warmup.py wraps the jax backend's passes, create_model and the engine's run."""
    python = shared_server_venv() / "bin" / "python"
    script = commands.RUNTIME_DIR / "rlcli_warmup.py"
    proc = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "present" in proc.stdout, proc.stderr[-2000:]


def test_fair_extension_targets_the_pinned_skyrl():
    """runtime/rlcli_fair.py chooses in TinkerEngine._load_requests, called by the engine's finders."""
    python = shared_server_venv() / "bin" / "python"
    script = commands.RUNTIME_DIR / "rlcli_fair.py"
    proc = subprocess.run([str(python), str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "present" in proc.stdout, proc.stderr[-2000:]
