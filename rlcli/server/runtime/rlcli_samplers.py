"""rlcli server extension: sampling a saved checkpoint never changes the model that is training.

Runs INSIDE the server venv (stdlib + skyrl + jax), loaded by rlcli's launcher in the engine process when
RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, unless --no-extensions).

Why: SkyRL 0.4.0's jax backend serves a sampler checkpoint of model M (tinker://M/NAME) from M's own LoRA
slot: `load_sampler_weights` loads NAME's weights into that slot unless the slot's `loaded_checkpoint_id`
already says NAME. So sampling an older checkpoint of a model that is still training silently replaced
the training weights with the old ones (the next optim_step then continued from them). And the mark was
never cleared by training: sample NAME, train on, sample NAME again, and the second answer came from the
trained weights, not from NAME.

How: the slot's mark now means what it says. A model's `loaded_checkpoint_id` is NAME right after it saved
NAME (the slot holds exactly those weights: sampling the checkpoint just saved, as the RL loop does every
step, needs no load), and is cleared by every change of its weights (optim_step, load_checkpoint). Any
other checkpoint is sampled on a borrowed slot: the model's live adapter is copied aside, NAME is loaded
and sampled, and the live adapter is put back before the engine takes its next request (the engine runs
one batch at a time, so no training request can see the borrowed weights), with the mark as it was.

`python rlcli_samplers.py` checks in this venv that the pieces it relies on still exist.
"""

from __future__ import annotations

import functools
import sys
from pathlib import PurePath

NAME = "rlcli_samplers"
VERSION = "1.0"
MARK = "_rlcli_sampler_checkpoints_kept_apart"
SUFFIX = ".tar.gz"  # SkyRL names a sampler checkpoint's file NAME.tar.gz


def log(message: str) -> None:
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


def _targets():
    from skyrl.backends import jax as jax_backend
    from skyrl.tinker import types
    from skyrl.tx.utils import models

    impl = getattr(jax_backend, "JaxBackendImpl", None)
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path

    pins.require(NAME, {
        **{f"JaxBackendImpl.{m}": getattr(impl, m, None)
           for m in ("sample", "load_sampler_weights", "save_sampler_checkpoint", "optim_step", "load_checkpoint")},
        "models.extract_adapter_state": getattr(models, "extract_adapter_state", None),
        "models.insert_adapter_state": getattr(models, "insert_adapter_state", None),
        "ModelMetadata.loaded_checkpoint_id":
            "loaded_checkpoint_id" in getattr(types.ModelMetadata, "model_fields", {}),
    })
    return impl, models


def checkpoint_name(output_path) -> str:
    name = PurePath(str(output_path)).name
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


def install() -> None:
    impl, models = _targets()
    if getattr(impl.sample, MARK, False):
        return
    original_sample, original_save = impl.sample, impl.save_sampler_checkpoint
    original_optim, original_load = impl.optim_step, impl.load_checkpoint

    @functools.wraps(original_sample)
    def sample(self, prepared_batch):
        import jax

        aside = {}  # model_id -> (its live adapter, its mark)
        wanted = zip(prepared_batch.all_model_ids, prepared_batch.all_checkpoint_ids, strict=True)
        for model_id, checkpoint_id in wanted:
            meta = self.models.get(model_id) if model_id else None
            if meta is None or model_id in aside or meta.loaded_checkpoint_id == checkpoint_id:
                continue
            with jax.set_mesh(self.mesh):
                live = models.extract_adapter_state(meta.adapter_index, self.lora_params, meta.lora_config.rank)
            aside[model_id] = (live, meta.loaded_checkpoint_id)
        try:
            return original_sample(self, prepared_batch)
        finally:
            for model_id, (live, mark) in aside.items():
                meta = self.models.get(model_id)
                if meta is None:
                    continue
                with jax.set_mesh(self.mesh):
                    models.insert_adapter_state(meta.adapter_index, self.lora_params, live, meta.lora_config.rank)
                meta.loaded_checkpoint_id = mark

    @functools.wraps(original_save)
    def save_sampler_checkpoint(self, output_path, model_id, *args, **kwargs):
        original_save(self, output_path, model_id, *args, **kwargs)
        self.models[model_id].loaded_checkpoint_id = checkpoint_name(output_path)  # the slot holds them

    @functools.wraps(original_optim)
    def optim_step(self, model_id, *args, **kwargs):
        if model_id in self.models:
            self.models[model_id].loaded_checkpoint_id = None  # the weights are about to change
        return original_optim(self, model_id, *args, **kwargs)

    @functools.wraps(original_load)
    def load_checkpoint(self, checkpoint_path, model_id, *args, **kwargs):
        if model_id in self.models:
            self.models[model_id].loaded_checkpoint_id = None
        return original_load(self, checkpoint_path, model_id, *args, **kwargs)

    for fn in (sample, save_sampler_checkpoint, optim_step, load_checkpoint):
        setattr(fn, MARK, True)
    impl.sample, impl.save_sampler_checkpoint = sample, save_sampler_checkpoint
    impl.optim_step, impl.load_checkpoint = optim_step, load_checkpoint


def describe() -> dict:
    """What the capabilities route says (API process; the engine refuses to start if install() fails)."""
    return {"sampler_checkpoints": "sampled on a borrowed slot; a training model's weights are never replaced"}


def register(role: str) -> None:
    if role != "engine":
        return
    argv = sys.argv[2:] if sys.argv[1:2] == ["engine"] else sys.argv[1:]
    if "--backend" in argv and argv[argv.index("--backend") + 1] != "jax":
        return  # the fsdp and megatron backends serve sampler checkpoints their own way
    install()
    log("sampler checkpoints are sampled apart from the models that are training")


if __name__ == "__main__":
    _targets()
    install()
    print(f"{NAME} {VERSION}: JaxBackendImpl sample/save/optim/load and the adapter-state helpers present")
