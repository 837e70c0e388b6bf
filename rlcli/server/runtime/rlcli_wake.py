"""rlcli server extension: SkyRL's API and engine wake each other instead of looking on a timer.

Runs INSIDE the server venv (Python 3.12): standard library, skyrl and what skyrl imports; never rlcli.
The launcher imports it when RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, unless
--no-extensions) and calls `register(role)` in the API and in the engine before SkyRL starts there.

Why: SkyRL 0.4.0 hands work from the API to the engine, and results back, through its database, and
each side looks on a timer: the engine sleeps 100 ms between looks at its queue
(TinkerEngine.process_pending_requests) and the API looks for finished futures every 50 ms
(skyrl.tinker.api.poll_futures). A request waits ~75 ms on average and up to 150 ms for nothing;
on the embedded model a forward of 1x16 tokens took 107-131 ms wall for a few ms of engine work.

How: the two processes ring each other's doorbell, a Linux abstract Unix datagram socket per process
(no file, no path-length limit; its name carries a random id the API makes and hands to its engine in
the environment). The database stays where every request and result is kept; a ring says "look now", and
the engine's ring also carries small results:
- API -> engine: after every database commit in the API (a new future, an unload, a heartbeat) the
  engine is rung, and its loop (which replaces process_pending_requests) wakes at once. It also goes
  round again at once after an iteration that completed something, where the stock loop slept.
- engine -> API: when the engine completes futures (TinkerEngine._complete_futures, whose rows it writes the
  same way) it rings the API with their results (status and result JSON, up to RING_RESULTS_MAX bytes in all)
  before committing them: the API hands them to their waiters (or keeps them for a retrieve_future still to
  come) without reading the database, and the commit is off the request's path. Bigger results, and any ring
  that did not fit in the API's socket, are followed by a ring after the commit that sends the API's future
  poller (which replaces poll_futures) to the database. Rings are numbered, so a missing one does the same.
  A new waiter (retrieve_future) for a future the ring will not bring (filed by no submit of this process,
  settled already) wakes the poller to read the database at once.
Each look of the engine first asks the database which request types are pending (one query) and skips SkyRL's
finders for the types that are not (look_for_pending_kinds): SkyRL's scheduling pass runs ~7 queries through the
ORM per look (each finder of model passes looks for barriers, then its type; samples; single requests), on the path
of every request before its computation starts, most of them for types nobody sent. The scheduling barriers (a
pending optim_step or load_weights) are not read either when neither type is pending.
The API files a new future in one statement (one_statement_submit): SkyRL's create_future looks for a retry
of the request first, then inserts in a savepoint; here the insert is tried first and skips a (model_id,
seq_id) pair the table holds already, and only then is the existing row read (same id or 409, as stock).
forward_backward and optim_step read the model's row before filing only to answer 404 for an unknown model; a model
SkyRL has a row for keeps it for good, so after the first read they skip it (skip_known_model_checks).
Both processes also commit to SkyRL's sqlite database without an fsync per commit (relax_sqlite_sync), and
log through a plain stream handler instead of rich's (plain_log): the engine writes its `(timing)` line
between a batch's computation and the completion of its futures, on every request's path.
A ring is never needed for correctness: a lost one (a full socket: rings are already queued, and the next
numbered ring shows the gap) only delays a look to the safety interval, when each side looks anyway: the engine
every ENGINE_SAFETY_S (its session cleanup runs from the same loop), the API's database read once somebody has
waited API_SAFETY_S. With no client, the server does one cheap queue look per second and nothing else.
`RLCLI_STOCK_RESULTS=1` keeps results out of the rings (every result read from the database, as 1.4 did).

`python rlcli_wake.py` checks in this venv that every SkyRL piece it replaces is where it expects.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import secrets
import select
import socket
import sys

NAME = "rlcli_wake"
VERSION = "1.6"
ENV_ID = "RLCLI_WAKE_ID"
# "1" keeps SkyRL's rich log handler (the A/B of benchmarks/request_path.py --ab-env, or a taste for it).
RICH_LOG_ENV = "RLCLI_RICH_LOG"
# "1" keeps SkyRL's own create_future (select, then insert in a savepoint): the A/B, or a database we do not know.
STOCK_SUBMIT_ENV = "RLCLI_STOCK_SUBMIT"
# "1" runs SkyRL's whole scheduling pass on every look, every finder querying for its request type (the A/B).
STOCK_LOOK_ENV = "RLCLI_STOCK_LOOK"
# "1" (with the pending types first): the scheduling barriers are read on every look, as stock (the A/B).
STOCK_BARRIERS_ENV = "RLCLI_STOCK_BARRIERS"
# "1": every submit route reads the model's row first, as stock (the A/B); otherwise known models are not read again.
STOCK_MODEL_CHECK_ENV = "RLCLI_STOCK_MODEL_CHECK"
# SkyRL routes that read a model's row only to answer 404 for an unknown model (they drop what get_model returns).
MODEL_CHECK_ROUTES = ("forward_backward", "optim_step")
# "1": the engine's ring only says "look" and the API reads every result from the database, as before 1.5 (the A/B).
STOCK_RESULTS_ENV = "RLCLI_STOCK_RESULTS"
# Results up to this many bytes of JSON (all of one completion together) travel in the engine's ring.
RING_RESULTS_MAX = 32 * 1024
RECV_MAX = RING_RESULTS_MAX + 64 * 1024  # a results ring's header names each result: room for thousands
# How long the engine waits before ringing again when its ring did not fit in the API's socket.
OWED_RETRY_S = 0.01
# What the API keeps of results that came by ring before anybody asked (a client that never retrieves).
READY_MAX, READY_MAX_BYTES = 4096, 64 * 1024 * 1024
FILED_MAX = 1 << 16
# How often each side looks without a ring. Not latency: a ring is what wakes a waiting side. These
# bound the damage of a lost ring and keep SkyRL's periodic session cleanup running.
ENGINE_SAFETY_S = 1.0
API_SAFETY_S = 0.5
ENGINE_HELLO = b"engine-up"

# (module, attribute) pairs this extension replaces or wraps; tests check they exist in the pinned SkyRL.
TARGETS = [
    ("skyrl.tinker.engine", "TinkerEngine.process_pending_requests"),
    ("skyrl.tinker.engine", "TinkerEngine.process_pending_requests_once"),
    ("skyrl.tinker.engine", "TinkerEngine._complete_futures"),
    ("skyrl.tinker.api", "poll_futures"),
    ("skyrl.tinker.api", "wait_for_future"),
    ("skyrl.utils.log", "RichHandler"),
    ("skyrl.tinker.engine", "log_timing"),
    ("skyrl.tinker.api", "create_future"),
    ("skyrl.tinker.engine", "TinkerEngine.find_batchable_model_passes"),
    ("skyrl.tinker.engine", "TinkerEngine.find_batchable_sample"),
    ("skyrl.tinker.engine", "TinkerEngine.find_single_requests"),
    ("skyrl.tinker.engine", "TinkerEngine._find_destructive_barriers"),
    ("skyrl.tinker.api", "get_model"),
]

_state = {"installed": None, "engine_joined": False, "rings_sent": 0, "rings_heard": 0, "log": "rich (stock)",
          "submit": "stock", "look": "every finder (stock)", "results": "database only (stock)", "api_results": None}


def log(message: str) -> None:
    # The launcher's supervisor copies this process's stderr into the server log.
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


def _address(wake_id: str, role: str) -> str:
    return f"\0rlcli-wake-{wake_id}-{role}"


class Doorbell:
    """This process's datagram socket: ring the peer, wait for or drain rings from it."""

    def __init__(self, wake_id: str, own: str, peer: str):
        self.peer = _address(wake_id, peer)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(_address(wake_id, own))
        self.sock.setblocking(False)

    def ring(self, message: bytes = b"!") -> bool:
        """Send one ring; False when it did not go (the caller decides whether that matters)."""
        try:
            self.sock.sendto(message, self.peer)
            _state["rings_sent"] += 1
            return True
        except OSError:
            # Full queue or buffer (BlockingIOError): the peer has rings queued already. Refused or not found: the
            # peer is not up yet, and it looks at the database when it starts. Either way the peer will look. (A
            # message too big for the socket, which results_message keeps from happening, lands here too.)
            return False

    def drain(self) -> list[bytes]:
        got = []
        while True:
            try:
                got.append(self.sock.recv(RECV_MAX))
            except BlockingIOError:
                _state["rings_heard"] += len(got)
                return got

    def wait(self, timeout: float) -> None:
        select.select([self.sock], [], [], timeout)


