"""rlcli server extension: sampler weights on the jax backend. Sampling a saved checkpoint never changes the
model that is training, and the unnamed snapshots the RL loops save every step do not pile up on disk.

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
The weights a borrowed slot read from a checkpoint's file are kept in memory (the CACHE_ENV, default 8, most
recently sampled checkpoints of all models, each with its file's identity when it was read): sampling that
checkpoint again, as an RL loop whose sampler lags its trainer or an evaluation of a fixed checkpoint does,
inserts them instead of unpacking the file again (a sample of the 26M benchmark model: ~0.7 s -> ~0.2 s; 0.12
s with no borrowing). A save under the name, the model's deletion, or a file that is gone or no longer the one
that was read drops the entry. A server of several jax processes reads the file every time: each process would
otherwise decide on its own copy of the file, and their collective programs must stay in step.

Snapshots: `save_weights_and_get_sampling_client()` (tinker) sends save_weights_for_sampler with a
sampling_session_seq_id and no name; SkyRL names the file ss<N>_seq<M> and passes `persist=False` to the
backend, but the jax backend writes it like any other (<checkpoints-base>/<model>/sampler_weights/
ss<N>_seq<M>.tar.gz, and a .probe file beside it) and nothing ever removes either: one per RL step, for good.
Hosted Tinker treats these as ephemeral. Here each process keeps at most KEEP_ENV (default 4) such
snapshots per model, the newest in the order it saved them: before writing a new one it deletes the oldest
(file, probe and the checkpoint's database row), so a full disk gets room first; a save that fails leaves
nothing behind; all of a model's go when the model is deleted (unload, or its session timed out), and a
start deletes those of models an earlier server left loaded (none can be loaded again). Named
sampler checkpoints (save_weights_for_sampler(name), `persist=True`) are never touched, even one that
reuses an unnamed snapshot's name. A sample of a deleted snapshot is refused with a line that says so
(what was deleted, why, what to do) rather than failing on a missing file.
Every process of a multi-process server runs the same saves and deletes (a worker on another machine
writes its own copies), so the kept count is part of this extension's version, which the processes compare.

`python rlcli_samplers.py` checks in this venv that the pieces it relies on still exist.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import PurePath

NAME = "rlcli_samplers"
KEEP_ENV = "RLCLI_SAMPLER_SNAPSHOTS"  # unnamed sampler snapshots kept per model (`serve start --sampler-snapshots`)
DEFAULT_KEEP = 4
CACHE_ENV = "RLCLI_SAMPLER_CACHE"  # sampler checkpoints whose weights stay in memory for borrowed slots (0: none)
DEFAULT_CACHE = 8
VERSION = f"1.2 keep={os.environ.get(KEEP_ENV, '').strip() or DEFAULT_KEEP}"  # compared between processes
MARK = "_rlcli_sampler_checkpoints_kept_apart"
SUFFIX = ".tar.gz"  # SkyRL names a sampler checkpoint's file NAME.tar.gz


def log(message: str) -> None:
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


def _whole_number(variable: str, default: int, least: int, meaning: str) -> int:
    raw = os.environ.get(variable, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < least:
        at_least = f" of at least {least}" if least else ""
        raise SystemExit(f"{NAME}: {variable}={raw!r}: give a whole number{at_least} ({meaning})")
    return int(raw)


def keep_count() -> int:
    return _whole_number(KEEP_ENV, DEFAULT_KEEP, 1, "unnamed sampler snapshots kept per model")


def cache_size() -> int:
    return _whole_number(CACHE_ENV, DEFAULT_CACHE, 0, "sampler checkpoints whose weights stay in memory; 0 reads "
                                                      "the file at every borrowed-slot sample")


def _targets():
    from skyrl.backends import jax as jax_backend
    from skyrl.tinker import db_models, engine, types
    from skyrl.tx.utils import models

    impl = getattr(jax_backend, "JaxBackendImpl", None)
    coordinator = getattr(jax_backend, "JaxBackend", None)
    tinker_engine = getattr(engine, "TinkerEngine", None)
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path

    pins.require(NAME, {
        **{f"JaxBackendImpl.{m}": getattr(impl, m, None)
           for m in ("sample", "load_sampler_weights", "save_sampler_checkpoint", "optim_step", "load_checkpoint",
                     "delete_model")},
        "JaxBackend.save_sampler_checkpoint (writes the probe, then broadcasts)":
            "save_sampler_checkpoint" in vars(coordinator or object),
        **{f"TinkerEngine.{m}": getattr(tinker_engine, m, None)
           for m in ("__init__", "_filter_valid_requests", "process_single_request", "cleanup_stale_sessions")},
        "FutureDB request_type, model_id, request_data":
            {"request_type", "model_id", "request_data"} <= set(getattr(db_models.FutureDB, "model_fields", {})),
        "models.extract_adapter_state": getattr(models, "extract_adapter_state", None),
        "models.insert_adapter_state": getattr(models, "insert_adapter_state", None),
        "ModelMetadata.loaded_checkpoint_id":
            "loaded_checkpoint_id" in getattr(types.ModelMetadata, "model_fields", {}),
        "SampleInput.checkpoint_id": "checkpoint_id" in getattr(types.SampleInput, "model_fields", {}),
        "PreparedSampleBatch all_model_ids, all_checkpoint_ids, all_checkpoint_paths":
            {"all_model_ids", "all_checkpoint_ids", "all_checkpoint_paths"}
            <= set(getattr(types.PreparedSampleBatch, "model_fields", {})),
        "CheckpointDB key (model_id, checkpoint_id, checkpoint_type)": {"model_id", "checkpoint_id", "checkpoint_type"}
            <= set(getattr(db_models.CheckpointDB, "model_fields", {})),
        "JaxBackendImpl.save_sampler_checkpoint(persist=...)":
            _takes(getattr(impl, "save_sampler_checkpoint", None), "persist"),
    })
    return impl, coordinator, tinker_engine, models


def _takes(fn, parameter: str) -> bool:
    import inspect

    try:
        return parameter in inspect.signature(fn).parameters  # through functools.wraps to the original
    except (TypeError, ValueError):
        return False


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

    def make_room(self, model_id: str) -> None:
        """Before an unnamed save: the disk never holds more than `keep`, and a full disk gets room first."""
        kept = self.kept.get(model_id, [])
        while len(kept) >= self.keep:
            self.delete(model_id, *kept.pop(0))

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
                f"({KEEP_ENV}, `rlcli serve start --sampler-snapshots`); sample a newer one, or save named "
                "weights (save_weights_for_sampler(name)) to sample them later")


def file_identity(path) -> tuple | None:
    """What tells one file from its replacement: device, inode, size, modification time. None for a file that
    is gone or not on this machine's file system (a cloud path)."""
    text = str(path)
    if "://" in text:
        return None
    try:
        st = os.stat(text)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class Sampled:
    """The adapter weights of sampler checkpoints a borrowed slot read from their files: the `size` most recently
    sampled (model_id, name) pairs, each with its file's identity when it was read."""

    def __init__(self, size: int):
        import collections

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


