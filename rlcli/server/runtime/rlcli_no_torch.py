"""SkyRL's jax engine starts without importing torch (docs/decisions.md, "The jax engine imports without torch").

`prepare()`, before a process imports SkyRL's jax backend: a one-shot import hook makes transformers'
`is_torch_available` answer False, torch gets rlcli_lazy_torch's stand-in, and `peft` a stand-in whose LoraConfig
writes the adapter config from a record the real peft made at install (rlcli/server/peft_record.py, checked there to
reproduce peft's text byte for byte). Without a fitting record the engine imports as stock SkyRL does.
"""

from __future__ import annotations

import functools
import importlib.machinery
import json
import logging
import os
import sys
import types
from pathlib import Path

from shared import PEFT_RECORD as RECORD_NAME  # in the server venv's own folder (sys.prefix)

NAME = "rlcli_no_torch"
IMPORT_UTILS = "transformers.utils.import_utils"
CONFIG_FILE = "adapter_config.json"  # what peft's save_pretrained writes
INPUTS = ("base_model_name_or_path", "r", "lora_alpha")  # the keywords SkyRL passes

_state: dict = {"mode": None}


def log(message: str) -> None:
    # The launcher's supervisor copies this process's stderr into the server log.
    print(f"[{NAME}] {message}", file=sys.stderr, flush=True)


def record_path() -> Path:
    return Path(sys.prefix) / RECORD_NAME


def _version(distribution: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def load_record(path: Path | None = None) -> tuple[dict | None, str]:
    """The record and '' where it fits the installed peft and transformers; else None and why not."""
    path = path or record_path()
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None, f"no record of peft's LoraConfig in this venv ({path.name}; `rlcli serve install` writes it)"
    except (OSError, ValueError) as exc:
        return None, f"the record {path.name} cannot be read ({exc})"
    for distribution in ("peft", "transformers"):
        installed = _version(distribution)
        if record.get(distribution) != installed:
            return None, (f"the record was made with {distribution} {record.get(distribution)}, this venv has "
                          f"{installed}: the next `rlcli serve start` records it again")
    return record, ""


def render(record: dict, values: dict) -> str:
    """The text of adapter_config.json for these inputs: the recorded fields with the inputs set."""
    return json.dumps({**record["config"], **values}, indent=2, sort_keys=True)


class _TorchAbsentForTransformers:
    """A sys.meta_path finder for transformers' import_utils alone, used once: it runs the module, then makes its
    is_torch_available answer False before the rest of transformers imports the name from it."""

    def find_spec(self, name, path, target=None):
        if name != IMPORT_UTILS:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.is_torch_available = _torch_absent

        spec.loader.exec_module = exec_module
        return spec


def _torch_absent() -> bool:
    return False


_torch_absent.cache_clear = lambda: None  # transformers' own is an lru_cache; callers may clear it


def peft_stand_in(record: dict) -> types.ModuleType:
    """A module named peft with the one class SkyRL's jax backend uses."""
    import importlib.util

    class LoraConfig:
        """Writes the adapter_config.json peft's LoraConfig writes for these inputs (from the venv's record)."""

        def __init__(self, *, base_model_name_or_path, r, lora_alpha):
            self.values = {"base_model_name_or_path": base_model_name_or_path, "r": r, "lora_alpha": lora_alpha}

        def save_pretrained(self, save_directory) -> None:
            folder = os.fspath(save_directory)
            if os.path.isfile(folder):
                raise AssertionError(f"Provided path ({folder}) should be a directory, not a file")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, CONFIG_FILE), "w") as out:
                out.write(render(record, self.values))

    module = types.ModuleType("peft", "rlcli_no_torch's stand-in for peft (LoraConfig.save_pretrained only)")
    spec = importlib.util.find_spec("peft")
    module.__spec__ = spec
    module.__file__ = spec.origin if spec else None
    module.__version__ = record["peft"]
    module.LoraConfig = LoraConfig

    def __getattr__(attr):
        raise AttributeError(f"{NAME}: peft.{attr} is not in the torch-free jax engine (only LoraConfig is); "
                             "start the server with --no-extensions for the real peft")

    module.__getattr__ = __getattr__
    return module


def prepare(record_file: Path | None = None) -> bool:
    """Before SkyRL's jax backend is imported: keep torch out of this process. False: stock imports (why: logged)."""
    if _state["mode"] is not None:
        return _state["mode"] == "prepared"
    early = [name for name in ("torch", "transformers", "peft") if name in sys.modules]
    if early:
        _state["mode"] = f"stock ({', '.join(early)} imported before the engine)"
        log(f"{_state['mode']}: nothing changed")
        return False
    record, why = load_record(record_file)
    if record is None:
        _state["mode"] = f"stock: {why}"
        log(f"the engine imports torch as stock SkyRL does: {why}")
        return False
    import rlcli_lazy_torch

    sys.meta_path.insert(0, _TorchAbsentForTransformers())
    # transformers says at import that without torch it has no models; true, and this engine needs none of them.
    logging.getLogger("transformers").addFilter(lambda entry: not str(entry.msg).startswith("PyTorch was not found"))
    rlcli_lazy_torch.defer("torch")
    sys.modules["peft"] = peft_stand_in(record)
    _state["mode"] = "prepared"
    log("the jax engine imports without torch (transformers sees none; peft's LoraConfig from the venv's record)")
    return True


@functools.cache
def describe() -> dict:
    """What the capabilities route says (API process: the venv's record decides the engine's case). Read once."""
    record, why = load_record()
    if record is None:
        return {"engine_imports": f"torch imported at start (stock): {why}"}
    return {"engine_imports": "without torch: transformers loads as if torch were absent, torch is imported on "
                              f"first use, peft's LoraConfig is written from the record of peft {record['peft']}"}
