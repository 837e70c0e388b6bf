"""runtime/rlcli_warmup.py's shape file and runtime/pins.py's check, without SkyRL (the replay itself runs in
tests/integration/test_serve.py, on a real restart)."""

from __future__ import annotations

import importlib.util

import pytest

from rlcli.server import commands


def _runtime(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", commands.RUNTIME_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recorded_shapes_survive_a_restart_and_the_least_used_are_dropped(tmp_path):
    warmup = _runtime("rlcli_warmup")
    path = tmp_path / "shapes.json"
    shapes = {f"forward_backward:{b}:64": b for b in range(1, warmup.MAX_RECORDED + 6)}
    warmup.save(path, shapes)
    kept = warmup.load(path)
    assert len(kept) == warmup.MAX_RECORDED and "forward_backward:1:64" not in kept
    assert kept[f"forward_backward:{warmup.MAX_RECORDED + 5}:64"] == warmup.MAX_RECORDED + 5
    assert not list(tmp_path.glob(".*tmp"))  # written through a temporary file, renamed into place


def test_an_unreadable_or_foreign_shape_file_means_no_warm_up(tmp_path):
    warmup = _runtime("rlcli_warmup")
    assert warmup.load(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert warmup.load(tmp_path / "bad.json") == {}
    (tmp_path / "odd.json").write_text('{"shapes": {"sample:1:32": 3, "forward:2:32": 1}}')
    assert warmup.load(tmp_path / "odd.json") == {"forward:2:32": 1}  # only kinds it knows how to replay


def test_each_model_and_config_has_its_own_shape_file(monkeypatch, tmp_path):
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path))
    a = commands.warmup_file("/m", "jax", {"max_lora_adapters": 5})
    assert a == commands.warmup_file("/m", "jax", {"max_lora_adapters": 5})
    assert a != commands.warmup_file("/m", "jax", {"max_lora_adapters": 8})
    assert a != commands.warmup_file("/other", "jax", {"max_lora_adapters": 5})
    assert a.parent == tmp_path / "cache" / "warmup" and oct(a.parent.stat().st_mode & 0o777) == "0o700"


def test_a_missing_target_stops_the_extension_naming_it():
    pins = _runtime("pins")
    pins.require("x", {"here": len, "checked": True})
    with pytest.raises(RuntimeError, match=r"x: this SkyRL lacks gone, fact; it is not the version rlcli pins"):
        pins.require("x", {"here": len, "gone": None, "fact": False})