def sampled(backend) -> Sampled | None:
    """This process's kept sampler weights; None where they are not kept (off, or several jax processes)."""
    found = backend.__dict__.get("_rlcli_sampled")
    if found is None:
        import jax

        size = cache_size() if jax.process_count() == 1 else 0
        found = backend.__dict__["_rlcli_sampled"] = Sampled(size)
    return found if found.size > 0 else None


def snapshots(backend) -> Snapshots:
    found = backend.__dict__.get("_rlcli_snapshots")
    if found is None:
        found = backend.__dict__["_rlcli_snapshots"] = Snapshots(keep_count(), getattr(backend, "process_id", 0) == 0)
    return found


def drop_rows(engine) -> None:
    """Delete the database rows of the snapshots deleted since the last call (the listing then omits them)."""
    found = engine.backend.__dict__.get("_rlcli_snapshots")
    if found is not None and found.rows:
        rows, found.rows = found.rows, []
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
    """Delete the unnamed snapshots an earlier server left (its models were loaded when it stopped): at start
    no model is loaded, so none can be sampled again. Told apart as at save time, from the save requests in
    the database (the newest save of a name decides). Returns how many files it deleted."""
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
    deleted = 0
    for (model_id, name), unnamed in newest.items():
        path = engine.config.checkpoints_base / model_id / "sampler_weights" / f"{name}{SUFFIX}"
        if unnamed and not engine.backend.has_model(model_id) and path.exists():
            found.delete(model_id, name, path)
            deleted += 1
    delete_rows(engine, found.rows)
    return deleted