def check_targets(role: str = "both") -> None:
    """Raise unless every SkyRL piece this extension replaces exists where skyrl 0.4.0 has it.

    role "engine" checks the engine's pieces only: importing SkyRL's API (FastAPI and its routes) would cost the
    engine ~0.6 s of its start for modules it never uses."""
    import importlib

    found = {}
    for module_name, dotted in TARGETS:
        if role == "engine" and module_name != "skyrl.tinker.engine":
            continue
        obj = importlib.import_module(module_name)
        for part in dotted.split("."):
            obj = getattr(obj, part, None)
        found[f"{module_name}.{dotted}"] = obj
    from skyrl.tinker import engine

    # complete_futures writes SkyRL's rows with the names SkyRL's own _complete_futures uses.
    found.update({f"skyrl.tinker.engine.{name}": hasattr(engine, name)
                  for name in ("datetime", "timezone", "types", "update", "Session", "FutureDB", "RequestStatus")})
    if role != "engine":
        from skyrl.tinker import api

        # lifespan starts the poller and retrieve_future waits through module globals; rebinding those
        # globals reaches them only while they are looked up by name.
        lifespan = getattr(api.lifespan, "__wrapped__", api.lifespan)
        by_name = {"api.lifespan calling poll_futures by name": "poll_futures" in lifespan.__code__.co_names,
                   "api.retrieve_future calling wait_for_future by name":
                       "wait_for_future" in api.retrieve_future.__code__.co_names}
        found.update(by_name)
        found.update({f"skyrl.tinker.api.{name}": hasattr(api, name)
                      for name in ("FutureDB", "TERMINAL_STATUSES", "AsyncSession", "select", "HTTPException",
                                   "RequestStatus", "types")})
        # Every route files its future through the module global (so rebinding it reaches them all).
        found["api.forward_backward calling create_future by name"] = (
            "create_future" in api.forward_backward.__code__.co_names)
        for route in MODEL_CHECK_ROUTES:
            found[f"api.{route} dropping what get_model returns"] = drops_get_model(getattr(api, route, None))
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path

    pins.require(NAME, found)


def drops_get_model(route) -> bool:
    """Whether `route` awaits the module global get_model and drops its result (checked in its bytecode: the
    await's END_SEND followed by POP_TOP, Python 3.12), and never keeps it anywhere."""
    import dis
    import inspect

    if route is None:
        return False
    code = inspect.unwrap(route).__code__
    ins = list(dis.get_instructions(code))
    calls = [i for i, x in enumerate(ins) if x.opname == "LOAD_GLOBAL" and x.argval == "get_model"]
    if not calls:
        return False
    for at in calls:
        end = next((k for k in range(at, len(ins)) if ins[k].opname == "END_SEND"), None)
        if end is None or end + 1 >= len(ins) or ins[end + 1].opname != "POP_TOP":
            return False
    return True


def relax_sqlite_sync() -> None:
    """Commits to SkyRL's sqlite database without an fsync each (PRAGMA synchronous=NORMAL).

    Every request commits twice (the API files it, the engine completes it). SkyRL runs sqlite in WAL mode,
    where the default (FULL) syncs the log on every commit: 0.5 ms a commit on this machine's disk, NORMAL
    0.01 ms. In WAL mode NORMAL never corrupts the database; a power cut or OS crash may lose the last
    commits (a request the client then retries), a crash of the server's processes loses nothing.
    """
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    def on_connect(dbapi_connection, _record) -> None:
        if "sqlite" in type(dbapi_connection).__module__:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    event.listen(Pool, "connect", on_connect)


