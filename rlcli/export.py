"""`rlcli export`: sampler weights out of the server, as a PEFT adapter or a merged Hugging Face model.

Launch:  rlcli export tinker://RUN/sampler_weights/ID --format peft -o my-adapter
         rlcli export tinker://RUN/sampler_weights/ID --format merged -o my-model [--force]
         python scripts/export.py tinker://RUN/sampler_weights/ID --format merged --output my-model

The archive comes from the server's checkpoint archive endpoint into a private temp folder and only its
regular files with plain names are extracted. SkyRL writes the adapter config without target_modules
(peft would then adapt q_proj and v_proj only and silently drop the rest) and with the server's path of
the base model: both are rewritten from the weights themselves and from the training run.
"""

from __future__ import annotations

import errno
import json
import shutil
import tarfile
import tempfile
import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rlcli.client import open_url, parse_tinker_path, training_run
from rlcli.config import resolve_base_url
from rlcli.errors import RlcliError, UsageError
from rlcli.files import staged_folder
from rlcli.options import CHECKPOINT, ServerOptions, option
from rlcli.watchdog import watch

Format = Literal["peft", "merged"]  # what --format writes
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
_CHUNK = 1 << 20


def download_archive(base_url: str, run_id: str, checkpoint_id: str, dest: Path) -> None:
    """Stream the sampler checkpoint's tar.gz to dest (the archive route redirects to the bytes)."""
    url = f"{base_url}/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}/archive"
    try:
        with open_url(url, timeout=300) as resp, dest.open("wb") as out:
            shutil.copyfileobj(resp, out, _CHUNK)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise UsageError(f"no sampler checkpoint {checkpoint_id!r} in run {run_id} on {base_url}: "
                             f"`rlcli checkpoint list --run-id {run_id}` shows what it has") from None
        raise RlcliError(f"downloading {run_id}/{checkpoint_id} failed: HTTP {e.code} from {base_url}") from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # this machine's disk, not the server: rlcli.errors says so in one line
        raise RlcliError(f"cannot download from {base_url} ({e}): is the server running?") from None


def extract_adapter(archive: Path, dest: Path) -> Path:
    """Extract the adapter's two files into dest; refuse links, devices, absolute or `..` names."""
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            name = Path(member.name)
            if member.isdir() and member.name.strip("/.") == "":
                continue  # SkyRL's archives hold an entry for their own root
            if not member.isfile() or name.is_absolute() or ".." in name.parts or len(name.parts) != 1:
                raise RlcliError(f"the checkpoint archive holds an unexpected entry {member.name!r}; not extracting it")
            if name.name in ADAPTER_FILES:
                src = tar.extractfile(member)
                assert src is not None
                with src, (dest / name.name).open("wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)
    missing = [f for f in ADAPTER_FILES if not (dest / f).exists()]
    if missing:
        raise RlcliError(f"the checkpoint archive lacks {', '.join(missing)}: it is not a PEFT adapter")
    return dest


def adapter_config(config: dict, tensor_names: list[str], base_model: str) -> dict:
    """SkyRL's adapter config made loadable: every adapted module named, the base model's real name."""
    modules = sorted({n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n in tensor_names if ".lora_A." in n})
    if not modules:
        raise RlcliError("the adapter holds no LoRA weights (no lora_A tensors)")
    if "embed_tokens" in modules:
        raise RlcliError("this adapter trains the embeddings (train_unembed), which export does not convert yet")
    return {**config, "target_modules": modules, "base_model_name_or_path": base_model,
            "task_type": "CAUSAL_LM", "inference_mode": True}


def write_peft(adapter: Path, out: Path, base_model: str) -> None:
    from safetensors import safe_open

    with safe_open(adapter / "adapter_model.safetensors", "np") as f:
        names = list(f.keys())
    config = adapter_config(json.loads((adapter / "adapter_config.json").read_text()), names, base_model)
    shutil.copy2(adapter / "adapter_model.safetensors", out / "adapter_model.safetensors")
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_merged(adapter: Path, out: Path, base_model: str) -> None:
    """The base model with the LoRA merged in (peft's merge_and_unload), plus the base's tokenizer."""
    import transformers
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()  # per-shard bars; the printed folder is the result
    peft_dir = adapter / "peft"
    peft_dir.mkdir()
    write_peft(adapter, peft_dir, base_model)
    model = AutoModelForCausalLM.from_pretrained(_local_or_hub(base_model), dtype="auto")
    merged = PeftModel.from_pretrained(model, str(peft_dir)).merge_and_unload()
    merged.save_pretrained(out)
    _copy_tokenizer(base_model, out)


def _local_or_hub(base_model: str) -> str:
    path = Path(base_model).expanduser()
    if path.is_dir():
        return str(path)
    if base_model.startswith(("/", "~", ".")):
        raise UsageError(f"the base model {base_model} is not a folder on this machine (the server's path): "
                         "pass --base-model with a local copy of it or its Hugging Face id")
    return base_model


def _copy_tokenizer(base_model: str, out: Path) -> None:
    path = Path(_local_or_hub(base_model))
    if path.is_dir():  # copied byte for byte: re-saving can change a tokenizer's class or template
        for name in TOKENIZER_FILES:
            if (path / name).exists():
                shutil.copy2(path / name, out / name)
        return
    from rlcli.sample import load_tokenizer

    load_tokenizer(base_model).save_pretrained(out)


def _check_output(output: str | None, force: bool) -> Path:
    if not output:
        raise UsageError("-o DIR is required: the folder to write the export into")
    out = Path(output).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a folder: pick another -o")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"{out} exists and is not empty: pick another -o, or --force to replace it")
    return out


@dataclass(frozen=True, kw_only=True)
class ExportOptions(ServerOptions):
    """`rlcli export`'s options."""

    checkpoint: str = CHECKPOINT(positional=True)
    format: Format = option("peft", "peft (adapter_config.json + adapter_model.safetensors) or merged (full Hugging "
                                    "Face weights)", short="-f")
    output: str | None = option(None, "the folder to write (must be absent or empty unless --force)", short="-o")
    force: bool = option(False, "replace a non-empty output folder")
    base_model: str | None = option(None, "local folder or hub id of the base model (default: the one the run was "
                                          "trained on)")


def export(o: ExportOptions) -> int:
    """Download sampler weights and write a PEFT adapter folder, or a full model with the LoRA merged in."""
    run_id, kind, ckpt = parse_tinker_path(o.checkpoint)
    if kind == "weights":
        raise UsageError(f"{o.checkpoint} is a training checkpoint (optimizer state, not loadable weights): save "
                         f"the model with save_weights_for_sampler and export its tinker://{run_id}/sampler_weights/"
                         "ID path")
    out = _check_output(o.output, o.force)
    url = resolve_base_url(o.base_url)
    base = o.base_model or training_run(url, run_id)["base_model"]
    # A failed export leaves nothing half-written; the finished one is the user's alone (weights trained on their data).
    with (watch(url, o.server_timeout), staged_folder(out) as staging,
          tempfile.TemporaryDirectory(prefix="rlcli-export-") as tmp):
        download_archive(url, run_id, ckpt, Path(tmp) / "archive.tar.gz")
        adapter = extract_adapter(Path(tmp) / "archive.tar.gz", Path(tmp))
        (write_peft if o.format == "peft" else write_merged)(adapter, staging, base)
    print(out)
    return 0
