"""rlcli server extension: SkyRL's jax engine starts without importing torch.

Runs INSIDE the server venv (Python 3.12): standard library only at import. The launcher calls `prepare()` in
the processes that import SkyRL's jax backend (the preloaded engine, the engine, the jax worker processes)
BEFORE they import it, when RLCLI_SERVER_EXTENSIONS names this module (`rlcli serve start` does, unless
--no-extensions); `register(role)` then only says what was done.

Why: the jax engine computes with jax, yet importing it loaded torch three ways, ~9 of its ~14 s of import CPU
on a 2-core machine, and a warm `serve start` waits for those imports (docs/decisions.md, "The jax engine
imports without torch"):
- transformers (`AutoConfig`, `AutoTokenizer`) decides at import whether torch is installed, and when it is,
  imports its torch-only modules (generation's logits processors, masking, FSDP helpers, torch._dynamo);
- SkyRL's `backends/renderer.py` imports torch at its top for functions the jax engine does not call;
- SkyRL's `tx/utils/models.py` imports peft, which imports torch and transformers' model classes, for one
  use: `peft.LoraConfig(base_model_name_or_path=..., r=..., lora_alpha=...).save_pretrained(folder)`, which
  writes an adapter's `adapter_config.json` when a LoRA checkpoint is saved.

How, in the prepared process:
- a one-shot import hook makes `transformers.utils.import_utils.is_torch_available` answer False, so
  transformers loads as it does where torch is absent (configurations and tokenizers work; models do not,
  and the jax engine builds none of transformers' models);
- torch gets rlcli_lazy_torch's stand-in: `import torch` is free, the first use imports it;
- `peft` is a small stand-in whose `LoraConfig` accepts those three keywords and writes the file from a record
  made with the real peft when the venv is installed (`python rlcli_no_torch.py record`, run by `rlcli serve
  install`): every field peft writes, checked at recording to vary with those three inputs only, and the
  stand-in's text checked there to be byte-identical to peft's for two different sets of inputs. The record
  names the peft and transformers versions it was made with; where it is missing or either version differs,
  the engine imports as stock SkyRL does (and says so in the log).
RLCLI_ENGINE_TORCH=1 in `serve start`'s environment keeps the stock imports.

`python rlcli_no_torch.py` checks in this venv, without writing anything: the record's premises against the
real peft, that SkyRL's jax engine uses peft only as above, and, in a fresh process, that the prepared imports
leave torch unloaded, load the embedded-style configuration and tokenizer, and save peft's exact text.
"""

from __future__ import annotations

import importlib.machinery
import json
import logging
import os
import sys
import tempfile
import types
from pathlib import Path

NAME = "rlcli_no_torch"
VERSION = "1.0"
STOCK_ENV = "RLCLI_ENGINE_TORCH"  # "1": the engine imports torch as stock SkyRL does
RECORD_NAME = "rlcli-peft-lora-config.json"  # in the server venv's own folder (sys.prefix)
IMPORT_UTILS = "transformers.utils.import_utils"
CONFIG_FILE = "adapter_config.json"  # what peft's save_pretrained writes
INPUTS = ("base_model_name_or_path", "r", "lora_alpha")  # the keywords SkyRL passes
# Two sets of inputs for the record's checks: different in every input, with a quote, a non-ASCII letter and a
# float alpha (SkyRL passes its LoraConfig.alpha as given).
SAMPLES = ({"base_model_name_or_path": "Qwen/Qwen3-0.6B", "r": 8, "lora_alpha": 16},
           {"base_model_name_or_path": 'models/"d\u00e9j\u00e0"/m', "r": 32, "lora_alpha": 64.5})
# SkyRL's module that imports peft, and the only one among the jax engine's imports allowed to.
PEFT_USER = "skyrl.tx.utils.models"

_state: dict = {"mode": None}