def plain_log(logger_name: str = "skyrl") -> int:
    """Swap the logger's rich handlers for plain stream handlers (same format, level and stream); return how many.

    SkyRL logs through rich.logging.RichHandler, which lays every record out as a rich Table: 0.8-1.3 ms of CPU
    a record on this 2-core machine, where a plain handler takes ~0.02 ms. The engine logs one record a batch,
    its `(timing)` line, after the batch's computation and before it completes the batch's futures (SkyRL's
    process_batch_requests), so every request waits for it. The text is the same record in SkyRL's own format
    (LOG_FORMAT), on one line instead of wrapped at 80 columns; exceptions keep their tracebacks (plain ones).
    """
    import logging

    logger = logging.getLogger(logger_name)
    swapped = 0
    for handler in list(logger.handlers):
        if type(handler).__name__ != "RichHandler":
            continue
        plain = logging.StreamHandler(getattr(getattr(handler, "console", None), "file", None) or sys.stderr)
        plain.setFormatter(handler.formatter)
        plain.setLevel(handler.level)
        logger.removeHandler(handler)
        logger.addHandler(plain)
        swapped += 1
    return swapped


def _plain_log_unless_asked() -> None:
    if os.environ.get(RICH_LOG_ENV) == "1":
        return
    import skyrl.utils.log  # noqa: F401  (sets up the "skyrl" logger's handler on import)

    if plain_log():
        _state["log"] = "plain"


# ----------------------------------------------------------------------------------------------- engine

def results_message(seq: int, rows: list[dict]) -> bytes | None:
    """The engine's ring carrying finished futures: b"R", a JSON header [seq, [[request_id, status, n_bytes], ...]],
    a newline, then each result's JSON text (as stored in the database) back to back. None when the results are
    bigger than RING_RESULTS_MAX together: the API then reads them from the database."""
    bodies = [row["result_data"].encode() for row in rows]
    if sum(map(len, bodies)) > RING_RESULTS_MAX:
        return None
    head = [seq, [[row["request_id"], str(getattr(row["status"], "value", row["status"])), len(body)]
                  for row, body in zip(rows, bodies, strict=True)]]
    return b"R" + json.dumps(head, separators=(",", ":")).encode() + b"\n" + b"".join(bodies)


def read_results(message: bytes) -> tuple[int, list[tuple[int, str, str]]]:
    """(seq, [(request_id, status, result JSON text), ...]) of a results_message."""
    head, _, body = message[1:].partition(b"\n")
    seq, entries = json.loads(head)
    out, at = [], 0
    for request_id, status, size in entries:
        out.append((request_id, status, body[at:at + size].decode()))
        at += size
    if at != len(body):
        raise ValueError(f"results ring of {len(body)} bytes, header names {at}")
    return seq, out


def plain_message(seq: int) -> bytes:
    """The engine's ring that only says "look" (results too big for a ring, or results not sent by ring)."""
    return b"!%d" % seq


def result_rows(results: dict) -> list[dict]:
    """The rows SkyRL's TinkerEngine._complete_futures writes for `results` (request id -> pydantic result)."""
    from skyrl.tinker import engine

    completed_at = engine.datetime.now(engine.timezone.utc)
    return [{"request_id": int(request_id), "result_data": result.model_dump_json(),
             "status": engine.RequestStatus.FAILED if isinstance(result, engine.types.ErrorResponse)
             else engine.RequestStatus.COMPLETED, "completed_at": completed_at}
            for request_id, result in results.items()]


def write_rows(db_engine, rows: list[dict]) -> None:
    """Write them as SkyRL's _complete_futures does: one bulk UPDATE by primary key, one commit."""
    from skyrl.tinker import engine

    with engine.Session(db_engine) as session:
        session.execute(engine.update(engine.FutureDB), rows)
        session.commit()


def install_engine(wake_id: str) -> None:
    from skyrl.tinker.engine import TinkerEngine

    check_targets("engine")
    relax_sqlite_sync()
    bell = Doorbell(wake_id, own="engine", peer="api")
    completed = [0]  # futures completed by this process so far
    sequence = itertools.count(1)  # every ring to the API is numbered: the API notices one that did not arrive
    owed = [False]  # a ring that did not fit in the API's socket; the loop rings again shortly
    original_complete = TinkerEngine._complete_futures
    with_results = os.environ.get(STOCK_RESULTS_ENV) != "1"

    from skyrl.tinker.db_models import FutureDB, RequestStatus
    from sqlmodel import Session, select

    def look_ring() -> None:
        """After the rows are committed: a short ring that says "read the database"; when even that does not fit in
        the API's socket (full of rings it has yet to read), the loop rings again in OWED_RETRY_S."""
        owed[0] = not bell.ring(plain_message(next(sequence)))

    @functools.wraps(original_complete)
    def complete_futures(self, results):
        if not with_results or not results:
            original_complete(self, results)
            completed[0] += 1
            look_ring()
            return
        rows = result_rows(results)
        # The results go to the API before the rows are committed: the commit (~1 ms) is then off the request's
        # path. Everything else a request changes (a checkpoint's row, a model's status) SkyRL commits before
        # completing its future, and the next look at the queue, in this thread, comes after this commit.
        message = results_message(next(sequence), rows)
        rung = message is not None and bell.ring(message)
        write_rows(self.db_engine, rows)
        completed[0] += 1
        if rung:
            owed[0] = False
        else:  # too big for a ring, or the API's socket was full: it reads them from the database
            look_ring()

    still_pending = select(FutureDB.request_id).where(FutureDB.status == RequestStatus.PENDING).limit(1)

    def process_pending_requests(self):
        bell.ring(ENGINE_HELLO)
        while True:
            bell.drain()
            before = completed[0]
            self.process_pending_requests_once()
            if owed[0]:
                look_ring()
            if completed[0] != before:
                # SkyRL's scheduler leaves some requests for a later look (a forward_backward queued behind
                # its model's optim_step), and their rings were drained above: look again now if any wait.
                # One indexed query instead of a whole scheduling pass, which would compete for the CPU
                # with the API answering the request that just finished.
                with Session(self.db_engine) as session:
                    if session.exec(still_pending).first() is not None:
                        continue
            bell.wait(OWED_RETRY_S if owed[0] else ENGINE_SAFETY_S)

    TinkerEngine._complete_futures = complete_futures
    TinkerEngine.process_pending_requests = process_pending_requests
    _state["results"] = "in the ring" if with_results else "database only (stock)"
    if os.environ.get(STOCK_LOOK_ENV) != "1":
        look_for_pending_kinds(TinkerEngine, skip_barriers=os.environ.get(STOCK_BARRIERS_ENV) != "1")
        _state["look"] = "pending types first"
    _state["installed"] = "engine"