def unnamed_saves_make_room(save):
    """Around a save: an unnamed one first deletes the oldest kept beyond K - 1; one that fails leaves nothing."""

    @functools.wraps(save)
    def wrapper(self, output_path, model_id, *args, **kwargs):
        if kwargs.get("persist", args[0] if args else True):
            return save(self, output_path, model_id, *args, **kwargs)
        snapshots(self).make_room(model_id)
        try:
            return save(self, output_path, model_id, *args, **kwargs)
        except BaseException:  # e.g. a full disk: what it wrote of the file (or of its probe) is no snapshot
            snapshots(self).delete(model_id, checkpoint_name(output_path), output_path)
            raise

    return wrapper


def install() -> None:
    impl, coordinator, tinker_engine, models = _targets()
    if getattr(impl.sample, MARK, False):
        return
    keep_count()  # a bad setting stops the start, not the first save
    cache_size()
    install_snapshots(impl, tinker_engine)
    # Process 0's JaxBackend writes a probe file before the broadcast reaches JaxBackendImpl in every process:
    # room is made before that write too, or a disk full to the last byte would fail on the probe.
    coordinator.save_sampler_checkpoint = unnamed_saves_make_room(coordinator.save_sampler_checkpoint)
    original_sample, original_save = impl.sample, unnamed_saves_make_room(impl.save_sampler_checkpoint)
    original_optim, original_load = impl.optim_step, impl.load_checkpoint

    @functools.wraps(original_sample)
    def sample(self, prepared_batch):
        import jax

        kept = sampled(self)
        aside = {}  # model_id -> (its live adapter, its mark, the checkpoint sampled, its file)
        from_memory = set()  # models whose checkpoint came from kept weights, not from its file
        wanted = zip(prepared_batch.all_model_ids, prepared_batch.all_checkpoint_ids,
                     prepared_batch.all_checkpoint_paths, strict=True)
        for model_id, checkpoint_id, path in wanted:
            meta = self.models.get(model_id) if model_id else None
            if meta is None or model_id in aside or meta.loaded_checkpoint_id == checkpoint_id:
                continue
            with jax.set_mesh(self.mesh):
                live = models.extract_adapter_state(meta.adapter_index, self.lora_params, meta.lora_config.rank)
            aside[model_id] = (live, meta.loaded_checkpoint_id, checkpoint_id, path)
            weights = kept.get(model_id, checkpoint_id, path) if kept is not None else None
            if weights is not None:
                with jax.set_mesh(self.mesh):
                    models.insert_adapter_state(meta.adapter_index, self.lora_params, weights, meta.lora_config.rank)
                meta.loaded_checkpoint_id = checkpoint_id  # SkyRL's load_sampler_weights: the slot holds them
                from_memory.add(model_id)
        try:
            result = original_sample(self, prepared_batch)
            for model_id, (_, _, checkpoint_id, path) in aside.items() if kept is not None else ():
                meta = self.models.get(model_id)
                if model_id not in from_memory and meta is not None and meta.loaded_checkpoint_id == checkpoint_id:
                    with jax.set_mesh(self.mesh):  # read from its file just now: keep them for the next time
                        kept.put(model_id, checkpoint_id, path, models.extract_adapter_state(
                            meta.adapter_index, self.lora_params, meta.lora_config.rank))
            return result
        finally:
            for model_id, (live, mark, _, _) in aside.items():
                meta = self.models.get(model_id)
                if meta is None:
                    continue
                with jax.set_mesh(self.mesh):
                    models.insert_adapter_state(meta.adapter_index, self.lora_params, live, meta.lora_config.rank)
                meta.loaded_checkpoint_id = mark

    @functools.wraps(original_save)
    def save_sampler_checkpoint(self, output_path, model_id, *args, **kwargs):
        original_save(self, output_path, model_id, *args, **kwargs)
        name = checkpoint_name(output_path)
        self.models[model_id].loaded_checkpoint_id = name  # the slot holds them
        if (kept := sampled(self)) is not None:
            kept.drop(model_id, name)  # saved again under that name: the old weights are not these
        snapshots(self).saved(model_id, name, output_path, kwargs.get("persist", args[0] if args else True))

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