def log(message: str) -> None:
    # The launcher's supervisor copies this process's stderr into the server log.
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


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
    config = dict(record["config"])
    config.update(values)
    return json.dumps(config, indent=2, sort_keys=True)


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
                             f"start the server with {STOCK_ENV}=1 for the real peft")

    module.__getattr__ = __getattr__
    return module


def prepare(record_file: Path | None = None) -> bool:
    """Before SkyRL's jax backend is imported: keep torch out of this process. False: stock imports (why: logged)."""
    if _state["mode"] is not None:
        return _state["mode"] == "prepared"
    if os.environ.get(STOCK_ENV) == "1":
        _state["mode"] = f"stock ({STOCK_ENV}=1)"
        return False
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
    return True


def describe() -> dict:
    """What the capabilities route says (API process: the venv's record and the switch decide the engine's case).
    Read once: neither changes while the server runs."""
    if "described" not in _state:
        _state["described"] = _describe()
    return _state["described"]


def _describe() -> dict:
    if os.environ.get(STOCK_ENV) == "1":
        return {"engine_imports": f"torch imported at start (stock, {STOCK_ENV}=1)"}
    record, why = load_record()
    if record is None:
        return {"engine_imports": f"torch imported at start (stock): {why}"}
    return {"engine_imports": "without torch: transformers loads as if torch were absent, torch is imported on "
                              f"first use, peft's LoraConfig is written from the record of peft {record['peft']}"}


def register(role: str) -> None:
    if role == "engine" and _state["mode"] == "prepared":
        log("the jax engine imported without torch (transformers sees none; peft's LoraConfig from the venv's record)")


# --- the record and the checks (run in the server venv, never in a server process) ---------------------------


def _peft_text(values: dict) -> str:
    """What the real peft writes for these inputs (this process imports peft)."""
    import peft

    with tempfile.TemporaryDirectory() as folder:
        peft.LoraConfig(**values).save_pretrained(folder)
        return (Path(folder) / CONFIG_FILE).read_text()


def make_record() -> dict:
    """The record, from the real peft; SystemExit with one line where its premises do not hold."""
    texts = [_peft_text(values) for values in SAMPLES]
    first, second = (json.loads(text) for text in texts)
    varying = {key for key in first.keys() | second.keys() if first.get(key) != second.get(key)}
    if varying != set(INPUTS):
        raise SystemExit(f"{NAME}: peft's adapter config varies in {sorted(varying)}, not just {list(INPUTS)}: "
                         "the record would not reproduce it")
    record = {"peft": _version("peft"), "transformers": _version("transformers"), "config": first,
              "made_by": f"{NAME} {VERSION}"}
    for values, text in zip(SAMPLES, texts, strict=True):
        if render(record, values) != text:
            raise SystemExit(f"{NAME}: the record does not reproduce peft's text for {values}")
    return record


def check_peft_uses() -> None:
    """SkyRL's jax engine meets peft only in PEFT_USER, as `peft.LoraConfig(<INPUTS as keywords>)` whose result
    only calls save_pretrained(folder)."""
    import ast
    import importlib.util

    source = Path(importlib.util.find_spec(PEFT_USER).origin).read_text()
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "peft":
            attribute = parents.get(node)
            assert isinstance(attribute, ast.Attribute) and attribute.attr == "LoraConfig", \
                f"{PEFT_USER} line {node.lineno} uses peft other than as peft.LoraConfig"
            call = parents.get(attribute)
            assert isinstance(call, ast.Call) and not call.args and {k.arg for k in call.keywords} <= set(INPUTS), \
                f"{PEFT_USER} line {node.lineno}: LoraConfig takes other inputs than {INPUTS}"
            target = parents.get(call)
            assert isinstance(target, ast.Assign) and len(target.targets) == 1, \
                f"{PEFT_USER} line {node.lineno}: the LoraConfig is not kept in one name"
            kept = target.targets[0]
            uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == kept.id and n is not kept]
            assert uses and all(isinstance(parents.get(n), ast.Attribute) and parents[n].attr == "save_pretrained"
                                for n in uses), f"{PEFT_USER}: the LoraConfig is used other than by save_pretrained"
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name for alias in node.names] + [getattr(node, "module", None) or ""]
            assert not any(n.startswith("peft.") for n in names) and not (
                isinstance(node, ast.ImportFrom) and (node.module or "").startswith("peft")), \
                f"{PEFT_USER} line {node.lineno} imports from inside peft"