def look_for_pending_kinds(engine_cls, skip_barriers: bool = True) -> None:
    """Each look (process_pending_requests_once) first reads which request types are pending, in one query; a
    finder whose types are not among them returns nothing without querying, as it would have found nothing.

    SkyRL's finders read the pending rows of their own types (find_batchable_model_passes: the destructive
    barriers, then the passes of its type; find_batchable_sample; find_single_requests: the barriers, then
    every type but passes, samples and external requests), so with no pending row of those types each returns
    {}. A request filed after the first query is found on the next look: its commit rings the engine, which
    then looks again at once; that is the order in which the stock pass would have found it had it been
    filed a moment later. The scheduling barriers (SkyRL's _find_destructive_barriers: the first pending optim_step
    or load_weights of each model, read by the pass and single finders) are none without a query when neither type
    is pending. Outside a look (a caller of a finder alone) the finders run as stock."""
    from skyrl.tinker import types
    from skyrl.tinker.db_models import FutureDB, RequestStatus
    from sqlmodel import Session, select

    kinds_query = select(FutureDB.request_type).where(FutureDB.status == RequestStatus.PENDING).distinct()
    kind = types.RequestType
    not_single = {kind.FORWARD_BACKWARD, kind.FORWARD, kind.SAMPLE, kind.EXTERNAL}
    once = engine_cls.process_pending_requests_once
    passes, samples, singles = (engine_cls.find_batchable_model_passes, engine_cls.find_batchable_sample,
                                engine_cls.find_single_requests)
    barriers, barrier_kinds = engine_cls._find_destructive_barriers, {kind.OPTIM_STEP, kind.LOAD_WEIGHTS}

    def pending(engine) -> set | None:
        return engine.__dict__.get("_rlcli_pending_kinds")

    @functools.wraps(once)
    def process_pending_requests_once(self):
        with Session(self.db_engine) as session:
            self._rlcli_pending_kinds = {kind(k) for k in session.exec(kinds_query).all()}
        try:
            return once(self)
        finally:
            self._rlcli_pending_kinds = None

    @functools.wraps(passes)
    def find_batchable_model_passes(self, session, request_type):
        found = pending(self)
        if found is not None and request_type not in found:
            return {}
        return passes(self, session, request_type)

    @functools.wraps(samples)
    def find_batchable_sample(self, session):
        found = pending(self)
        if found is not None and kind.SAMPLE not in found:
            return {}
        return samples(self, session)

    @functools.wraps(singles)
    def find_single_requests(self, session):
        found = pending(self)
        if found is not None and found <= not_single:
            return {}
        return singles(self, session)

    @functools.wraps(barriers)
    def find_destructive_barriers(self, session):
        found = pending(self)
        if found is not None and not found & barrier_kinds:
            return {}
        return barriers(self, session)

    engine_cls.process_pending_requests_once = process_pending_requests_once
    if skip_barriers:
        engine_cls._find_destructive_barriers = find_destructive_barriers
    engine_cls.find_batchable_model_passes = find_batchable_model_passes
    engine_cls.find_batchable_sample = find_batchable_sample
    engine_cls.find_single_requests = find_single_requests


# -------------------------------------------------------------------------------------------------- api

class Results:
    """The API's side of results that come by ring.

    `filed`: the futures this process filed (request_id -> request type) whose results the engine will ring
    with; `ready`: results rung before their retrieve_future arrived. A waiter for a filed future waits for the
    ring instead of reading the database on arrival; anything else (a result too big for a ring, a ring that did
    not arrive, an id filed elsewhere) is read from the database, as SkyRL's poller does."""

    def __init__(self, api):
        self.api = api
        self.filed: dict[int, object] = {}
        self.ready: dict[int, tuple] = {}
        self.ready_bytes = 0
        self.seq = 0
        self.need_db = True
        self.by_ring = 0
        self.look_rings = 0
        self.db_reads = 0

    def file(self, request_id: int, request_type) -> None:
        if request_type == self.api.types.RequestType.EXTERNAL:
            return  # the API completes those itself; the engine never rings with them
        if len(self.filed) >= FILED_MAX:  # results whose ring never came: forgetting one only costs a read
            self.filed.pop(next(iter(self.filed)))
        self.filed[request_id] = request_type

    def heard(self, message: bytes, waiters: dict) -> None:
        """One ring from the engine."""
        if message == ENGINE_HELLO:
            _state["engine_joined"] = True
            self.seq, self.need_db = 0, True
            return
        try:
            if message[:1] == b"R":
                seq, entries = read_results(message)
            else:
                seq, entries = int(message[1:] or 0), None
        except ValueError as e:
            log(f"unreadable ring from the engine ({e}); reading the database")
            self.need_db = True
            return
        if seq != self.seq + 1:  # a ring that did not arrive, or rings from two engine threads out of order
            self.need_db = True
        self.seq = max(self.seq, seq)
        if entries is None:  # results too big for a ring, or rung again after a full socket
            self.look_rings += 1
            self.need_db = True
            return
        for request_id, status, text in entries:
            request_type = self.filed.pop(request_id, None)
            if request_type is None:
                self.need_db = True
                continue
            outcome = (self.api.RequestStatus(status), request_type, text)
            self.by_ring += 1
            if not self.hand(waiters, request_id, outcome):
                self.keep(request_id, outcome)

    @staticmethod
    def hand(waiters: dict, request_id: int, outcome) -> bool:
        handed = False
        for waiter in waiters.pop(request_id, ()):
            if not waiter.done():
                waiter.set_result(outcome)
                handed = True
        return handed

    def keep(self, request_id: int, outcome) -> None:
        self.ready[request_id] = outcome
        self.ready_bytes += len(outcome[2] or "")
        while len(self.ready) > READY_MAX or self.ready_bytes > READY_MAX_BYTES:
            # The oldest unasked result goes; asking for it later reads the database.
            self.ready_bytes -= len(self.ready.pop(next(iter(self.ready)))[2] or "")

    def take(self, request_id: int):
        outcome = self.ready.pop(request_id, None)
        if outcome is not None:
            self.ready_bytes -= len(outcome[2] or "")
        return outcome

    def read_from_db(self, outcomes: dict) -> None:
        """After a database read: those futures are settled, no ring will bring them."""
        self.db_reads += 1
        for request_id in outcomes:
            self.filed.pop(request_id, None)


