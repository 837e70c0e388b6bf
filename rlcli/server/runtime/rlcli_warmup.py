"""A restarted engine replays the batch shapes its earlier runs served (recorded in WARMUP_FILE_ENV) on a scratch
model with zero loss weights before it serves; sampling batches are padded to a few sizes with copies of their first
sequence (docs/decisions.md, "A restart replays the batch shapes", "Sampling batches are padded").
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path

from shared import WARMED, WARMUP_FILE_ENV

MAX_SHAPES = 4  # replayed at most; the most used first
BUDGET_S = 5.0  # no new shape is started after this many seconds of warm-up
MAX_RECORDED = 32  # shapes kept in the file (the least used go first)
KINDS = ("forward_backward", "forward")


def load(path: Path) -> dict[str, int]:
    """{'kind:batch:length': times served} from an earlier run; empty when absent or unreadable."""
    try:
        data = json.loads(path.read_text())
        return {k: int(v) for k, v in data.get("shapes", {}).items() if k.split(":")[0] in KINDS}
    except (OSError, ValueError, AttributeError):
        return {}


def save(path: Path, shapes: dict[str, int]) -> None:
    kept = dict(sorted(shapes.items(), key=lambda kv: -kv[1])[:MAX_RECORDED])
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"shapes": kept}, indent=1))
        os.replace(tmp, path)
    except OSError as e:  # a read-only home costs the next start its warm-up, nothing else
        print(f"[rlcli warmup] could not record shapes in {path}: {e}", file=sys.stderr, flush=True)


class Shapes:
    """The shapes this process serves, recorded in its file (none on workers and Ray actors: no file there)."""

    def __init__(self, path: Path | None):
        self.path, self.replaying = path, False
        self.recorded = load(path) if path else {}

    @classmethod
    def from_env(cls) -> Shapes:
        return cls(Path(os.environ[WARMUP_FILE_ENV]) if os.environ.get(WARMUP_FILE_ENV) else None)

    def record(self, kind: str, prepared_batch) -> None:
        from skyrl.tx.utils.models import round_up_seq_len

        inputs = prepared_batch.all_model_inputs
        if self.replaying or not inputs or self.path is None:
            return
        tokens = max(sum(len(c.tokens) for c in mi.chunks if hasattr(c, "tokens")) for mi in inputs)
        key = f"{kind}:{len(inputs)}:{round_up_seq_len(tokens)}"
        new = key not in self.recorded
        self.recorded[key] = self.recorded.get(key, 0) + 1
        if new or self.recorded[key] in (2, 10, 100):  # new shapes at once, use counts now and then
            save(self.path, self.recorded)


def _batch(types, model_id: str, batch: int, length: int):
    """batch sequences of `length` tokens, all loss weights zero: gradients are exactly zero."""
    zeros_i, zeros_f = [0] * length, [0.0] * length
    return types.PreparedModelPassBatch(
        all_model_inputs=[types.ModelInput(chunks=[types.EncodedTextChunk(tokens=zeros_i)]) for _ in range(batch)],
        all_targets=[zeros_i] * batch, all_token_weights=[zeros_f] * batch,
        all_sampling_logprobs=[zeros_f] * batch, all_advantages=[zeros_f] * batch,
        all_values=[[] for _ in range(batch)], all_returns=[[] for _ in range(batch)],
        all_model_ids=[model_id] * batch, all_loss_fns=["cross_entropy"] * batch,
        all_loss_fn_configs=[None] * batch, request_batch_slices=[("rlcli-warmup", model_id, 0, batch)],
    )


def replay(backend) -> None:
    """Run the most used recorded shapes on a scratch model (one jax process only); log what it did."""
    import jax
    from skyrl.tinker import types

    shapes = backend.shapes
    if jax.process_count() > 1 or not shapes.recorded:
        return
    start, done = time.perf_counter(), 0
    model_id = f"rlcli-warmup-{secrets.token_hex(4)}"
    try:
        backend.create_model(model_id, types.LoraConfig(rank=1, alpha=1.0, seed=0))
        shapes.replaying = True
        try:
            for key, _count in sorted(shapes.recorded.items(), key=lambda kv: -kv[1])[:MAX_SHAPES]:
                if time.perf_counter() - start > BUDGET_S:
                    break
                kind, batch, length = key.split(":")
                getattr(backend, kind)(_batch(types, model_id, int(batch), int(length)))
                done += 1
            adam = types.AdamParams(learning_rate=0.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)
            backend.optim_step(model_id, types.OptimStepInput(adam_params=adam))
        finally:
            shapes.replaying = False
            backend.delete_model(model_id)
    except Exception as e:  # a warm-up is an optimisation: never keep the engine from serving
        print(f"[rlcli warmup] warm-up skipped: {e!r}", file=sys.stderr, flush=True)
        return
    print(f"{WARMED} {done} recorded batch shapes and optim_step in {time.perf_counter() - start:.2f} s",
          file=sys.stderr, flush=True)


def sampling_batch(total: int, fsdp: int = 1) -> int:
    """The size a sampling batch of `total` sequences is padded to: 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, ...,
    then up to a multiple of the fsdp axis (every process of the mesh computes the same rows)."""
    size = 1
    while size < total:
        if size < 8:
            size *= 2
        elif size & (size - 1) == 0:  # a power of two: 1.5x
            size = size * 3 // 2
        else:  # 1.5 times a power of two: the next power
            size = size * 4 // 3
    return -(-size // fsdp) * fsdp


def padded(prepared_batch, fsdp: int, cap: int):
    """The batch with copies of its first sequence (prompt, parameters, seed, model) up to sampling_batch(N); as is
    under the user's cap (SkyRL pads to it). SkyRL answers each request from its own slice, so the copies' results
    go nowhere; repeating the first sequence, they stop when it stops and never lengthen the decode loop."""
    total = len(prepared_batch.all_model_inputs)
    size = sampling_batch(total, fsdp)
    if cap > 0 or size == total:
        return prepared_batch
    extra = size - total
    per_sequence = {name: value + value[:1] * extra for name, value in prepared_batch
                    if name.startswith("all_") and isinstance(value, list) and len(value) == total}
    return prepared_batch.model_copy(update=per_sequence)


def describe() -> dict:
    """What the capabilities route says (API process): the shapes the next start will replay."""
    shapes = Shapes.from_env().recorded
    return {"recorded_shapes": len(shapes), "replayed_at_start": min(len(shapes), MAX_SHAPES),
            "budget_s": BUDGET_S, "optimizer_transform": "shared by every model",
            "sampling_batches": "1, 2, 4, 8, 12, 16, 24, 32, ... sequences (copies of the first added) unless "
                                "sample_max_num_sequences is set"}
