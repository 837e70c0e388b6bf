"""rlcli server extension: every new model starts with a clean gradient accumulator.

Runs INSIDE the server venv (stdlib + skyrl + jax), loaded by rlcli's launcher in the
engine process when RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, unless
--no-extensions).

Why: SkyRL 0.4.0's jax backend keeps one gradient accumulator per LoRA slot and clears it
only in optim_step. create_model and delete_model reset the slot's weights and optimizer
but not its accumulator, so gradients of a forward_backward that no optim_step consumed
(a crashed or interrupted run, a 2-pass step cut short) leak into the next model placed in
that slot: its first optim_step applies someone else's gradients. This wraps
JaxBackendImpl.create_model so the new model's slot accumulator (sums and count) is zeroed.

The same wrapper words the refusal of a full server: SkyRL says "Maximum number of LoRA adapters (N)
reached", naming a backend key; the answer keeps that text (clients match it) and adds one line naming
`rlcli serve start --slots N`.

`python rlcli_slots.py` checks in this venv that the pieces it relies on still exist.
"""

from __future__ import annotations

import functools
import sys

NAME = "rlcli_slots"
VERSION = "1.0"
MARK = "_rlcli_resets_slot_gradients"
FULL = "Maximum number of LoRA adapters"  # the start of SkyRL 0.4.0's error for a full LoRA table


def log(message: str) -> None:
    print(f"[{NAME}] {message}", file=sys.stderr, flush=True)


def _targets():
    from skyrl.backends import jax as jax_backend

    impl = getattr(jax_backend, "JaxBackendImpl", None)
    accumulated = getattr(jax_backend, "AccumulatedGradients", None)
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path

    pins.require(NAME, {"JaxBackendImpl.create_model": getattr(impl, "create_model", None),
                        "AccumulatedGradients.reset_adapter": getattr(accumulated, "reset_adapter", None)})
    return impl


def install() -> None:
    impl = _targets()
    original = impl.create_model
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def create_model(self, model_id, lora_config, model_role="policy"):
        try:
            original(self, model_id, lora_config, model_role)
        except ValueError as e:
            if FULL not in str(e):
                raise
            # SkyRL's message names max_lora_adapters, which an rlcli user never set; say what to do.
            usable = self.config.max_lora_adapters - 1
            raise ValueError(f"{e}: all {usable} LoRA slots of this server are in use; unload a model, or "
                             f"restart the server with more: `rlcli serve start --slots N`") from None
        import jax
        import jax.numpy as jnp

        index = self.models[model_id].adapter_index
        with jax.set_mesh(self.mesh):
            self.accumulated_grads = self.accumulated_grads.reset_adapter(jnp.int32(index))

    setattr(create_model, MARK, True)
    impl.create_model = create_model


def register(role: str) -> None:
    if role != "engine":
        return
    argv = sys.argv[2:] if sys.argv[1:2] == ["engine"] else sys.argv[1:]
    if "--backend" in argv and argv[argv.index("--backend") + 1] != "jax":
        return  # the fix concerns the jax backend's accumulator only
    install()
    log("new models start with a zeroed gradient accumulator in their LoRA slot")


if __name__ == "__main__":
    _targets()
    print(f"{NAME} {VERSION}: JaxBackendImpl.create_model and AccumulatedGradients.reset_adapter present")