def install_api() -> str:
    """Wire the API's side; return the wake id the engine (started later by the API) inherits."""
    import time

    from skyrl.tinker import api
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    check_targets()
    relax_sqlite_sync()
    wake_id = secrets.token_hex(8)
    bell = Doorbell(wake_id, own="api", peer="engine")
    wake = {"event": None, "waiters": {}}
    with_results = os.environ.get(STOCK_RESULTS_ENV) != "1"
    results = Results(api)
    _state["api_results"] = results

    def ring_engine(_session) -> None:
        bell.ring()

    # Every commit in this process may have queued work (a new future) or freed a slot: ring.
    # A commit that queued nothing costs the engine one look at its queue.
    event.listen(Session, "after_commit", ring_engine)

    def on_readable() -> None:
        for message in bell.drain():
            results.heard(message, wake["waiters"])
        if wake["event"] is not None:
            wake["event"].set()

    async def poll_futures(db_engine, waiters, poll_interval_sec=None):
        """Resolve awaited futures: by the engine's ring, or from the database when a ring cannot bring them
        (told so, a new waiter for a future not filed here) and at least every API_SAFETY_S while somebody
        waits (a ring that never came)."""
        loop = asyncio.get_running_loop()
        wake["event"], wake["waiters"] = asyncio.Event(), waiters
        loop.add_reader(bell.sock.fileno(), on_readable)
        last_read = 0.0
        try:
            while True:
                wake["event"].clear()
                if not waiters:
                    last_read = time.monotonic()  # the safety read counts from when somebody waits
                due = time.monotonic() - last_read >= API_SAFETY_S
                if waiters and (results.need_db or due or not with_results):
                    results.need_db = False
                    last_read = time.monotonic()
                    try:
                        results.read_from_db(await resolve_finished(api, db_engine, waiters))
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # keep serving: each waiter also has its own timeout
                        log(f"future poller iteration failed: {e!r}")
                timeout = API_SAFETY_S if waiters else None
                try:
                    await asyncio.wait_for(wake["event"].wait(), timeout)
                except TimeoutError:
                    pass
        finally:
            loop.remove_reader(bell.sock.fileno())

    original_wait = api.wait_for_future

    @functools.wraps(original_wait)
    async def wait_for_future(waiters, request_id, timeout):
        outcome = results.take(request_id)
        if outcome is not None:  # its ring came before its retrieve_future
            return outcome
        if request_id not in results.filed:
            # Not a result the engine will ring with (done before, too big, filed by another process): read the
            # database now. The waiter is added before the wrapped coroutine first yields, so the poller, woken
            # here, runs after it is in `waiters` and finds a result that is already there.
            results.need_db = True
        if wake["event"] is not None:
            wake["event"].set()
        return await original_wait(waiters, request_id, timeout)

    api.poll_futures = poll_futures
    api.wait_for_future = wait_for_future
    if os.environ.get(STOCK_SUBMIT_ENV) != "1":
        api.create_future = one_statement_submit(api, results.file if with_results else None)
        _state["submit"] = "one statement"
    _state["results"] = "in the ring" if with_results else "database only (stock)"
    if os.environ.get(STOCK_MODEL_CHECK_ENV) != "1":
        _state["model_checks"] = skip_known_model_checks(api)
    os.environ[ENV_ID] = wake_id  # the engine process is started by the API and inherits this
    _state["installed"] = "api"
    return wake_id


def skip_known_model_checks(api) -> dict:
    """SkyRL's get_model, which reads a model's row, without the read for a known model when called by a route
    that only wants its 404 (MODEL_CHECK_ROUTES, whose bytecode drops the result); returns its counters.

    forward_backward and optim_step read the model's row (SELECT through aiosqlite, ~0.7 ms on a 2-core machine)
    on every request to answer 404 for an unknown model_id. SkyRL never deletes a model's row (unloading sets
    its status, which these routes do not look at), so a model_id found once exists for the database's life:
    those routes then skip the read. Every other caller, and the first call for each model, reads as stock."""
    import sys

    stock = api.get_model
    checking = {getattr(api, route).__code__ for route in MODEL_CHECK_ROUTES if drops_get_model(getattr(api, route))}
    known: set[str] = set()
    counts = {"skipped": 0}

    @functools.wraps(stock)
    async def get_model(session, model_id):
        # The frame that awaits this coroutine is its f_back while it runs: the route's own frame.
        if model_id in known and sys._getframe(1).f_code in checking:
            counts["skipped"] += 1
            return None
        model = await stock(session, model_id)
        known.add(model_id)
        return model

    api.get_model = get_model
    return counts


def one_statement_submit(api, on_filed=None):
    """SkyRL's create_future with the insert first: one statement where stock runs three, same outcomes.

    Stock (skyrl.tinker.api.create_future) selects the row of the request's (model_id, seq_id) to find an SDK
    retry, then inserts in a savepoint (a lost insert race rolls back only that row; callers may have staged
    other writes, e.g. save_weights' pending checkpoint) and flushes the ORM object for its id. Here, on sqlite
    and PostgreSQL, `INSERT ... ON CONFLICT (model_id, seq_id) DO NOTHING RETURNING request_id` files it: a new
    request (the usual case) costs that one statement, no error and so no savepoint is needed, the race is the
    database's. Only when it files nothing does the row already there decide, as stock: the same request type
    and data is a retry and gets that row's id, anything else is 409. A request without seq_id (or model) is
    never a duplicate (SQL's NULLs are distinct), as stock. Another database keeps SkyRL's function.
    """
    from datetime import UTC, datetime

    from sqlalchemy.dialects import postgresql, sqlite

    stock = api.create_future
    table = api.FutureDB.__table__
    inserts = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}
    pending = api.RequestStatus.PENDING

    @functools.wraps(stock)
    async def create_future(session, request_type, model_id, request_data, seq_id=None):
        insert = inserts.get(getattr(getattr(session.bind, "dialect", None), "name", None))
        if insert is None:
            return await stock(session, request_type, model_id, request_data, seq_id)
        data = request_data.model_dump(mode="json")
        statement = insert(table).values(request_type=request_type, model_id=model_id, seq_id=seq_id,
                                         request_data=data, status=pending, created_at=datetime.now(UTC))
        statement = statement.on_conflict_do_nothing(index_elements=["model_id", "seq_id"])
        filed = (await session.exec(statement.returning(table.c.request_id))).scalar()
        if filed is not None:
            if on_filed is not None:
                on_filed(filed, request_type)
            return filed
        row = (await session.exec(api.select(table.c.request_id, table.c.request_type, table.c.request_data)
                                     .where(table.c.model_id == model_id, table.c.seq_id == seq_id))).first()
        if row is None:  # cannot happen (rows are never deleted); if it does, SkyRL's own function decides
            return await stock(session, request_type, model_id, request_data, seq_id)
        if row.request_type != request_type or row.request_data != data:
            raise api.HTTPException(status_code=409, detail="Training request sequence number was reused")
        return row.request_id

    return create_future


