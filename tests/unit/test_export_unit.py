"""`rlcli export`'s archive handling and adapter config: pure logic, no server (the exports themselves are
checked against a real server in tests/integration/test_weights_out.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from rlcli.errors import RlcliError


def _archive(tmp_path: Path, entries: list[tarfile.TarInfo]) -> Path:
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(b"{}") if info.isfile() else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = 2
    return info


def test_extraction_takes_the_adapter_files_and_skips_the_root_entry(tmp_path):
    from rlcli.export import extract_adapter

    root = tarfile.TarInfo("/")
    root.type = tarfile.DIRTYPE
    archive = _archive(tmp_path, [root, _file("adapter_config.json"), _file("adapter_model.safetensors")])
    (tmp_path / "out").mkdir()
    extract_adapter(archive, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]


@pytest.mark.parametrize("evil", ["../adapter_config.json", "/etc/adapter_config.json", "sub/adapter_config.json",
                                  "link"])
def test_extraction_refuses_traversal_and_links(tmp_path, evil):
    from rlcli.export import extract_adapter

    if evil == "link":
        entry = tarfile.TarInfo("adapter_config.json")
        entry.type, entry.linkname = tarfile.SYMTYPE, "/etc/passwd"
    else:
        entry = _file(evil)
    (tmp_path / "out").mkdir()
    with pytest.raises(RlcliError, match="unexpected entry"):
        extract_adapter(_archive(tmp_path, [entry, _file("adapter_model.safetensors")]), tmp_path / "out")
    assert not (tmp_path / "adapter_config.json").exists() and not (tmp_path / "out" / "adapter_config.json").exists()


def test_adapter_config_names_every_adapted_module():
    from rlcli.export import adapter_config

    names = [f"base_model.model.model.layers.{i}.{part}.lora_{ab}.weight" for i in range(2) for ab in "AB"
             for part in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj")]
    config = adapter_config({"r": 8, "target_modules": None, "base_model_name_or_path": "/srv/m"}, names, "org/m")
    assert config["target_modules"] == ["down_proj", "o_proj", "q_proj"]
    assert config["base_model_name_or_path"] == "org/m" and config["task_type"] == "CAUSAL_LM"
