"""Sampler weights on the jax backend: an older checkpoint is sampled on a borrowed slot (never over a training
model's weights), the weights it read stay in memory, and unnamed per-step snapshots do not pile up. Used by
rlcli_backend and rlcli_engine. docs/upstream/sampler-checkpoint-slot.md, sampler-snapshots.md.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from pathlib import PurePath

from shared import SAMPLER_CACHE_ENV, SNAPSHOTS_ENV

DEFAULT_KEEP = 4
DEFAULT_CACHE = 8
SUFFIX = ".tar.gz"  # SkyRL names a sampler checkpoint's file NAME.tar.gz


def log(message: str) -> None:
    print(f"[rlcli samplers] {message}", file=sys.stderr, flush=True)


def _whole_number(variable: str, default: int, least: int, meaning: str) -> int:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < least:
        at_least = f" of at least {least}" if least else ""
        raise SystemExit(f"rlcli samplers: {variable}={raw!r}: give a whole number{at_least} ({meaning})")
    return int(raw)


def keep_count() -> int:
    return _whole_number(SNAPSHOTS_ENV, DEFAULT_KEEP, 1, "unnamed sampler snapshots kept per model")


def cache_size() -> int:
    return _whole_number(SAMPLER_CACHE_ENV, DEFAULT_CACHE, 0, "sampler checkpoints whose weights stay in memory; "
                                                              "0 reads the file at every borrowed-slot sample")


def checkpoint_name(output_path) -> str:
    name = PurePath(str(output_path)).name
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


class Snapshots:
    """One backend process's unnamed sampler snapshots per model, oldest first, and those it deleted."""

    def __init__(self, keep: int, records_rows: bool):
        self.keep = keep
        self.kept: dict[str, list] = {}  # model_id -> [(name, path)], in the order they were saved
        self.deleted: dict[str, set[str]] = {}  # model_id -> names of snapshots deleted while it lives
        self.rows: list[tuple[str, str]] = []  # (model_id, name) whose database rows the engine drops
        self.records_rows = records_rows  # process 0 only: the engine, which owns the database

    @contextlib.contextmanager
    def saving(self, model_id: str, path, persist: bool):
        """Around a save: an unnamed one first deletes the oldest beyond keep - 1 (a full disk gets room first);
        one that fails leaves nothing behind (what it wrote is no snapshot)."""
        kept = self.kept.get(model_id, [])
        while not persist and len(kept) >= self.keep:
            self.delete(model_id, *kept.pop(0))
        try:
            yield
        except BaseException:
            if not persist:
                self.delete(model_id, checkpoint_name(path), path)
            raise
        self.saved(model_id, checkpoint_name(path), path, persist)

    def saved(self, model_id: str, name: str, path, persist: bool) -> None:
        kept = self.kept.setdefault(model_id, [])
        kept[:] = [(n, p) for n, p in kept if n != name]  # saved again under that name: the newest save decides
        self.deleted.get(model_id, set()).discard(name)
        if not persist:
            kept.append((name, path))
        while len(kept) > self.keep:
            self.delete(model_id, *kept.pop(0))

    def model_gone(self, model_id: str) -> None:
        for name, path in self.kept.pop(model_id, []):
            self.delete(model_id, name, path)
        self.deleted.pop(model_id, None)

    def delete(self, model_id: str, name: str, path) -> None:
        for f in (path, path.with_name(path.name + ".probe")):
            try:
                f.unlink(missing_ok=True)
            except OSError as e:  # the snapshot is still refused below: nothing samples a half-deleted file
                log(f"could not delete {f}: {e}")
        self.deleted.setdefault(model_id, set()).add(name)
        if self.records_rows:
            self.rows.append((model_id, name))

    def refusal(self, model_id: str, name: str) -> str | None:
        if name not in self.deleted.get(model_id, ()):
            return None
        return (f"sampler weights tinker://{model_id}/sampler_weights/{name} were deleted: the server keeps the "
                f"newest {self.keep} unnamed snapshots (save_weights_and_get_sampling_client) per model "
                f"({SNAPSHOTS_ENV}, `rlcli serve start --sampler-snapshots`); sample a newer one, or save named "
                "weights (save_weights_for_sampler(name)) to sample them later")


def file_identity(path) -> tuple | None:
    """Device, inode, size, mtime: what tells a file from its replacement. None: gone, or not on this machine."""
    if "://" in str(path):
        return None
    try:
        st = os.stat(str(path))
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class Sampled:
    """The adapter weights of sampler checkpoints a borrowed slot read from their files: the `size` most recently
    sampled (model_id, name) pairs, each with its file's identity when it was read. size 0: nothing kept."""

    def __init__(self, size: int):
        self.size = size
        self.entries: collections.OrderedDict = collections.OrderedDict()  # (model_id, name) -> (identity, state)

    def get(self, model_id: str, name: str, path):
        entry = self.entries.get((model_id, name))
        if entry is None:
            return None
        if entry[0] != file_identity(path):  # deleted, or saved again under the name: the file decides
            del self.entries[(model_id, name)]
            return None
        self.entries.move_to_end((model_id, name))
        return entry[1]

    def put(self, model_id: str, name: str, path, state) -> None:
        identity = file_identity(path)
        if identity is None or self.size < 1:
            return
        self.entries[(model_id, name)] = (identity, state)
        self.entries.move_to_end((model_id, name))
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    def drop(self, model_id: str, name: str | None = None) -> None:
        for key in [k for k in self.entries if k[0] == model_id and name in (None, k[1])]:
            del self.entries[key]