async def resolve_finished(api, db_engine, waiters: dict) -> dict:
    """One look at the awaited futures: hand finished ones to their waiters, KeyError for unknown ids; return
    those outcomes by request id.

    Waiters get what SkyRL's own poller gives them, (status, request_type, result_data as JSON text),
    so retrieve_future behaves as stock. A future's row exists before its id reaches any client and
    rows are never deleted, so an awaited id with no row never existed.
    """
    ids = list(waiters)
    table = api.FutureDB
    query = api.select(table.request_id, table.status, table.request_type, table.result_data).where(
        table.request_id.in_(ids))
    async with api.AsyncSession(db_engine) as session:
        rows = (await session.exec(query)).all()
    found = {row[0] for row in rows}
    outcomes = {rid: (status, kind, data) for rid, status, kind, data in rows if status in api.TERMINAL_STATUSES}
    outcomes.update({rid: KeyError(rid) for rid in ids if rid not in found})
    for rid, outcome in outcomes.items():
        for waiter in waiters.pop(rid, ()):
            if waiter.done():
                continue
            if isinstance(outcome, KeyError):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)
    return outcomes


def describe() -> dict:
    """What the capabilities route says about the request path (API process)."""
    if _state["installed"] != "api":
        return {"wake": "timer (stock SkyRL)"}
    results = _state.get("api_results")
    return {"wake": "notify", "engine_joined": _state["engine_joined"], "log": _state["log"],
            "submit": _state["submit"],
            "engine_look": "every finder (stock)" if os.environ.get(STOCK_LOOK_ENV) == "1" else "pending types first",
            "results": _state.get("results"), "ring_results_max_bytes": RING_RESULTS_MAX,
            "results_by_ring": results.by_ring if results else 0, "database_reads": results.db_reads if results else 0,
            "look_rings": results.look_rings if results else 0,
            "model_check": "stock" if _state.get("model_checks") is None else "known models not read again",
            "model_checks_skipped": (_state.get("model_checks") or {}).get("skipped", 0),
            "rings": {"to_engine": _state["rings_sent"], "from_engine": _state["rings_heard"]},
            "safety_look_s": {"engine": ENGINE_SAFETY_S, "api_while_waiting": API_SAFETY_S}}


def register(role: str) -> None:
    if role in ("api", "engine"):
        _plain_log_unless_asked()
    if role == "api":
        install_api()
        log("API and engine wake each other on new work and finished futures "
            f"(safety looks every {ENGINE_SAFETY_S:g} s / {API_SAFETY_S:g} s)")
    elif role == "engine":
        wake_id = os.environ.get(ENV_ID)
        if not wake_id:
            log("no wake id from the API (it did not load this extension): the engine keeps SkyRL's timer")
            return
        install_engine(wake_id)
        look = "every request type (stock)" if _state["look"].endswith("(stock)") else "the pending request types first"
        log(f"engine waits for the API's ring instead of sleeping 100 ms between looks; each look asks for {look}")


def check_submit() -> str:
    """one_statement_submit against SkyRL's create_future on a scratch sqlite database: for a new request, an SDK
    retry, a reused seq_id, requests without seq_id and a write staged before a retry, both must give the same
    outcome and leave the same rows (ids and times aside)."""
    import asyncio
    import tempfile

    from skyrl.tinker import api, types
    from skyrl.tinker.db_models import ModelDB, SQLModel
    from sqlalchemy.ext.asyncio import create_async_engine

    fast = one_statement_submit(api)
    adam = types.AdamParams(learning_rate=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.0)
    step, other = types.OptimStepInput(adam_params=adam), types.OptimStepInput(adam_params=adam.model_copy(
        update={"learning_rate": 2e-3}))
    optim = types.RequestType.OPTIM_STEP

    async def file(engine, create, model, data, seq, stage=None):
        async with api.AsyncSession(engine) as session:
            if stage is not None:
                session.add(stage)
            try:
                request_id = await create(session, optim, model, data, seq)
            except api.HTTPException as e:
                await session.commit()
                return f"HTTP {e.status_code}"
            await session.commit()
            return request_id

    async def run(create, folder):
        engine = create_async_engine(f"sqlite+aiosqlite:///{folder}/db.sqlite")
        async with engine.begin() as connection:
            await connection.run_sync(SQLModel.metadata.create_all)
        first = await file(engine, create, "m", step, 1)
        outcomes = [first == 1,
                    await file(engine, create, "m", step, 1) == first,  # an SDK retry: the same future
                    await file(engine, create, "m", other, 1),  # the same seq_id, other data: refused
                    await file(engine, create, "m2", step, 1),  # another model's seq_id 1 is its own
                    await file(engine, create, "m", step, None), await file(engine, create, "m", step, None),
                    await file(engine, create, "m", step, 1, stage=ModelDB(
                        model_id="staged", base_model="b", lora_config={}, status="ready", request_id=0,
                        session_id="s"))]
        async with api.AsyncSession(engine) as session:
            futures = (await session.exec(api.select(api.FutureDB).order_by(api.FutureDB.request_id))).all()
            rows = [(f.request_id, f.request_type, f.model_id, f.seq_id, f.request_data, f.status, f.result_data)
                    for f in futures]
            staged = (await session.exec(api.select(ModelDB.model_id))).all()
        await engine.dispose()
        return outcomes, rows, staged

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        expected, got = asyncio.run(run(api.create_future, a)), asyncio.run(run(fast, b))
    if got != expected:
        raise SystemExit(f"{NAME}: one_statement_submit differs from SkyRL's create_future:\n"
                         f"  stock {expected}\n  rlcli {got}")
    if expected[0][2] != "HTTP 409" or expected[2] != ["staged"]:
        raise SystemExit(f"{NAME}: SkyRL's create_future changed its outcomes: {expected}")
    return "submit in one statement matches SkyRL's create_future (new, retry, 409, no seq_id, staged write)"


