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
the environment). The database stays the only channel for data; a ring only says "look now":
- API -> engine: after every database commit in the API (a new future, an unload, a heartbeat) the
  engine is rung, and its loop (which replaces process_pending_requests) wakes at once. It also goes
  round again at once after an iteration that completed something, where the stock loop slept.
- engine -> API: after the engine completes futures (TinkerEngine._complete_futures) the API is rung,
  and its future poller (which replaces poll_futures) reads the awaited futures at once. A new waiter
  (retrieve_future) wakes the poller too, so a result that is already there is not waited for.
The API files a new future in one statement (one_statement_submit): SkyRL's create_future looks for a retry
of the request first, then inserts in a savepoint; here the insert is tried first and skips a (model_id,
seq_id) pair the table holds already, and only then is the existing row read (same id or 409, as stock).
Both processes also commit to SkyRL's sqlite database without an fsync per commit (relax_sqlite_sync), and
log through a plain stream handler instead of rich's (plain_log): the engine writes its `(timing)` line
between a batch's computation and the completion of its futures, on every request's path.
A ring is never needed for correctness: a lost one (a full socket buffer means rings are already
queued) only delays a look to the safety interval, when each side looks anyway: the engine every
ENGINE_SAFETY_S (its session cleanup runs from the same loop), the API every API_SAFETY_S while
somebody waits. With no client, the server does one cheap queue look per second and nothing else.

`python rlcli_wake.py` checks in this venv that every SkyRL piece it replaces is where it expects.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import select
import socket
import sys

NAME = "rlcli_wake"
VERSION = "1.3"
ENV_ID = "RLCLI_WAKE_ID"
# "1" keeps SkyRL's rich log handler (the A/B of benchmarks/request_path.py --ab-env, or a taste for it).
RICH_LOG_ENV = "RLCLI_RICH_LOG"
# "1" keeps SkyRL's own create_future (select, then insert in a savepoint): the A/B, or a database we do not know.
STOCK_SUBMIT_ENV = "RLCLI_STOCK_SUBMIT"
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
]

_state = {"installed": None, "engine_joined": False, "rings_sent": 0, "rings_heard": 0, "log": "rich (stock)",
          "submit": "stock"}


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

    def ring(self, message: bytes = b"!") -> None:
        try:
            self.sock.sendto(message, self.peer)
            _state["rings_sent"] += 1
        except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
            # Full buffer: the peer has rings queued already. Refused: the peer is not up yet, and it
            # looks at the database when it starts. Either way the peer will look.
            pass

    def drain(self) -> list[bytes]:
        got = []
        while True:
            try:
                got.append(self.sock.recv(64))
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
                                   "RequestStatus")})
        # Every route files its future through the module global (so rebinding it reaches them all).
        found["api.forward_backward calling create_future by name"] = (
            "create_future" in api.forward_backward.__code__.co_names)
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path

    pins.require(NAME, found)


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

def install_engine(wake_id: str) -> None:
    from skyrl.tinker.engine import TinkerEngine

    check_targets("engine")
    relax_sqlite_sync()
    bell = Doorbell(wake_id, own="engine", peer="api")
    completed = [0]  # futures completed by this process so far
    original_complete = TinkerEngine._complete_futures

    @functools.wraps(original_complete)
    def complete_futures(self, results):
        original_complete(self, results)
        completed[0] += 1
        bell.ring()

    from skyrl.tinker.db_models import FutureDB, RequestStatus
    from sqlmodel import Session, select

    still_pending = select(FutureDB.request_id).where(FutureDB.status == RequestStatus.PENDING).limit(1)

    def process_pending_requests(self):
        bell.ring(ENGINE_HELLO)
        while True:
            bell.drain()
            before = completed[0]
            self.process_pending_requests_once()
            if completed[0] != before:
                # SkyRL's scheduler leaves some requests for a later look (a forward_backward queued behind
                # its model's optim_step), and their rings were drained above: look again now if any wait.
                # One indexed query instead of a whole scheduling pass, which would compete for the CPU
                # with the API answering the request that just finished.
                with Session(self.db_engine) as session:
                    if session.exec(still_pending).first() is not None:
                        continue
            bell.wait(ENGINE_SAFETY_S)

    TinkerEngine._complete_futures = complete_futures
    TinkerEngine.process_pending_requests = process_pending_requests
    _state["installed"] = "engine"


# -------------------------------------------------------------------------------------------------- api

def install_api() -> str:
    """Wire the API's side; return the wake id the engine (started later by the API) inherits."""
    from skyrl.tinker import api
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    check_targets()
    relax_sqlite_sync()
    wake_id = secrets.token_hex(8)
    bell = Doorbell(wake_id, own="api", peer="engine")
    wake = {"event": None}

    def ring_engine(_session) -> None:
        bell.ring()

    # Every commit in this process may have queued work (a new future) or freed a slot: ring.
    # A commit that queued nothing costs the engine one look at its queue.
    event.listen(Session, "after_commit", ring_engine)

    def on_readable() -> None:
        if ENGINE_HELLO in bell.drain():
            _state["engine_joined"] = True
        if wake["event"] is not None:
            wake["event"].set()

    async def poll_futures(db_engine, waiters, poll_interval_sec=None):
        """Resolve awaited futures when the engine rings, a waiter arrives, or API_SAFETY_S passes."""
        loop = asyncio.get_running_loop()
        wake["event"] = asyncio.Event()
        loop.add_reader(bell.sock.fileno(), on_readable)
        try:
            while True:
                wake["event"].clear()
                if waiters:
                    try:
                        await resolve_finished(api, db_engine, waiters)
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
        # The waiter is added before the wrapped coroutine first yields, so the poller, woken here,
        # runs after it is in `waiters` and finds a result that is already there.
        if wake["event"] is not None:
            wake["event"].set()
        return await original_wait(waiters, request_id, timeout)

    api.poll_futures = poll_futures
    api.wait_for_future = wait_for_future
    if os.environ.get(STOCK_SUBMIT_ENV) != "1":
        api.create_future = one_statement_submit(api)
        _state["submit"] = "one statement"
    os.environ[ENV_ID] = wake_id  # the engine process is started by the API and inherits this
    _state["installed"] = "api"
    return wake_id


def one_statement_submit(api):
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
            return filed
        row = (await session.exec(api.select(table.c.request_id, table.c.request_type, table.c.request_data)
                                     .where(table.c.model_id == model_id, table.c.seq_id == seq_id))).first()
        if row is None:  # cannot happen (rows are never deleted); if it does, SkyRL's own function decides
            return await stock(session, request_type, model_id, request_data, seq_id)
        if row.request_type != request_type or row.request_data != data:
            raise api.HTTPException(status_code=409, detail="Training request sequence number was reused")
        return row.request_id

    return create_future


async def resolve_finished(api, db_engine, waiters: dict) -> None:
    """One look at the awaited futures: hand finished ones to their waiters, KeyError for unknown ids.

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


def describe() -> dict:
    """What the capabilities route says about the request path (API process)."""
    if _state["installed"] != "api":
        return {"wake": "timer (stock SkyRL)"}
    return {"wake": "notify", "engine_joined": _state["engine_joined"], "log": _state["log"],
            "submit": _state["submit"],
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
        log("engine waits for the API's ring instead of sleeping 100 ms between looks")


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


if __name__ == "__main__":
    check_targets()
    print(f"{NAME} {VERSION}: " + ", ".join(f"{m}.{a}" for m, a in TARGETS) + " present")
    print(f"{NAME} {VERSION}: " + check_submit())