@contextlib.contextmanager
def borrowed_slots(backend, prepared_batch):
    """Around a sample: each model asked for a checkpoint its slot does not hold gets it on a borrowed slot. The live
    adapter is set aside (the engine runs one batch at a time, so no training request sees the borrowed weights) and
    kept weights go in where there are some (marked, so SkyRL's load_sampler_weights skips the file); after the sample
    the weights read from a file stay in memory; whatever happens, every slot gets its live adapter and mark back."""
    import jax
    from skyrl.tx.utils import models

    def weights(meta):
        with jax.set_mesh(backend.mesh):
            return models.extract_adapter_state(meta.adapter_index, backend.lora_params, meta.lora_config.rank)

    def put(meta, state) -> None:
        with jax.set_mesh(backend.mesh):
            models.insert_adapter_state(meta.adapter_index, backend.lora_params, state, meta.lora_config.rank)

    aside = {}  # model_id -> (live adapter, mark, checkpoint, path, from memory)
    wanted = zip(prepared_batch.all_model_ids, prepared_batch.all_checkpoint_ids,
                 prepared_batch.all_checkpoint_paths, strict=True)
    try:
        for model_id, checkpoint_id, path in wanted:
            meta = backend.models.get(model_id) if model_id else None
            if meta is None or model_id in aside or meta.loaded_checkpoint_id == checkpoint_id:
                continue
            kept = backend.sampled.get(model_id, checkpoint_id, path)
            aside[model_id] = (weights(meta), meta.loaded_checkpoint_id, checkpoint_id, path, kept is not None)
            if kept is not None:
                put(meta, kept)
                meta.loaded_checkpoint_id = checkpoint_id
        yield
        for model_id, (_, _, checkpoint_id, path, from_memory) in aside.items():
            meta = backend.models.get(model_id)
            if not from_memory and meta is not None and meta.loaded_checkpoint_id == checkpoint_id:
                backend.sampled.put(model_id, checkpoint_id, path, weights(meta))
    finally:
        for model_id, (live, mark, *_) in aside.items():
            if (meta := backend.models.get(model_id)) is not None:
                put(meta, live)
                meta.loaded_checkpoint_id = mark


def refuse_deleted(backend, errors: dict, valid: dict) -> None:
    """The engine's request filter: a sample of a snapshot this server deleted fails with one line that says so."""
    from skyrl.tinker import types

    snapshots = getattr(backend, "snapshots", None)
    for request_id, (model_id, data) in list(valid.items()) if snapshots else ():
        if isinstance(data, types.SampleInput) and model_id:
            if reason := snapshots.refusal(model_id, data.checkpoint_id):
                errors[request_id] = types.ErrorResponse(error=reason, status="failed")
                del valid[request_id]


def drop_rows(engine) -> None:
    """Delete the database rows of the snapshots deleted since the last call (the listing then omits them)."""
    snapshots = getattr(engine.backend, "snapshots", None)
    if snapshots is not None and snapshots.rows:
        rows, snapshots.rows = snapshots.rows, []
        delete_rows(engine, rows)


def delete_rows(engine, rows: list[tuple[str, str]]) -> None:
    from skyrl.tinker import types
    from skyrl.tinker.db_models import CheckpointDB
    from sqlmodel import Session, delete

    if not rows:
        return
    with Session(engine.db_engine) as session:
        for model_id, name in rows:
            session.exec(delete(CheckpointDB).where(
                CheckpointDB.model_id == model_id, CheckpointDB.checkpoint_id == name,
                CheckpointDB.checkpoint_type == types.CheckpointType.SAMPLER))
        session.commit()


def sweep(engine) -> int:
    """Delete the unnamed snapshots an earlier server left (its models were loaded when it stopped, and no model is
    loaded at a start), told apart as at save time from the save requests in the database (the newest save of a
    name decides). Returns how many files it deleted."""
    from skyrl.tinker import types
    from skyrl.tinker.db_models import FutureDB
    from sqlmodel import Session, select

    newest: dict[tuple[str, str], bool] = {}  # (model_id, name) -> its newest save was unnamed
    with Session(engine.db_engine) as session:
        saves = session.exec(select(FutureDB.model_id, FutureDB.request_data)
                             .where(FutureDB.request_type == types.RequestType.SAVE_WEIGHTS_FOR_SAMPLER)
                             .order_by(FutureDB.request_id)).all()
    for model_id, data in saves:
        name = PurePath(str((data or {}).get("path") or "")).name
        if model_id and name:
            newest[(model_id, name)] = (data or {}).get("sampling_session_seq_id") is not None
    found = Snapshots(keep=1, records_rows=True)
    for (model_id, name), unnamed in newest.items():
        path = engine.config.checkpoints_base / model_id / "sampler_weights" / f"{name}{SUFFIX}"
        if unnamed and not engine.backend.has_model(model_id) and path.exists():
            found.delete(model_id, name, path)
    delete_rows(engine, found.rows)
    return len(found.rows)


def describe() -> dict:
    """What the capabilities route says (API process)."""
    return {"sampler_checkpoints": "sampled on a borrowed slot; a training model's weights are never replaced",
            "sampler_weights_in_memory":
                f"the weights of the {cache_size()} most recently sampled checkpoints ({SAMPLER_CACHE_ENV})",
            "sampler_snapshots": f"the newest {keep_count()} unnamed snapshots per model are kept; all of a "
                                 "model's go when it is unloaded; named sampler checkpoints are never deleted"}