def check_look() -> str:
    """look_for_pending_kinds against SkyRL's finders on a scratch sqlite database: for queues holding nothing,
    one type, passes behind a barrier, samples, single requests and a mix, every finder must find the same
    requests inside a look as stock does, and the one query must name exactly the pending types."""
    import tempfile
    import types as pytypes

    from skyrl.tinker import types
    from skyrl.tinker.db_models import FutureDB, RequestStatus, SQLModel
    from skyrl.tinker.engine import TinkerEngine
    from sqlalchemy import event
    from sqlmodel import Session, create_engine

    kind = types.RequestType
    tensor = {"data": [1.0, 1.0]}
    datum = {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
             "loss_fn_inputs": {"target_tokens": {"data": [2, 3]}, "weights": tensor, "advantages": tensor,
                                "logprobs": tensor}}
    passes = types.ForwardBackwardInput.model_validate({"data": [datum], "loss_fn": "cross_entropy"})
    sample = types.SampleInput.model_validate({
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1]}]}, "num_samples": 1, "checkpoint_id": "",
        "prompt_logprobs": False, "sampling_params": {"temperature": 1.0, "max_tokens": 2, "seed": 0}})
    adam = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.0}
    data = {kind.FORWARD_BACKWARD: passes.model_dump(mode="json"), kind.FORWARD: passes.model_dump(mode="json"),
            kind.SAMPLE: sample.model_dump(mode="json"), kind.OPTIM_STEP: {"adam_params": adam},
            kind.SAVE_WEIGHTS: {"path": "p"}, kind.EXTERNAL: {},
            kind.LOAD_WEIGHTS: {"source_model_id": "m", "checkpoint_id": "c", "load_optimizer": False}}
    queues = [[], [kind.FORWARD], [kind.FORWARD_BACKWARD, kind.FORWARD_BACKWARD],
              [kind.FORWARD_BACKWARD, kind.OPTIM_STEP, kind.FORWARD_BACKWARD], [kind.SAMPLE, kind.SAMPLE],
              [kind.OPTIM_STEP], [kind.EXTERNAL, kind.FORWARD], [kind.SAVE_WEIGHTS, kind.SAMPLE],
              [kind.FORWARD, kind.OPTIM_STEP, kind.FORWARD, kind.SAMPLE, kind.SAVE_WEIGHTS, kind.FORWARD_BACKWARD],
              [kind.FORWARD, kind.LOAD_WEIGHTS, kind.FORWARD, kind.FORWARD_BACKWARD, kind.FORWARD],
              [kind.SAVE_WEIGHTS, kind.FORWARD_BACKWARD, kind.SAVE_WEIGHTS, kind.OPTIM_STEP, kind.FORWARD_BACKWARD]]
    stock = {name: getattr(TinkerEngine, name) for name in ("process_pending_requests_once",
             "find_batchable_model_passes", "find_batchable_sample", "find_single_requests",
             "_find_destructive_barriers")}

    class Probe(TinkerEngine):  # the finders' own code on a scratch database, without a backend
        def __init__(self, db_engine):
            self.db_engine, self._sampler = db_engine, None
            self.config = pytypes.SimpleNamespace(backend="jax")
            self.backend = pytypes.SimpleNamespace(config=pytypes.SimpleNamespace(sample_max_num_sequences=0))
            self.found = {}

        def process_pending_requests_once(self):  # what a look asks, in SkyRL's order
            with Session(self.db_engine) as session:
                self.found = {"passes": self.find_batchable_model_passes(session, kind.FORWARD_BACKWARD),
                              "forward": self.find_batchable_model_passes(session, kind.FORWARD),
                              "samples": self.find_batchable_sample(session),
                              "singles": self.find_single_requests(session),
                              "barriers": self._find_destructive_barriers(session),
                              "kinds": sorted(self.__dict__.get("_rlcli_pending_kinds") or ())}

    def looks(folder: str, wrapped: bool) -> tuple[list, list]:
        if wrapped:
            look_for_pending_kinds(Probe)
        outcomes, statements = [], []
        for n, queue in enumerate(queues):
            db = create_engine(f"sqlite:///{folder}/db{n}.sqlite")
            SQLModel.metadata.create_all(db)
            with Session(db) as session:
                for i, k in enumerate(queue):
                    session.add(FutureDB(request_type=k, model_id="m" if i % 2 else "n", request_data=data[k],
                                         status=RequestStatus.PENDING))
                session.add(FutureDB(request_type=kind.SAMPLE, model_id="m", request_data=data[kind.SAMPLE],
                                     status=RequestStatus.COMPLETED))  # done: no finder may take it
                session.commit()
            probe = Probe(db)
            ran = []
            event.listen(db, "before_cursor_execute", lambda *args, ran=ran: ran.append(1))
            probe.process_pending_requests_once()
            statements.append(len(ran))
            found = {k: (sorted(v.items()) if k == "barriers" else sorted(v) if isinstance(v, dict) else v)
                     for k, v in probe.found.items()}
            outcomes.append((found, sorted(set(queue), key=str)))
            db.dispose()
        for name, fn in stock.items():
            if name != "process_pending_requests_once":
                setattr(Probe, name, fn)
        return outcomes, statements

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        (plain, stock_statements), (fast, statements) = looks(a, False), looks(b, True)
    for (want, _), (got, pending_kinds) in zip(plain, fast, strict=True):
        if {k: v for k, v in got.items() if k != "kinds"} != {k: v for k, v in want.items() if k != "kinds"}:
            raise SystemExit(f"{NAME}: a look with pending types first differs from SkyRL's:\n  stock {want}\n"
                             f"  rlcli {got}")
        if got["kinds"] != sorted(pending_kinds, key=str) and got["kinds"] != sorted(pending_kinds):
            raise SystemExit(f"{NAME}: the pending-types query read {got['kinds']}, the queue holds {pending_kinds}")
    if not any(w["passes"] for w, _ in plain) or not any(w["singles"] for w, _ in plain) or not any(
            w["barriers"] for w, _ in plain):
        raise SystemExit(f"{NAME}: SkyRL's finders found nothing in the scratch queues: {plain}")
    # A queue of forwards only: the types query, the forwards and their data; no barrier or other finder's query.
    if statements[1] > 3 or statements[1] >= stock_statements[1]:
        raise SystemExit(f"{NAME}: a look at a queue of forwards ran {statements[1]} statements (stock "
                         f"{stock_statements[1]}); expected 3")
    return (f"a look with pending types first finds what SkyRL's finders find ({len(queues)} queues; "
            f"{sum(statements)} statements against {sum(stock_statements)})")


