"""The embedded default model: a tiny pretrained Qwen3 that ships inside the package, so rlcli runs before
any download.

Its bytes (weights, tokenizer, config; a few MB) live in rlcli/assets/rlcli-tiny-qwen3-v1/ with the sha256 of
every file in its record (rlcli-model.json). `rlcli serve start` (or `rlcli model install`) copies them,
verified, to RLCLI_HOME/models/ and serves that folder: the same model on every machine.

`rlcli model build` (rlcli/model/recipe.py) is the recipe that made them: it trains a byte-level BPE tokenizer
on a corpus that module writes itself, initialises a `Qwen3ForCausalLM` with `torch.manual_seed(seed)`,
pretrains it briefly on synthetic ChatML chats (rlcli/model/pretrain.py), saves both in Hugging Face format,
and says whether the bytes match the shipped ones. On one machine the recipe repeats bit for bit; on another
processor it may not (float kernels differ between CPU models), which is why the bytes ship rather than the
recipe alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import sys
from collections.abc import Iterator
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from rlcli.config import private_dir, rlcli_home
from rlcli.errors import RlcliError, UsageError
from rlcli.files import staged_folder

EMBEDDED_MODEL_NAME = "rlcli-tiny-qwen3-v1"  # a new version of the bytes gets a new name
MARKER = "rlcli-model.json"  # the model's record (rlcli/model/recipe.py writes it)


def shipped() -> Traversable:
    """The shipped model inside the installed package."""
    return resources.files("rlcli") / "assets" / EMBEDDED_MODEL_NAME


def shipped_record() -> dict[str, Any]:
    return json.loads(shipped().joinpath(MARKER).read_text())


def embedded_model_dir() -> Path:
    """Where the embedded model is served from: RLCLI_HOME/models/rlcli-tiny-qwen3-v1.

    A stable folder of the user's, not site-packages: the server names its base model by this path, and run
    folders record it, so it must outlive reinstalls of the package."""
    return rlcli_home() / "models" / EMBEDDED_MODEL_NAME


def describe(path: str | Path) -> dict[str, Any]:
    """The record of a model folder: seed, params, vocab, layers, the sha256 of each file."""
    return json.loads((Path(path) / MARKER).read_text())


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _holds(folder: Path, files: dict[str, str]) -> bool:
    """Cheap check (no torch; ~10 ms): every file named in the record, with its recorded sha256."""
    try:
        return describe(folder).get("files") == files and all(_sha256(folder / n) == d for n, d in files.items())
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # a second builder waits here, then finds the model done
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _stage(parent: Path, target: Path, fill: Any) -> None:
    """Fill a private staging folder beside target, then put it in target's place whole (never patched)."""
    if target.exists() and any(target.iterdir()) and not (target / MARKER).exists():
        raise UsageError(f"{target} exists and is not an rlcli model folder: pick another --output")
    with staged_folder(target) as staging:  # mode 0700
        fill(staging)


def _copy_shipped(staging: Path) -> None:
    record_text = shipped().joinpath(MARKER).read_text()
    for name, digest in json.loads(record_text)["files"].items():
        data = shipped().joinpath(name).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise RlcliError(f"the shipped model's {name} does not match its recorded sha256: the package is "
                             "damaged; reinstall it (pip install --force-reinstall polygramme-rlcli)")
        (staging / name).write_bytes(data)
    (staging / MARKER).write_text(record_text)


def ensure_embedded_model(quiet: bool = True) -> Path:
    """The embedded model's folder, with the shipped bytes copied there (and checked) the first time."""
    target = embedded_model_dir()
    files = shipped_record()["files"]
    if _holds(target, files):
        return target
    parent = private_dir(target.parent)
    with _locked(parent / f".{target.name}.lock"):
        if not _holds(target, files):
            if not quiet:
                print(f"rlcli: installing {EMBEDDED_MODEL_NAME} in {target}", file=sys.stderr)
            _stage(parent, target, _copy_shipped)
    return target


def _summary(info: dict[str, Any]) -> str:
    return (f"{info['name']}: {info['architecture']}, {info['params']:,} params, vocab {info['vocab_size']}, "
            f"{info['layers']} layers, hidden {info['hidden_size']}, seed {info['seed']}")


def install() -> int:
    """Put the shipped embedded model in RLCLI_HOME (no build; its sha256 checked) and print its folder."""
    folder = ensure_embedded_model(quiet=False)
    print(folder)
    print(_summary(describe(folder)))
    return 0
