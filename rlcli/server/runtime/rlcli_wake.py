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
Each look of the engine first asks the database which request types are pending (one query) and skips SkyRL's
finders for the types that are not (look_for_pending_kinds): SkyRL's scheduling pass runs ~7 queries through the
ORM per look (each finder of model passes looks for barriers, then its type; samples; single requests), on the path
of every request before its computation starts, most of them for types nobody sent.
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
VERSION = "1.4"
ENV_ID = "RLCLI_WAKE_ID"
# "1" keeps SkyRL's rich log handler (the A/B of benchmarks/request_path.py --ab-env, or a taste for it).
RICH_LOG_ENV = "RLCLI_RICH_LOG"
# "1" keeps SkyRL's own create_future (select, then insert in a savepoint): the A/B, or a database we do not know.
STOCK_SUBMIT_ENV = "RLCLI_STOCK_SUBMIT"
# "1" runs SkyRL's whole scheduling pass on every look, every finder querying for its request type (the A/B).
STOCK_LOOK_ENV = "RLCLI_STOCK_LOOK"
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
]

_state = {"installed": None, "engine_joined": False, "rings_sent": 0, "rings_heard": 0, "log": "rich (stock)",
          "submit": "stock", "look": "every finder (stock)"}


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
    if os.environ.get(STOCK_LOOK_ENV) != "1":
        look_for_pending_kinds(TinkerEngine)
        _state["look"] = "pending types first"
    _state["installed"] = "engine"


def look_for_pending_kinds(engine_cls) -> None:
    """Each look (process_pending_requests_once) first reads which request types are pending, in one query; a
    finder whose types are not among them returns nothing without querying, as it would have found nothing.

    SkyRL's finders read the pending rows of their own types (find_batchable_model_passes: the destructive
    barriers, then the passes of its type; find_batchable_sample; find_single_requests: the barriers, then
    every type but passes, samples and external requests), so with no pending row of those types each returns
    {}. A request filed after the first query is found on the next look: its commit rings the engine, which
    then looks again at once; that is the order in which the stock pass would have found it had it been
    filed a moment later. Outside a look (a caller of a finder alone) the finders run as stock."""
    from skyrl.tinker import types
    from skyrl.tinker.db_models import FutureDB, RequestStatus
    from sqlmodel import Session, select

    kinds_query = select(FutureDB.request_type).where(FutureDB.status == RequestStatus.PENDING).distinct()
    kind = types.RequestType
    not_single = {kind.FORWARD_BACKWARD, kind.FORWARD, kind.SAMPLE, kind.EXTERNAL}
    once = engine_cls.process_pending_requests_once
    passes, samples, singles = (engine_cls.find_batchable_model_passes, engine_cls.find_batchable_sample,
                                engine_cls.find_single_requests)

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

    engine_cls.process_pending_requests_once = process_pending_requests_once
    engine_cls.find_batchable_model_passes = find_batchable_model_passes
    engine_cls.find_batchable_sample = find_batchable_sample
    engine_cls.find_single_requests = find_single_requests


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
            "engine_look": "every finder (stock)" if os.environ.get(STOCK_LOOK_ENV) == "1" else "pending types first",
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
            kind.SAVE_WEIGHTS: {"path": "p"}, kind.EXTERNAL: {}}
    queues = [[], [kind.FORWARD], [kind.FORWARD_BACKWARD, kind.FORWARD_BACKWARD],
              [kind.FORWARD_BACKWARD, kind.OPTIM_STEP, kind.FORWARD_BACKWARD], [kind.SAMPLE, kind.SAMPLE],
              [kind.OPTIM_STEP], [kind.EXTERNAL, kind.FORWARD], [kind.SAVE_WEIGHTS, kind.SAMPLE],
              [kind.FORWARD, kind.OPTIM_STEP, kind.FORWARD, kind.SAMPLE, kind.SAVE_WEIGHTS, kind.FORWARD_BACKWARD]]
    stock = {name: getattr(TinkerEngine, name) for name in ("process_pending_requests_once",
             "find_batchable_model_passes", "find_batchable_sample", "find_single_requests")}

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
                              "kinds": sorted(self.__dict__.get("_rlcli_pending_kinds") or ())}

    def looks(folder: str, wrapped: bool) -> list:
        if wrapped:
            look_for_pending_kinds(Probe)
        outcomes = []
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
            probe.process_pending_requests_once()
            found = {k: (sorted(v) if isinstance(v, dict) else v) for k, v in probe.found.items()}
            outcomes.append((found, sorted(set(queue), key=str)))
            db.dispose()
        for name, fn in stock.items():
            if name != "process_pending_requests_once":
                setattr(Probe, name, fn)
        return outcomes

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        plain, fast = looks(a, False), looks(b, True)
    for (want, _), (got, pending_kinds) in zip(plain, fast, strict=True):
        if {k: v for k, v in got.items() if k != "kinds"} != {k: v for k, v in want.items() if k != "kinds"}:
            raise SystemExit(f"{NAME}: a look with pending types first differs from SkyRL's:\n  stock {want}\n"
                             f"  rlcli {got}")
        if got["kinds"] != sorted(pending_kinds, key=str) and got["kinds"] != sorted(pending_kinds):
            raise SystemExit(f"{NAME}: the pending-types query read {got['kinds']}, the queue holds {pending_kinds}")
    if not any(w["passes"] for w, _ in plain) or not any(w["singles"] for w, _ in plain):
        raise SystemExit(f"{NAME}: SkyRL's finders found nothing in the scratch queues: {plain}")
    return f"a look with pending types first finds what SkyRL's finders find ({len(queues)} queues)"


if __name__ == "__main__":
    check_targets()
    print(f"{NAME} {VERSION}: " + ", ".join(f"{m}.{a}" for m, a in TARGETS) + " present")
    print(f"{NAME} {VERSION}: " + check_submit())
    print(f"{NAME} {VERSION}: " + check_look())