def check_results() -> str:
    """The engine's results path against SkyRL's _complete_futures on scratch sqlite databases: the same rows for
    results of several kinds (a failure among them), and a results ring that reads back as those rows."""
    import tempfile
    import types as pytypes

    from skyrl.tinker import types
    from skyrl.tinker.db_models import FutureDB, RequestStatus, SQLModel
    from skyrl.tinker.engine import TinkerEngine
    from sqlmodel import Session, create_engine, select

    kind = types.RequestType
    results = {"1": types.ForwardBackwardOutput(loss_fn_output_type="scalar", metrics={"loss:sum": 1.5},
                                                loss_fn_outputs=[{"logprobs": {"data": [-0.5, float("nan")]}}]),
               "2": types.OptimStepOutput(metrics={"lr": 1e-4}), "3": types.ErrorResponse(error="no", status="failed")}

    def complete(folder: str, stock: bool) -> list:
        db = create_engine(f"sqlite:///{folder}/db.sqlite")
        SQLModel.metadata.create_all(db)
        with Session(db) as session:
            queued = ((1, kind.FORWARD_BACKWARD), (2, kind.OPTIM_STEP), (3, kind.FORWARD), (4, kind.SAMPLE))
            for request_id, k in queued:
                session.add(FutureDB(request_id=request_id, request_type=k, model_id="m", request_data={},
                                     status=RequestStatus.PENDING))
            session.commit()
        if stock:
            TinkerEngine._complete_futures(pytypes.SimpleNamespace(db_engine=db), results)
            rows = None
        else:
            rows = result_rows(results)
            write_rows(db, rows)
        with Session(db) as session:
            stored = [(f.request_id, f.status, f.result_data, f.completed_at is not None)
                      for f in session.exec(select(FutureDB).order_by(FutureDB.request_id)).all()]
        db.dispose()
        return stored, rows

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        (stock, _), (ours, rows) = complete(a, True), complete(b, False)
    if ours != stock:
        raise SystemExit(f"{NAME}: the engine's results rows differ from SkyRL's _complete_futures:\n  stock {stock}\n"
                         f"  rlcli {ours}")
    if [r[1] for r in stock] != [RequestStatus.COMPLETED, RequestStatus.COMPLETED, RequestStatus.FAILED,
                                 RequestStatus.PENDING]:
        raise SystemExit(f"{NAME}: SkyRL's _complete_futures wrote other statuses than expected: {stock}")
    seq, read = read_results(results_message(7, rows))
    if seq != 7 or read != [(r[0], str(r[1].value), r[2]) for r in stock[:3]]:
        raise SystemExit(f"{NAME}: a results ring reads back as {seq}, {read}, the database holds {stock[:3]}")
    big = [{**rows[0], "result_data": "x" * (RING_RESULTS_MAX + 1)}]
    if results_message(8, big) is not None:
        raise SystemExit(f"{NAME}: results over {RING_RESULTS_MAX} bytes went into a ring")
    return "results rows match SkyRL's _complete_futures and read back from a ring (3 kinds, a failure)"


def check_model_checks() -> str:
    """skip_known_model_checks through SkyRL's own optim_step route on a scratch sqlite database: an unknown model is
    404 every time, a known one is read once and then not, and any other caller of get_model still gets the row."""
    import asyncio
    import tempfile

    from skyrl.tinker import api
    from skyrl.tinker.db_models import ModelDB, SQLModel
    from sqlalchemy.ext.asyncio import create_async_engine

    stock = api.get_model

    async def run(folder: str) -> tuple:
        engine = create_async_engine(f"sqlite+aiosqlite:///{folder}/db.sqlite")
        async with engine.begin() as connection:
            await connection.run_sync(SQLModel.metadata.create_all)
        async with api.AsyncSession(engine) as session:
            session.add(ModelDB(model_id="m", base_model="b", lora_config={}, status="ready", request_id=0,
                                session_id="s"))
            await session.commit()
        counts = skip_known_model_checks(api)
        outcomes = []
        try:
            for model_id in ("x", "m", "m", "x", "m"):
                async with api.AsyncSession(engine) as session:
                    try:
                        step = api.OptimStepRequest(model_id=model_id, adam_params=api.AdamParams())
                        outcomes.append((await api.optim_step(step, session)).status)
                    except api.HTTPException as e:
                        outcomes.append(e.status_code)
            async with api.AsyncSession(engine) as session:
                row = await api.get_model(session, "m")  # not a checking route: the row, as stock
        finally:
            api.get_model = stock
            await engine.dispose()
        return outcomes, counts["skipped"], getattr(row, "model_id", None)

    with tempfile.TemporaryDirectory() as folder:
        outcomes, skipped, row = asyncio.run(run(folder))
    if outcomes != [404, "pending", "pending", 404, "pending"] or skipped != 2 or row != "m":
        raise SystemExit(f"{NAME}: known-model checks went wrong: routes {outcomes}, {skipped} reads skipped "
                         f"(expected 2), get_model elsewhere gave {row!r}")
    return "a known model's row is read once by the submit routes, an unknown one is 404 every time"


if __name__ == "__main__":
    check_targets()
    print(f"{NAME} {VERSION}: " + ", ".join(f"{m}.{a}" for m, a in TARGETS) + " present")
    print(f"{NAME} {VERSION}: " + check_submit())
    print(f"{NAME} {VERSION}: " + check_look())
    print(f"{NAME} {VERSION}: " + check_results())
    print(f"{NAME} {VERSION}: " + check_model_checks())