def install_snapshots(impl, tinker_engine) -> None:
    """A model's snapshots go with it, a start deletes those an earlier server left, the engine refuses samples
    of deleted ones and drops their rows."""
    original_delete, original_init = impl.delete_model, tinker_engine.__init__
    original_filter = tinker_engine._filter_valid_requests
    original_single, original_cleanup = tinker_engine.process_single_request, tinker_engine.cleanup_stale_sessions

    @functools.wraps(original_delete)
    def delete_model(self, model_id, *args, **kwargs):
        original_delete(self, model_id, *args, **kwargs)
        snapshots(self).model_gone(model_id)  # every process: unload and a timed-out session both come here
        if (kept := sampled(self)) is not None:
            kept.drop(model_id)

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        try:
            if deleted := sweep(self):
                log(f"deleted {deleted} unnamed sampler snapshots of models an earlier server left loaded")
        except Exception as e:  # housekeeping: the server serves without it
            log(f"could not look for unnamed sampler snapshots an earlier server left: {e}")

    @functools.wraps(original_filter)
    def _filter_valid_requests(self, requests):
        from skyrl.tinker import types

        errors, valid = original_filter(self, requests)
        found = self.backend.__dict__.get("_rlcli_snapshots")
        if found is None:
            return errors, valid
        for request_id, (model_id, data) in list(valid.items()):
            if isinstance(data, types.SampleInput) and model_id:
                if reason := found.refusal(model_id, data.checkpoint_id):
                    errors[request_id] = types.ErrorResponse(error=reason, status="failed")
                    del valid[request_id]
        return errors, valid

    @functools.wraps(original_single)
    def process_single_request(self, *args, **kwargs):
        try:
            return original_single(self, *args, **kwargs)
        finally:
            drop_rows(self)

    @functools.wraps(original_cleanup)
    def cleanup_stale_sessions(self, *args, **kwargs):
        try:
            return original_cleanup(self, *args, **kwargs)
        finally:
            drop_rows(self)

    impl.delete_model, tinker_engine.__init__ = delete_model, __init__
    tinker_engine._filter_valid_requests = _filter_valid_requests
    tinker_engine.process_single_request = process_single_request
    tinker_engine.cleanup_stale_sessions = cleanup_stale_sessions


def describe() -> dict:
    """What the capabilities route says (API process; the engine refuses to start if install() fails)."""
    return {"sampler_checkpoints": "sampled on a borrowed slot; a training model's weights are never replaced",
            "sampler_weights_in_memory":
                f"the weights of the {cache_size()} most recently sampled checkpoints ({CACHE_ENV})",
            "sampler_snapshots": f"the newest {keep_count()} unnamed snapshots per model are kept; all of a "
                                 "model's go when it is unloaded; named sampler checkpoints are never deleted"}


def register(role: str) -> None:
    if role != "engine":
        return
    argv = sys.argv[2:] if sys.argv[1:2] == ["engine"] else sys.argv[1:]
    if "--backend" in argv and argv[argv.index("--backend") + 1] != "jax":
        return  # the fsdp and megatron backends serve sampler checkpoints their own way
    install()
    log(f"sampler checkpoints are sampled apart from the models that are training; the newest {keep_count()} "
        "unnamed sampler snapshots per model are kept")


if __name__ == "__main__":
    _targets()
    install()
    print(f"{NAME} {VERSION}: JaxBackendImpl sample/save/optim/load/delete, TinkerEngine's request filter, "
          "single-request and stale-session paths and the adapter-state helpers present")
