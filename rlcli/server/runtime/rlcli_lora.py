"""A step pays for the LoRA adapters its batch uses, not for every slot: SkyRL's `LoRAMixin.apply_lora` runs a
ragged_dot over every slot; here each sequence's own A and B are gathered and contracted (the same sums in another
order). It steps aside for layers with their own contraction and over GATHER_BUDGET_BYTES
(docs/upstream/lora-per-sequence.md).
"""

from __future__ import annotations

import functools
import math

MARK = "_rlcli_lora_per_sequence"
# Gathered A and B per call at most this big, else the stock path. 64 MiB: far above the embedded (~0.3 MiB)
# and 26M (~2 MiB) models' batches, below what would crowd a GPU serving a large model.
GATHER_BUDGET_BYTES = 64 * 2**20


def per_sequence_lora(layer, x, base_output, adapter_indices):
    """base_output + the LoRA path of each leading row with its own adapter, or None to use the stock path."""
    import jax
    import jax.numpy as jnp
    from skyrl.tx.layers import lora

    kind = type(layer)._apply_lora_weight
    embed = kind is lora.LoRAEmbed._apply_lora_weight
    if not embed and kind is not lora.LoRAMixin._apply_lora_weight:
        return None  # a layer with its own LoRA contraction
    a, b = layer.lora_A[...], layer.lora_B[...]
    if a.ndim != 3 or b.ndim != 3:
        return None
    n = adapter_indices.shape[0]
    feature_shape = x.shape[base_output.ndim - 1:]
    if n == 0 or x.shape[0] != n or base_output.shape[0] != n:
        return None
    rank = a.shape[2]
    tokens = x.size // math.prod(feature_shape)
    gathered = n * b.shape[1] * b.shape[2] + (tokens * rank if embed else n * a.shape[1] * rank)
    if gathered * a.dtype.itemsize > GATHER_BUDGET_BYTES:
        return None
    rows = x.reshape(n, -1, *feature_shape)  # (n, m, in) or, for the embedding, (n, m) token ids
    scaling = layer.lora_scaling[...]

    def each_own():
        if embed:
            inner = a[adapter_indices[:, None], rows]  # (n, m, r): each token's row of its sequence's A
        else:
            inner = jnp.einsum("nmi,nir->nmr", rows, a[adapter_indices])
        out = jnp.einsum("nmr,nro->nmo", inner, b[adapter_indices])
        return out * scaling[adapter_indices][:, None, None].astype(out.dtype)

    def one_for_all():  # every row on one adapter: its A and B read once, not copied once per row
        first = adapter_indices[0]
        inner = a[first, rows] if embed else jnp.einsum("nmi,ir->nmr", rows, a[first])
        out = jnp.einsum("nmr,ro->nmo", inner, b[first])
        return out * scaling[first].astype(out.dtype)

    # A decode step (one token per row) of n rows copied n adapters' A and B per layer, more bytes than the
    # model's own weights at batch 64 (docs/decisions.md, "Issue 48: where CPU sampling time goes"); its rows
    # mostly share one adapter (a group of samples, the base model). Longer rows (training, prefill) keep
    # the gather alone: there its copies are shared by every token of a row.
    def adapters():
        if n > 1 and rows.shape[1] == 1:
            return jax.lax.cond(jnp.all(adapter_indices == adapter_indices[0]), one_for_all, each_own)
        return each_own()

    # Slot 0 is SkyRL's base model: its B is zero, so a batch all on it adds exactly nothing (the base model's
    # decode at 64 rows spent ~0.8 ms a step computing that zero). Checked, not assumed: a slot 0 with a
    # non-zero B takes the sums. Slot 0 is never trained, so no gradient is lost.
    shape = jax.eval_shape(adapters)
    base_only = jnp.all(adapter_indices == 0) & jnp.all(b[0] == 0)
    out = jax.lax.cond(base_only, lambda: jnp.zeros(shape.shape, shape.dtype), adapters)
    return base_output + out.reshape(base_output.shape).astype(base_output.dtype)


def install() -> None:
    """Rebind LoRAMixin.apply_lora (no class seam: SkyRL's model classes build their layers themselves)."""
    from skyrl.tx.layers import lora

    stock = lora.LoRAMixin.apply_lora
    if getattr(stock, MARK, False):
        return

    @functools.wraps(stock)
    def apply_lora(self, x, base_output, adapter_indices):
        if self.max_lora_adapters == 0 or adapter_indices is None or self.lora_A is None:
            return stock(self, x, base_output, adapter_indices)
        out = per_sequence_lora(self, x, base_output, adapter_indices)
        return stock(self, x, base_output, adapter_indices) if out is None else out

    setattr(apply_lora, MARK, True)
    lora.LoRAMixin.apply_lora = apply_lora


def describe() -> dict:
    """What the capabilities route says (API process)."""
    return {"lora_path": "per sequence: a step computes only the adapters in its batch",
            "stock_path_above_bytes": GATHER_BUDGET_BYTES}
