"""rlcli server extension: a step pays for the LoRA adapters its batch uses, not for every slot of the table.

Runs INSIDE the server venv (stdlib + skyrl + jax), loaded by rlcli's launcher in the engine process when
RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, unless --no-extensions).

Why: SkyRL 0.4.0's LoRA layers (skyrl/tx/layers/lora.py, LoRAMixin.apply_lora) sort the tokens by adapter and
run `jax.lax.ragged_dot` over all `max_lora_adapters` groups. XLA's CPU lowering pays for every group, used or
not: one rank-8 LoRA on the embedded model, forward_backward of 8 x 64 tokens, took 425-475 ms in the engine
with SkyRL's 32 slots and 100-114 ms with 4.

How: every sequence of a batch has one adapter (apply_lora gets one index per leading row, and repeats it over
that row's tokens), so the LoRA path can run per sequence: gather each sequence's own A and B (for the
embedding, its A rows at the sequence's token ids) and contract with batched matmuls, x_b @ A[i_b] @ B[i_b],
scaled by scaling[i_b]. That costs one adapter's matmuls per token, whatever the table size; the gathered
weights cost sequences x in x rank floats. The same sums in another order: results agree with the stock path
to float rounding (`python rlcli_lora.py` checks values and gradients against it in this venv).

When it steps aside (the stock ragged_dot runs, unchanged): layers with their own LoRA routing (MoE experts,
connectors), and a call whose gathered weights would pass GATHER_BUDGET_BYTES (many sequences times a wide
layer, e.g. a LoRA on a large-vocabulary unembedding), where a copy per sequence would cost more memory than
the grouped product saves. Shapes are static under jit, so that choice is made once per compiled shape.
"""

from __future__ import annotations

import functools
import math
import sys

NAME = "rlcli_lora"
VERSION = "1.0"
MARK = "_rlcli_lora_per_sequence"
# Gathered A and B per call at most this big, else the stock path. 64 MiB: far above the embedded (~0.3 MiB)
# and 26M (~2 MiB) models' batches, below what would crowd a GPU serving a large model.
GATHER_BUDGET_BYTES = 64 * 2**20

_state = {"per_sequence_calls": 0, "stock_calls": 0}


def log(message: str) -> None:
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


def _targets():
    from skyrl.tx.layers import lora

    mixin, embed = getattr(lora, "LoRAMixin", None), getattr(lora, "LoRAEmbed", None)
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path

    pins.require(NAME, {"LoRAMixin.apply_lora": getattr(mixin, "apply_lora", None),
                        "LoRAMixin._apply_lora_weight": getattr(mixin, "_apply_lora_weight", None),
                        "LoRAEmbed._apply_lora_weight": getattr(embed, "_apply_lora_weight", None)})
    return lora


def per_sequence_lora(layer, x, base_output, adapter_indices):
    """base_output + the LoRA path of each leading row with its own adapter, or None to use the stock path."""
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
    if embed:
        inner = a[adapter_indices[:, None], rows]  # (n, m, r): each token's row of its sequence's A
    else:
        inner = jnp.einsum("nmi,nir->nmr", rows, a[adapter_indices])
    out = jnp.einsum("nmr,nro->nmo", inner, b[adapter_indices])
    out = out * layer.lora_scaling[...][adapter_indices][:, None, None].astype(out.dtype)
    return base_output + out.reshape(base_output.shape).astype(base_output.dtype)


def install() -> None:
    lora = _targets()
    original = lora.LoRAMixin.apply_lora
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def apply_lora(self, x, base_output, adapter_indices):
        if self.max_lora_adapters == 0 or adapter_indices is None or self.lora_A is None:
            return original(self, x, base_output, adapter_indices)
        out = per_sequence_lora(self, x, base_output, adapter_indices)
        if out is None:
            _state["stock_calls"] += 1
            return original(self, x, base_output, adapter_indices)
        _state["per_sequence_calls"] += 1  # counted per trace (jit traces once per shape), not per step
        return out

    setattr(apply_lora, MARK, True)
    lora.LoRAMixin.apply_lora = apply_lora


def describe() -> dict:
    """What the capabilities route says (API process; the engine refuses to start if install() fails)."""
    return {"lora_path": "per sequence: a step computes only the adapters in its batch",
            "stock_path_above_bytes": GATHER_BUDGET_BYTES}


