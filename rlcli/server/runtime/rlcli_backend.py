"""rlcli's jax backend: SkyRL's JaxBackendImpl (every jax process) and JaxBackend (process 0, which broadcasts each
call, then runs it through `super()`) with rlcli's changes as methods. Signatures keep SkyRL's annotations: a
worker rebuilds each broadcast call's arguments from them. Every override is in manifest.py; why: docs/upstream/.
"""

import functools

import jax
import jax.numpy as jnp
import rlcli_decode
import rlcli_lora
import rlcli_losses
import rlcli_samplers as samplers
import rlcli_warmup as warmup
from cloudpathlib import AnyPath
from shared import NO_FREE_SLOT
from skyrl.backends import jax as stock
from skyrl.tinker import types


class MeshJaxImpl(stock.JaxBackendImpl):
    """Every process of a multi-process server (with --no-extensions too): SkyRL's gaps that break one."""

    def sample(self, prepared_batch: types.PreparedSampleBatch):
        """Pad the batch to the mesh's fsdp axis (docs/upstream/sampling-batch-mesh.md)."""
        fsdp, total = self.mesh.shape["fsdp"], len(prepared_batch.all_model_inputs)
        if fsdp == 1 or self.config.sample_max_num_sequences > 0 or total % fsdp == 0:
            return super().sample(prepared_batch)
        self.config.sample_max_num_sequences = -(-total // fsdp) * fsdp
        try:
            return super().sample(prepared_batch)
        finally:
            self.config.sample_max_num_sequences = 0


class RlcliJaxImpl(MeshJaxImpl):
    shared_tx = None  # the first model's optimizer transform, given to every later model

    @functools.cached_property
    def snapshots(self) -> samplers.Snapshots:
        return samplers.Snapshots(samplers.keep_count(), records_rows=self.process_id == 0)

    @functools.cached_property
    def sampled(self) -> samplers.Sampled:
        # Several processes read the file every time: each would decide on its own copy, out of step.
        return samplers.Sampled(samplers.cache_size() if jax.process_count() == 1 else 0)

    @functools.cached_property
    def shapes(self) -> warmup.Shapes:
        return warmup.Shapes.from_env()  # a file on process 0 only: workers follow

    def create_model(self, model_id: str, lora_config: types.LoraConfig, model_role: str = "policy") -> None:
        try:
            super().create_model(model_id, lora_config, model_role)
        except ValueError as e:
            if NO_FREE_SLOT not in str(e):
                raise
            raise ValueError(f"{e}: all {self.config.max_lora_adapters - 1} LoRA slots of this server are in use; "
                             "unload a model, or restart the server with more: `rlcli serve start --slots N`") from None
        # A slot's gradients are cleared only by optim_step (docs/upstream/slot-gradients.md).
        with jax.set_mesh(self.mesh):
            index = jnp.int32(self.models[model_id].adapter_index)
            self.accumulated_grads = self.accumulated_grads.reset_adapter(index)
        # One optimizer transform for every model: nnx.jit keys its traces on it (docs/decisions.md, "A restart
        # replays the batch shapes it served; every model shares one optimizer transform").
        optimizer = self.optimizers.get(model_id)
        if hasattr(optimizer, "tx"):
            if self.shared_tx is None:
                self.shared_tx = optimizer.tx
            else:
                optimizer.tx = self.shared_tx

    def delete_model(self, model_id: str) -> None:
        super().delete_model(model_id)
        self.snapshots.model_gone(model_id)
        self.sampled.drop(model_id)

    def forward_backward(self, prepared_batch: types.PreparedModelPassBatch):
        self.shapes.record("forward_backward", prepared_batch)
        return super().forward_backward(prepared_batch)

    def forward(self, prepared_batch: types.PreparedModelPassBatch):
        self.shapes.record("forward", prepared_batch)
        return super().forward(prepared_batch)

    def optim_step(self, model_id: str, request_data: types.OptimStepInput):
        self._weights_change(model_id)
        return super().optim_step(model_id, request_data)

    def load_checkpoint(self, checkpoint_path: AnyPath, model_id: str, load_optimizer: bool) -> None:
        self._weights_change(model_id)
        super().load_checkpoint(checkpoint_path, model_id, load_optimizer)

    def _weights_change(self, model_id: str) -> None:
        """The slot no longer holds the checkpoint it was marked with (docs/upstream/sampler-checkpoint-slot.md)."""
        if model_id in self.models:
            self.models[model_id].loaded_checkpoint_id = None

    def sample(self, prepared_batch: types.PreparedSampleBatch):
        """Sampling batches padded to a few sizes; an older checkpoint is sampled on a borrowed slot."""
        prepared_batch = warmup.padded(prepared_batch, self.mesh.shape["fsdp"], self.config.sample_max_num_sequences)
        with samplers.borrowed_slots(self, prepared_batch):
            return super().sample(prepared_batch)

    def save_sampler_checkpoint(self, output_path: AnyPath, model_id: str, persist: bool = True) -> None:
        with self.snapshots.saving(model_id, output_path, persist):
            super().save_sampler_checkpoint(output_path, model_id, persist)
        name = samplers.checkpoint_name(output_path)
        self.models[model_id].loaded_checkpoint_id = name  # the slot holds exactly these weights
        self.sampled.drop(model_id, name)  # saved again under that name: kept weights are not these


class MeshJaxBackend(stock.JaxBackend, MeshJaxImpl):
    def delete_model(self, model_id: str) -> None:
        """SkyRL broadcasts create_model, not delete_model (docs/upstream/delete-model-broadcast.md)."""
        self._broadcast_and_call("delete_model", model_id=model_id)


class RlcliJaxBackend(MeshJaxBackend, RlcliJaxImpl):
    def save_sampler_checkpoint(self, output_path: AnyPath, model_id: str, persist: bool = True) -> None:
        """Room is made before SkyRL's probe file too: on a disk full to the last byte the probe would fail."""
        with self.snapshots.saving(model_id, output_path, persist):
            super().save_sampler_checkpoint(output_path, model_id, persist)


def prepare(rlcli: bool, backend_config: dict, module=None) -> None:
    """In a jax process that computes (the engine off Ray, a worker, a Ray actor), its runtime up: gspo in the loss
    registry, the per-sequence LoRA path and the greedy decode loop; a worker's or actor's impl is built by SkyRL
    through `module`'s global (run_worker, RayJaxBackendImpl.setup), rebound here to rlcli's class."""
    if rlcli:
        rlcli_losses.register(backend_config)
        rlcli_lora.install()
        rlcli_decode.install()
    if module is not None:
        module.JaxBackendImpl = RlcliJaxImpl if rlcli else MeshJaxImpl
