"""The roofline beside the GPU check's sampling breakdown: what one decoded token must cost at least.

Decoding one token for a batch of B sequences reads every weight once (a matrix-vector product per sequence,
batched: the weights are read once for all B) and each sequence's whole KV cache, and does about
2 x params FLOPs per sequence plus the attention over the cache. The bound is the larger of bytes / memory
bandwidth and FLOPs / peak; at batch 64 on a 4B model it is the bytes.

The device's figures come from a table keyed by the name nvidia-smi (or jax) gives, from the vendors'
datasheets (dense bf16, no sparsity), and from a probe the check runs in the server's jax (a device copy
and a bf16 matmul: what this device reaches, not what it is sold at). A device the table does not know
(the CPU of a dry run) gets only the probe's figures, marked as such.
"""

from __future__ import annotations

# nvidia-smi name fragment -> (memory bandwidth bytes/s, dense bf16 tensor FLOP/s), vendor datasheets.
# The longest fragment found in the name wins ("H100 PCIe" before "H100").
DEVICES: dict[str, tuple[float, float]] = {
    "H200": (4.8e12, 989e12),
    "H100 80GB HBM3": (3.35e12, 989e12),  # SXM
    "H100 PCIe": (2.0e12, 756e12),
    "A100-SXM4-80GB": (2.039e12, 312e12),
    "A100-SXM4-40GB": (1.555e12, 312e12),
    "A100 80GB PCIe": (1.935e12, 312e12),
    "L40S": (0.864e12, 362e12),
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def device_peaks(name: str | None, probe: dict | None) -> dict:
    """Bandwidth and peak FLOP/s for the roofline: the datasheet's where the table knows the device, else the
    probe's measured figures (the source says which)."""
    known = [k for k in DEVICES if name and k in name]
    if known:
        bandwidth, flops = DEVICES[max(known, key=len)]
        return {"device": name, "bandwidth_Bps": bandwidth, "peak_flops": flops, "source": "datasheet table",
                "probe": probe}
    if probe and probe.get("copy_Bps") and probe.get("matmul_flops"):
        return {"device": name, "bandwidth_Bps": probe["copy_Bps"], "peak_flops": probe["matmul_flops"],
                "source": "measured by the probe (no datasheet entry for this device: a placeholder, e.g. a CPU "
                          "dry run)", "probe": probe}
    return {"device": name, "bandwidth_Bps": None, "peak_flops": None, "source": "unknown", "probe": probe}


def param_count(arch: dict, vocab: int) -> dict:
    """Parameters of a Qwen3 decoder of this shape (q/k norms, no biases); the LM head counted once when tied."""
    hidden, layers, inter = arch["hidden_size"], arch["num_hidden_layers"], arch["intermediate_size"]
    q_width = arch["num_attention_heads"] * arch["head_dim"]
    kv_width = arch["num_key_value_heads"] * arch["head_dim"]
    attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden + 2 * arch["head_dim"]
    per_layer = attention + 3 * hidden * inter + 2 * hidden
    embedding = vocab * hidden
    head = 0 if arch.get("tie_word_embeddings", True) else vocab * hidden
    return {"total": embedding + head + layers * per_layer + hidden, "non_embedding": layers * per_layer + hidden,
            "embedding": embedding, "lm_head_separate": head}


def padded_length(n: int) -> int:
    """The sequence length the jax sampler pads to: 32 at least, else n rounded up to two significant bits
    (SkyRL 0.4.0's bucketing, so that few shapes compile)."""
    if n <= 32:
        return 32
    top = n.bit_length() - 1
    mask = (1 << top) | (1 << (top - 1))
    return n & mask if n & mask == n else (n & mask) + (1 << (top - 1))


def cache_length(prompt_tokens: int, max_tokens: int) -> int:
    """The KV cache a decode step reads: the padded prompt plus the new tokens, padded again."""
    return padded_length(padded_length(prompt_tokens) + max_tokens)


def decode_bound(arch: dict, vocab: int, dtype: str, batch: int, cache: int, peaks: dict) -> dict:
    """Bytes and FLOPs of one decode step (one token for each of `batch` sequences) and its time bound."""
    size = DTYPE_BYTES[dtype]
    params = param_count(arch, vocab)
    # every weight once (the embedding lookup reads only `batch` rows, but the tied LM head reads all of it)
    weight_bytes = params["total"] * size
    kv_per_token = arch["num_hidden_layers"] * 2 * arch["num_key_value_heads"] * arch["head_dim"] * size
    kv_bytes = batch * cache * kv_per_token
    attention_flops = 4 * batch * cache * arch["num_hidden_layers"] * arch["num_attention_heads"] * arch["head_dim"]
    flops = 2 * batch * params["total"] + attention_flops
    out = {"batch": batch, "cache_tokens": cache, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
           "bytes": weight_bytes + kv_bytes, "flops": flops, "bandwidth_Bps": peaks.get("bandwidth_Bps"),
           "peak_flops": peaks.get("peak_flops"), "peaks_source": peaks.get("source")}
    if peaks.get("bandwidth_Bps") and peaks.get("peak_flops"):
        out["memory_s"] = out["bytes"] / peaks["bandwidth_Bps"]
        out["compute_s"] = flops / peaks["peak_flops"]
        out["bound_s"] = max(out["memory_s"], out["compute_s"])
    return out


def against_bound(measured_s: float | None, bound: dict) -> dict:
    """A measured per-token decode time beside its bound: how many times the bound, and the bandwidth and FLOP/s
    it reached."""
    if not measured_s or measured_s <= 0 or not bound.get("bound_s"):
        return {**bound, "measured_s": measured_s}
    return {**bound, "measured_s": measured_s, "times_bound": measured_s / bound["bound_s"],
            "achieved_Bps": bound["bytes"] / measured_s, "achieved_flops": bound["flops"] / measured_s}


# Run in the server's Python by the preflight: a device copy (read + write) and a bf16 matmul, best of a few.
PROBE = """
def _probe(big):
    import time
    import jax
    import jax.numpy as jnp
    n = (1 << 29) if big else (1 << 24)  # float32 elements: 2 GiB on a GPU, 64 MiB on a CPU (whose bf16
    m = 8192 if big else 1024            # arithmetic is not vectorised: a bf16 copy would understate it)
    x = jnp.ones((n,), jnp.float32)
    a = jnp.ones((m, m), jnp.bfloat16)
    copy = jax.jit(lambda v: v * 2)
    mm = jax.jit(lambda u: u @ u)
    def best(f, v, reps=5):
        f(v).block_until_ready()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            f(v).block_until_ready()
            times.append(time.perf_counter() - t)
        return min(times)
    copy_s, mm_s = best(copy, x), best(mm, a)
    return {"copy_bytes": 2 * 4 * n, "copy_s": copy_s, "copy_Bps": 2 * 4 * n / copy_s,
            "matmul_n": m, "matmul_s": mm_s, "matmul_flops": 2 * m ** 3 / mm_s}
"""