def register(role: str) -> None:
    if role != "engine":
        return
    argv = sys.argv[2:] if sys.argv[1:2] == ["engine"] else sys.argv[1:]
    if "--backend" in argv and argv[argv.index("--backend") + 1] != "jax":
        return  # SkyRL's LoRA layers above are the jax backend's
    install()
    log("LoRA layers compute each sequence with its own adapter instead of a ragged_dot over every slot")


def self_check(slots: int = 6, seed: int = 0, dtype: str = "float32") -> float:
    """Largest difference between the stock path and this one, values and gradients, on random layers
    (linear, fused qkv-style linear, embedding) with a batch that mixes adapters and leaves slots unused."""
    import jax

    # SkyRL's layers are built under a device mesh (as the backend builds them); one device is enough here.
    mesh = jax.make_mesh((1,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        return _self_check(slots, seed, dtype)


def _self_check(slots: int, seed: int, dtype: str) -> float:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    lora = _targets()
    original = getattr(lora.LoRAMixin.apply_lora, "__wrapped__", lora.LoRAMixin.apply_lora)
    rngs = nnx.Rngs(seed)
    init = nnx.initializers.lecun_normal()
    common = dict(sharding=(None, None), max_lora_adapters=slots, max_lora_rank=8, dtype=dtype, rngs=rngs)
    layers = {
        "linear": lora.LoRALinear(24, 40, use_bias=True, kernel_init=init, **common),
        "fused": lora.FusedLoRALinear(24, 48, components=("q", "k", "v"), group_sizes=(8, 4, 4), **common),
        "embed": lora.LoRAEmbed(50, 24, embedding_init=init, **common),
    }
    key = jax.random.key(seed + 1)
    for layer in layers.values():  # give every slot non-zero A, B and its own scaling
        k1, k2, k3, key = jax.random.split(key, 4)
        layer.lora_A[...] = jax.random.normal(k1, layer.lora_A[...].shape, dtype)
        layer.lora_B[...] = jax.random.normal(k2, layer.lora_B[...].shape, dtype)
        layer.lora_scaling[...] = jax.random.uniform(k3, (slots,), dtype, minval=0.5, maxval=2.0)
    indices = jnp.array([3, 1, 3, 0, 5], dtype=jnp.int32)  # slots 2 and 4 unused, 3 twice
    worst = 0.0
    for name, layer in layers.items():
        key, k = jax.random.split(key)
        x = (jax.random.randint(k, (5, 7), 0, 50) if name == "embed" else jax.random.normal(k, (5, 7, 24), dtype))

        plain = nnx.Embed if name == "embed" else nnx.Linear  # the layer without its LoRA
        graphdef, params, rest = nnx.split(layer, nnx.Param, ...)  # gradients for every Param: base, A, B

        def loss(params, xs, path, graphdef=graphdef, rest=rest, plain=plain):
            layer = nnx.merge(graphdef, params, rest)
            out = path(layer, xs, plain.__call__(layer, xs), indices)
            return jnp.sum(jnp.sin(out)), out

        def ours(layer, xs, base, idx):
            out = per_sequence_lora(layer, xs, base, idx)
            assert out is not None, "the per-sequence path stepped aside in the self-check"
            return out

        argnums = 0 if name == "embed" else (0, 1)  # token ids have no gradient
        (_, want), want_grads = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(params, x, original)
        (_, got), got_grads = jax.value_and_grad(loss, argnums=argnums, has_aux=True)(params, x, ours)
        worst = max(worst, _relative(got, want))
        for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
            worst = max(worst, _relative(g, w))
    return worst


def _relative(got, want) -> float:
    import jax.numpy as jnp

    return float(jnp.max(jnp.abs(got - want))) / (float(jnp.max(jnp.abs(want))) or 1.0)


if __name__ == "__main__":
    # `python rlcli_lora.py`: check the targets and the exactness against the stock path in this venv. In
    # float64 the two paths must agree to rounding (1e-12); float32, what the server runs, to 1e-5.
    import jax

    jax.config.update("jax_enable_x64", True)
    found = {dtype: self_check(dtype=dtype) for dtype in ("float64", "float32")}
    if found["float64"] > 1e-12 or found["float32"] > 1e-5:
        raise SystemExit(f"{NAME}: per-sequence LoRA differs from SkyRL's ragged_dot path: {found} (relative)")
    print(f"{NAME} {VERSION}: per-sequence LoRA matches SkyRL's ragged_dot path, values and gradients "
          f"(largest relative difference: float64 {found['float64']:.1e}, float32 {found['float32']:.1e})")
