"""runtime/rlcli_no_torch.py's record, stand-in and import hook, on throwaway packages (no SkyRL, no peft).

The real thing (the pinned peft and SkyRL, a server's engine) is checked in tests/integration/test_shims.py and
test_fused_gspo.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rlcli.server import commands, server_venv
from tests.unit.test_tenant_fair_unit import runtime

MODULE = commands.RUNTIME_DIR / "rlcli_no_torch.py"


@pytest.fixture
def lean():
    return runtime("rlcli_no_torch")


RECORD = {"peft": "0.0.1", "transformers": "9.9", "made_by": "test",
          "config": {"base_model_name_or_path": "x", "r": 1, "lora_alpha": 2, "peft_type": "LORA", "z": None}}


def test_the_venv_install_writes_the_record_where_the_engine_reads_it(lean):
    assert server_venv.RECORD == lean.RECORD_NAME == lean.record_path().name


def test_stand_in_writes_the_recorded_fields_with_the_inputs_sorted_and_indented(lean, tmp_path):
    peft = lean.peft_stand_in(RECORD)
    peft.LoraConfig(base_model_name_or_path='m/"q"', r=16, lora_alpha=8.5).save_pretrained(tmp_path / "a")
    text = (tmp_path / "a" / "adapter_config.json").read_text()
    assert json.loads(text) == {**RECORD["config"], "base_model_name_or_path": 'm/"q"', "r": 16, "lora_alpha": 8.5}
    assert text.startswith('{\n  "base_model_name_or_path": "m/\\"q\\"",\n  "lora_alpha": 8.5,')
    assert RECORD["config"]["r"] == 1  # the record is not changed by a save
    with pytest.raises(TypeError):
        peft.LoraConfig("m", 16, 8)  # keywords only: what SkyRL passes, checked against its source
    (tmp_path / "file").write_text("")
    with pytest.raises(AssertionError, match="should be a directory"):
        peft.LoraConfig(base_model_name_or_path="m", r=1, lora_alpha=1).save_pretrained(tmp_path / "file")
    with pytest.raises(AttributeError, match="--no-extensions"):
        peft.get_peft_model  # noqa: B018
    assert peft.__version__ == "0.0.1"


def test_record_is_refused_when_missing_unreadable_or_for_other_versions(lean, tmp_path, monkeypatch):
    record_file = tmp_path / lean.RECORD_NAME
    assert lean.load_record(record_file)[0] is None and "rlcli serve install" in lean.load_record(record_file)[1]
    record_file.write_text("{not json")
    assert lean.load_record(record_file)[0] is None
    record_file.write_text(json.dumps(RECORD))
    monkeypatch.setattr(lean, "_version", {"peft": "0.0.1", "transformers": "9.9"}.get)
    assert lean.load_record(record_file) == (RECORD, "")
    monkeypatch.setattr(lean, "_version", {"peft": "0.0.2", "transformers": "9.9"}.get)
    record, why = lean.load_record(record_file)
    assert record is None and "peft 0.0.1" in why and "0.0.2" in why


# A fake transformers whose utils import is_torch_available from import_utils, as the real one does; fake peft too.
FAKE = {
    "transformers/__init__.py": "from .utils import is_torch_available\nHAS_TORCH = is_torch_available()\n",
    "transformers/utils/__init__.py": "from .import_utils import is_torch_available\n",
    "transformers/utils/import_utils.py": "def is_torch_available():\n    return True\n",
    "peft/__init__.py": "raise ImportError('the real peft must not be imported')\n",
}
PREPARED = """
import json, sys
sys.path.insert(0, sys.argv[1])
import rlcli_no_torch as lean, rlcli_lazy_torch
prepared = lean.prepare(lean.Path(sys.argv[2]))
import transformers, peft
print(json.dumps({"prepared": prepared, "mode": lean._state["mode"], "has_torch": transformers.HAS_TORCH,
                  "utils": transformers.utils.is_torch_available(), "peft": peft.__version__,
                  "torch_loaded": rlcli_lazy_torch.loaded("torch") if prepared else None}))
"""


def _installed() -> dict:
    """The versions the record is compared with in the child (the fakes have no metadata: this interpreter's own)."""
    from importlib import metadata

    found = {}
    for name in ("peft", "transformers"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _run_prepared(tmp_path, record: dict | None, **env) -> dict:
    for name, text in FAKE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    record_file = tmp_path / "record.json"
    if record is not None:
        record_file.write_text(json.dumps(record))
    proc = subprocess.run([sys.executable, "-c", PREPARED, str(commands.RUNTIME_DIR), str(record_file)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", **env})
    return {"out": proc.stdout, "err": proc.stderr, **(json.loads(proc.stdout) if proc.returncode == 0 else {})}


def test_prepared_process_sees_no_torch_and_gets_the_peft_stand_in(tmp_path):
    got = _run_prepared(tmp_path, {**RECORD, **_installed()})
    assert got.get("prepared") is True, got["err"]
    assert got["has_torch"] is False and got["utils"] is False and got["peft"] == _installed()["peft"]
    assert got["torch_loaded"] is False  # the stand-in for torch was never touched


def test_without_a_fitting_record_the_imports_stay_stock(tmp_path):
    got = _run_prepared(tmp_path, None)
    assert "peft" not in got and "the real peft must not be imported" in got["err"]  # stock: the real (fake) peft
    assert "no record of peft's LoraConfig" in got["err"]
    other = _run_prepared(tmp_path, {**RECORD, **_installed(), "transformers": "0.0.0-other"})
    assert "the real peft must not be imported" in other["err"] and "transformers 0.0.0-other" in other["err"]


def test_check_refuses_a_skyrl_that_uses_peft_otherwise(lean, tmp_path, monkeypatch):
    from tests.integration import server_checks  # its imports: the runtime folder (on sys.path: `lean`), stdlib

    good = textwrap.dedent("""
        import peft
        def save(path, name, cfg):
            peft_config = peft.LoraConfig(base_model_name_or_path=name, r=cfg.rank, lora_alpha=cfg.alpha)
            peft_config.save_pretrained(path)
    """)
    bad = good.replace("peft_config.save_pretrained(path)",
                       "peft_config.save_pretrained(path)\n    return peft_config.r")
    other = good.replace("peft.LoraConfig(", "peft.get_peft_model(")
    package = tmp_path / "fakeskyrl"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    (package / "models.py").write_text(good)
    server_checks.peft_uses_fit("fakeskyrl.models")
    for source in (bad, other):
        (package / "models.py").write_text(source)
        with pytest.raises(AssertionError):
            server_checks.peft_uses_fit("fakeskyrl.models")
