"""rlcli server extension: a restarted engine traces what its earlier runs used before it serves, and a new
model's first optim_step reuses what the previous model's traced.

Runs INSIDE the server venv (stdlib + skyrl + jax), loaded by rlcli's launcher in the engine process when
RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, unless --no-extensions).

Why: jax's persistent compilation cache (RLCLI_HOME/cache/jax) saves a restart the XLA compilation, not the
tracing and lowering that come before the cache lookup. On the embedded model the first SFT step after a warm
start still took ~0.55 s in the engine for forward_backward (0.2 s tracing, 0.15 s lowering, 0.08 s loading the
cached program) and ~0.12 s for optim_step, against ~0.04 s and ~0.01 s for the steps after it: ~10x.
Those costs are paid once per process and per batch shape (SkyRL pads sequences to round_up_seq_len, so a
training run uses few shapes).

How: the engine records each (request kind, batch size, padded length) of forward and forward_backward it
serves in RLCLI_WARMUP_FILE (a small JSON file per model and backend config, written when a new shape
appears). At the next start, before its loop serves anything, it creates a scratch LoRA model, runs the
recorded shapes (most used first, at most MAX_SHAPES, within BUDGET_S) with all-zero loss weights, one
optim_step with learning rate 0, and deletes the model: zero weights give zero gradients and the slot is
cleared on delete (and zeroed on create by rlcli_slots), so no user state is touched. The time it takes is
part of `serve start` (the log says `warmed N shapes in S s`); a shape never served before still pays its
compilation on first use. Sampling shapes are not replayed.

And every model shares one optimizer transformation: SkyRL builds `optax.inject_hyperparams(optax.adamw)` anew in
each create_model, and nnx.jit keys its trace cache on the optimizer's static parts, the transformation's fresh
closures among them, so each new model's first optim_step traced compute_grads_and_update again (~0.1 s quiet,
~0.5 s on a loaded machine; the tests and RL runs create many models). The transformations are built from the
same arguments and keep their hyperparameters in each model's own optimizer state, so sharing the first one
changes no number: checked bitwise (LoRA weights after two steps, grad norm, learning rate) against a model with
its own.

And sampling batches are padded to a few sizes. SkyRL's jax backend samples the sequences of every pending
request in one batch of exactly their number unless `sample_max_num_sequences` is set, and that number is part
of the traced program: each new count traced, lowered and (when the persistent cache had never seen it)
compiled the decode loop again, ~1.5 s of tracing and lowering and up to ~6 s of compilation on 2 cores for
the embedded model; one test file's session (test_train_rl.py) sampled 23 different batches. Unless the user
set that cap, a sampling call of N sequences now samples N rounded up to 1, 2, 4, 8, 12, 16, 24, 32, 48, ...
(each step at most 1.5x from 8 on) and to a multiple of the mesh's fsdp axis: the added sequences are copies
of the first, whose results are dropped. They cost compute (at most 2x below 8 sequences, 1.5x above) and
never lengthen the decode loop, which runs until every sequence has stopped. RLCLI_EXACT_SAMPLING_BATCHES=1 in
`serve start`'s environment keeps SkyRL's batches (benchmarks/sampling_batches.py compares the two).

`python rlcli_warmup.py` checks in this venv that the pieces it relies on still exist.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import sys
import time
from pathlib import Path

NAME = "rlcli_warmup"
EXACT_ENV = "RLCLI_EXACT_SAMPLING_BATCHES"  # =1 in `serve start`'s environment: SkyRL's batches, unpadded
# Compared between the processes of one server: they must all pad sampling batches, or none.
VERSION = "1.1" + (" exact-sampling-batches" if os.environ.get(EXACT_ENV) == "1" else "")
ENV_FILE = "RLCLI_WARMUP_FILE"  # set by `rlcli serve start`: where this model's recorded shapes live
MAX_SHAPES = 4  # replayed at most; the most used first
BUDGET_S = 5.0  # no new shape is started after this many seconds of warm-up
MAX_RECORDED = 32  # shapes kept in the file (the least used go first)
KINDS = ("forward_backward", "forward")
MARK = "_rlcli_records_shapes"

_state = {"recorded": {}, "replaying": False, "file": None}


def log(message: str) -> None:
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


def _targets():
    from skyrl.backends import jax as jax_backend
    from skyrl.tinker import engine, types
    from skyrl.tx.utils import models

    impl = getattr(jax_backend, "JaxBackendImpl", None)
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path

    pins.require(NAME, {
        "JaxBackendImpl.forward_backward": getattr(impl, "forward_backward", None),
        "JaxBackendImpl.forward": getattr(impl, "forward", None),
        "JaxBackendImpl.sample": getattr(impl, "sample", None),
        "JaxBackendConfig.sample_max_num_sequences":
            "sample_max_num_sequences" in getattr(jax_backend.JaxBackendConfig, "model_fields", {}),
        "PreparedSampleBatch.all_* per sequence": {"all_model_inputs", "all_sampling_params", "all_model_ids"}
            <= set(getattr(types.PreparedSampleBatch, "model_fields", {})),
        "JaxBackendImpl.optim_step": getattr(impl, "optim_step", None),
        "JaxBackendImpl.create_model": getattr(impl, "create_model", None),
        "JaxBackendImpl.delete_model": getattr(impl, "delete_model", None),
        "TinkerEngine.run": getattr(engine.TinkerEngine, "run", None),
        "round_up_seq_len": getattr(models, "round_up_seq_len", None),
        "types.PreparedModelPassBatch": getattr(types, "PreparedModelPassBatch", None),
    })
    return impl, engine.TinkerEngine


def _key(kind: str, batch: int, length: int) -> str:
    return f"{kind}:{batch}:{length}"


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
        tmp.write_text(json.dumps({"version": VERSION, "shapes": kept}, indent=1))
        os.replace(tmp, path)
    except OSError as e:  # a read-only home costs the next start its warm-up, nothing else
        log(f"could not record shapes in {path}: {e}")


def _record(kind: str, prepared_batch) -> None:
    from skyrl.tx.utils.models import round_up_seq_len

    inputs = prepared_batch.all_model_inputs
    if _state["replaying"] or not inputs or _state["file"] is None:
        return
    length = round_up_seq_len(max(sum(len(c.tokens) for c in mi.chunks if hasattr(c, "tokens")) for mi in inputs))
    key = _key(kind, len(inputs), length)
    shapes = _state["recorded"]
    new = key not in shapes
    shapes[key] = shapes.get(key, 0) + 1
    if new or shapes[key] in (2, 10, 100):  # the file learns new shapes at once, use counts now and then
        save(_state["file"], shapes)


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


def warm(backend, impl, shapes: dict[str, int]) -> tuple[int, float]:
    """Run the most used recorded shapes on a scratch model; (shapes run, seconds)."""
    import jax
    from skyrl.tinker import types

    if jax.process_count() > 1 or not shapes:
        return 0, 0.0
    start = time.perf_counter()
    model_id = f"rlcli-warmup-{secrets.token_hex(4)}"
    impl.create_model(backend, model_id, types.LoraConfig(rank=1, alpha=1.0, seed=0))
    done = 0
    _state["replaying"] = True
    try:
        for key, _count in sorted(shapes.items(), key=lambda kv: -kv[1])[:MAX_SHAPES]:
            if time.perf_counter() - start > BUDGET_S:
                break
            kind, batch, length = key.split(":")
            getattr(impl, kind)(backend, _batch(types, model_id, int(batch), int(length)))
            done += 1
        adam = types.AdamParams(learning_rate=0.0, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)
        impl.optim_step(backend, model_id, types.OptimStepInput(adam_params=adam))
    finally:
        _state["replaying"] = False
        impl.delete_model(backend, model_id)
    return done, time.perf_counter() - start


def share_optimizer_transform(impl) -> None:
    """After create_model, give the new model's optimizer the transformation the first model's got."""
    original = impl.create_model

    @functools.wraps(original)
    def create_model(self, model_id, lora_config, model_role="policy"):
        original(self, model_id, lora_config, model_role)
        optimizer = self.optimizers.get(model_id)
        shared = getattr(self, "_rlcli_shared_tx", None)
        if optimizer is None or not hasattr(optimizer, "tx"):
            return
        if shared is None:
            self._rlcli_shared_tx = optimizer.tx
        else:
            optimizer.tx = shared

    impl.create_model = create_model


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


def pad_sampling_batches(impl) -> None:
    """Each sampling call without the user's cap samples sampling_batch(its count) sequences: the missing ones
    are copies of its first (prompt, parameters, seed, model). SkyRL answers each request from its own slice of
    the batch, so the copies' results go nowhere; being the first sequence again, they stop when it stops, and
    the decode loop (which runs until every row has stopped) runs no longer than for the real ones."""
    original = impl.sample
    if getattr(original, MARK, False):
        return

    @functools.wraps(original)
    def sample(self, prepared_batch):
        total = len(prepared_batch.all_model_inputs)
        size = sampling_batch(total, self.mesh.shape["fsdp"])
        if self.config.sample_max_num_sequences > 0 or size == total:  # the user's cap: SkyRL pads to it
            return original(self, prepared_batch)
        extra = size - total
        per_sequence = {name: value + value[:1] * extra for name, value in prepared_batch
                        if name.startswith("all_") and isinstance(value, list) and len(value) == total}
        return original(self, prepared_batch.model_copy(update=per_sequence))

    setattr(sample, MARK, True)
    impl.sample = sample


def install(path: Path) -> None:
    impl, engine_class = _targets()
    if getattr(impl.forward_backward, MARK, False):
        return
    share_optimizer_transform(impl)
    _state["file"] = path
    _state["recorded"] = load(path)
    for kind in KINDS:
        original = getattr(impl, kind)

        def wrapped(self, prepared_batch, _original=original, _kind=kind):
            _record(_kind, prepared_batch)
            return _original(self, prepared_batch)

        functools.update_wrapper(wrapped, original)
        setattr(wrapped, MARK, True)
        setattr(impl, kind, wrapped)
    original_run = engine_class.run

    @functools.wraps(original_run)
    def run(self):
        if _state["recorded"]:
            try:
                done, seconds = warm(self.backend, impl, dict(_state["recorded"]))
                log(f"warmed {done} recorded batch shapes and optim_step in {seconds:.2f} s")
            except Exception as e:  # a warm-up is an optimisation: never keep the engine from serving
                log(f"warm-up skipped: {e!r}")
        return original_run(self)

    engine_class.run = run


def describe() -> dict:
    """What the capabilities route says (API process): the shapes the next start will replay."""
    path = os.environ.get(ENV_FILE)
    shapes = load(Path(path)) if path else {}
    return {"recorded_shapes": len(shapes), "replayed_at_start": min(len(shapes), MAX_SHAPES),
            "budget_s": BUDGET_S, "optimizer_transform": "shared by every model",
            "sampling_batches": "as SkyRL batches them (RLCLI_EXACT_SAMPLING_BATCHES=1)"
            if os.environ.get(EXACT_ENV) == "1" else "1, 2, 4, 8, 12, 16, 24, 32, ... sequences (copies of the "
                                                      "first added) unless sample_max_num_sequences is set"}


def register(role: str) -> None:
    if role != "engine":
        return
    argv = sys.argv[2:] if sys.argv[1:2] == ["engine"] else sys.argv[1:]
    if "--backend" in argv and argv[argv.index("--backend") + 1] != "jax":
        return
    impl, _ = _targets()
    if os.environ.get(EXACT_ENV) != "1":
        pad_sampling_batches(impl)
    path = os.environ.get(ENV_FILE)
    if not path:
        log(f"no {ENV_FILE}: shapes are neither recorded nor replayed")
        return
    install(Path(path))
    known = len(_state["recorded"])
    log(f"records batch shapes in {Path(path).name}; {known} from earlier runs" if known else
        f"records batch shapes in {Path(path).name} for the next start")


if __name__ == "__main__":
    _targets()
    sizes = [sampling_batch(n) for n in range(1, 50)]
    assert all(n <= size < 2 * n or n == size for n, size in enumerate(sizes, 1)), sizes
    assert sorted(set(sizes)) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64], sorted(set(sizes))
    print(f"{NAME} {VERSION}: JaxBackendImpl forward/forward_backward/sample/optim_step/create_model/delete_model, "
          "the sample_max_num_sequences setting, TinkerEngine.run and round_up_seq_len present")
