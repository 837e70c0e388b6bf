"""Which tenant created each id (`--tenants`): the gate (rlcli_tenants) appends [kind, id, tenant] lines to
shared.OWNERS_FILE (0600), the engine (rlcli_engine.FairEngine) reads the models'. The newest KEEP_FUTURES futures
and every one not yet retrieved are kept; the file is rewritten atomically at start and every 2 x KEEP_FUTURES.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path

KEEP_FUTURES = 10_000


class Owners:
    """The gate's view: id -> tenant, models held and futures waiting per tenant; appends to the file."""

    def __init__(self, path: Path, keep_futures: int = KEEP_FUTURES):
        self.path, self.keep = path, keep_futures
        self.owner: dict[str, str] = {}
        self.kind: dict[str, str] = {}  # id -> what it is, for the compacted file
        self.futures: dict[str, None] = {}  # future ids, oldest first
        self.models: dict[str, set[str]] = {}  # tenant -> model ids it holds (for max_models)
        self.queued: dict[str, set[str]] = {}  # tenant -> request ids not yet retrieved (for max_queued)
        self.lock = threading.Lock()
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    kind, ident, tenant = json.loads(line)
                except ValueError:
                    continue
                self._apply(kind, ident, tenant)
            self.compact()

    def _apply(self, kind: str, ident: str, tenant: str) -> None:
        if kind == "unload":
            self.models.get(tenant, set()).discard(ident)
            return
        self.owner[ident], self.kind[ident] = tenant, kind
        if kind == "model":
            self.models.setdefault(tenant, set()).add(ident)
        elif kind == "future":
            self.futures[ident] = None

    def record(self, kind: str, ident: str, tenant: str) -> None:
        with self.lock:
            self._apply(kind, ident, tenant)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(json.dumps([kind, ident, tenant]) + "\n")
            if len(self.futures) > 2 * self.keep:
                self.compact()

    def compact(self) -> None:
        """Forget all but the newest `keep` retrieved futures and rewrite the file with what is left."""
        waiting = set().union(*self.queued.values()) if self.queued else set()
        old = list(self.futures)[:max(0, len(self.futures) - self.keep)]
        for ident in old:
            if ident not in waiting:
                del self.futures[ident], self.owner[ident], self.kind[ident]
        lines = [[kind, ident, self.owner[ident]] for ident, kind in self.kind.items()]
        lines += [["unload", ident, self.owner[ident]] for ident, kind in self.kind.items()
                  if kind == "model" and ident not in self.models.get(self.owner[ident], ())]
        fd, staged = tempfile.mkstemp(dir=self.path.parent, prefix=".tenant-owners-")  # 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
            os.replace(staged, self.path)
        except BaseException:
            Path(staged).unlink(missing_ok=True)
            raise


class ModelTenants:
    """The engine's view: model id -> tenant, read as the file grows (and again from the start when it is
    replaced by a compaction). A model nobody owns (created before --tenants) is a tenant of its own."""

    def __init__(self, path: Path):
        self.path, self.offset, self.inode = path, 0, None
        self.tenant: dict[str, str] = {}

    def refresh(self) -> None:
        try:
            st = self.path.stat()
        except OSError:
            return
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.inode, self.offset, self.tenant = st.st_ino, 0, {}
        if st.st_size == self.offset:
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[:data.rfind(b"\n") + 1]  # a line the gate is still writing is read next time
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                kind, ident, tenant = json.loads(line)
            except ValueError:
                continue
            if kind == "model":
                self.tenant[ident] = tenant

    def __call__(self, model_id: str) -> str:
        return self.tenant.get(model_id, "model:" + str(model_id))