# Run in a fresh process of the venv by the check: the prepared imports, then what the engine does with them.
PREPARED_CHECK = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import rlcli_no_torch as lean, rlcli_lazy_torch
record_file, model, values, expected = Path(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), sys.argv[5]
assert lean.prepare(record_file), lean._state["mode"]
import skyrl.tinker.engine, skyrl.backends.jax
from skyrl.tx.utils import models
assert not rlcli_lazy_torch.loaded("torch"), "importing SkyRL's jax engine loaded torch"
holders = sorted(n for n, m in sys.modules.items() if n.startswith("skyrl") and "peft" in vars(m))
assert holders == [lean.PEFT_USER], f"SkyRL modules holding peft: {holders}"
from transformers import AutoConfig, AutoTokenizer
config, tokenizer = AutoConfig.from_pretrained(model), AutoTokenizer.from_pretrained(model)
ids = tokenizer.encode("What is 3 + 4?")
with tempfile.TemporaryDirectory() as folder:
    models.peft.LoraConfig(**values).save_pretrained(folder)
    assert (Path(folder) / lean.CONFIG_FILE).read_text() == Path(expected).read_text(), "not peft's text"
assert not rlcli_lazy_torch.loaded("torch"), "configuration, tokenizer or save loaded torch"
print(json.dumps({"config": type(config).__name__, "dtype": str(getattr(config, "dtype", None)), "ids": ids}))
"""


def check(model: str | None = None) -> str:
    """The whole check; returns what it verified, in one line."""
    import subprocess

    record = make_record()
    check_peft_uses()
    with tempfile.TemporaryDirectory() as scratch:
        record_file, expected = Path(scratch) / RECORD_NAME, Path(scratch) / "expected.json"
        record_file.write_text(json.dumps(record))
        values = {"base_model_name_or_path": "org/model-\u00e9", "r": 16, "lora_alpha": 32.0}
        expected.write_text(_peft_text(values))
        model = model or _a_model()
        proc = subprocess.run([sys.executable, "-c", PREPARED_CHECK, str(Path(__file__).resolve().parent),
                               str(record_file), model, json.dumps(values), str(expected)],
                              capture_output=True, text=True, env={**os.environ, STOCK_ENV: ""})
        if proc.returncode != 0:
            raise SystemExit(f"{NAME}: the prepared engine imports failed:\n{proc.stderr[-3000:]}")
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
    return (f"{NAME} {VERSION}: SkyRL's jax engine imports without torch; {seen['config']} and its tokenizer "
            f"load; LoraConfig writes peft {record['peft']}'s exact text")


def _a_model() -> str:
    """A configuration and tokenizer to load, where the check is given none: the embedded model's, shipped in
    rlcli's package beside this folder."""
    folder = Path(__file__).resolve().parents[2] / "assets" / "rlcli-tiny-qwen3-v1"
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{NAME}: pass a model folder (config.json and tokenizer files) to check with")
    return str(folder)


def main(argv: list[str]) -> None:
    if argv[:1] == ["record"]:
        path = Path(argv[1]) if len(argv) > 1 else record_path()
        record = make_record()
        check_peft_uses()
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        os.replace(partial, path)
        print(f"{NAME}: recorded peft {record['peft']}'s LoraConfig in {path}")
        return
    print(check(argv[0] if argv else None))


if __name__ == "__main__":
    main(sys.argv[1:])  # failures raise SystemExit with their line; success returns (runpy callers go on)
