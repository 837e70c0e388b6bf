"""SkyRL's API and engine ring each other instead of looking on timers; small results ride the engine's ring.

Runs INSIDE the server venv: standard library at import, skyrl inside functions. The engine's side is
rlcli_engine.RlcliEngine; here are the doorbells (a Linux abstract datagram socket per process, named by a random id
the API hands its engine in the environment), the ring messages and the API's rebindings. The database stays where
every request and result is kept; a lost ring only delays a look to the safety interval. Why and measurements:
docs/upstream/polling-sleeps.md, request-path-queries.md, rich-log-on-request-path.md; docs/decisions.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import secrets
import select
import socket
import sys

ENV_ID = "RLCLI_WAKE_ID"  # the API's doorbell id, inherited by the engine it starts
MODEL_CHECK_ROUTES = ("forward_backward", "optim_step")  # routes that read a model's row only for their 404
RING_RESULTS_MAX = 32 * 1024  # results up to this many bytes of JSON (one completion together) ride the ring
RECV_MAX = RING_RESULTS_MAX + 64 * 1024  # a results ring's header names each result: room for thousands
OWED_RETRY_S = 0.01  # the engine rings again this soon when its ring did not fit in the API's socket
READY_MAX = 2048  # results rung before anybody asked (a client that never asks): each fit a ring, so <= 64 MiB
FILED_MAX = 1 << 16
# How often each side looks without a ring: not latency (a ring wakes a waiting side) but the bound on a lost
# ring's cost; the engine's look also runs SkyRL's periodic session cleanup.
ENGINE_SAFETY_S = 1.0
API_SAFETY_S = 0.5
ENGINE_HELLO = b"engine-up"

_state = {"engine_joined": False, "rings_sent": 0, "rings_heard": 0, "results": None, "model_checks": None}


def log(message: str) -> None:
    print(f"[rlcli wake] {message}", file=sys.stderr, flush=True)


class Doorbell:
    """This process's datagram socket: ring the peer, wait for or drain rings from it."""

    def __init__(self, wake_id: str, own: str, peer: str):
        self.peer = f"\0rlcli-wake-{wake_id}-{peer}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(f"\0rlcli-wake-{wake_id}-{own}")
        self.sock.setblocking(False)

    def ring(self, message: bytes = b"!") -> bool:
        """False when it did not go (the caller decides whether that matters)."""
        try:
            self.sock.sendto(message, self.peer)
            _state["rings_sent"] += 1
            return True
        except OSError:  # a full socket: the peer has rings queued; refused: the peer looks when it starts
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


class EngineBell(Doorbell):
    """The engine's side: numbered rings to the API, and a ring still owed when the API's socket was full."""

    def __init__(self, wake_id: str):  # the API's (ENV_ID): rlcli's API always makes one
        super().__init__(wake_id, own="engine", peer="api")
        self.sequence = itertools.count(1)
        self.completed = 0  # completions so far: the loop looks again at once after one
        self.owed = False

    def look_ring(self) -> None:
        """After a commit: "read the database" (owed while the API's socket is full)."""
        self.owed = not self.ring(plain_message(next(self.sequence)))

    def results(self, rows: list[dict]) -> bool:
        """Ring with finished futures' rows before their commit; False: the API must read the database."""
        message = results_message(next(self.sequence), rows)
        rung = message is not None and self.ring(message)
        self.owed = self.owed and not rung
        return rung


def relax_sqlite_sync() -> None:
    """sqlite commits without an fsync each (synchronous=NORMAL: 0.5 -> 0.01 ms a commit); safe in SkyRL's WAL mode."""
    from sqlalchemy import event
    from sqlalchemy.pool import Pool

    def on_connect(dbapi_connection, _record) -> None:
        if "sqlite" in type(dbapi_connection).__module__:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

    event.listen(Pool, "connect", on_connect)


def plain_log(logger_name: str = "skyrl") -> int:
    """Swap the logger's rich handlers for plain ones (same format, level and stream); return how many."""
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


def results_message(seq: int, rows: list[dict]) -> bytes | None:
    """b"R", a JSON header [seq, [[request_id, status, n_bytes], ...]], a newline, the results' JSON texts; None over
    RING_RESULTS_MAX (the API then reads the database)."""
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
    """The engine's ring that only says "look"."""
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


class Results:
    """The API's side: `filed`, futures this process filed (the engine rings with their results); `ready`, results
    rung before their retrieve_future. Anything else is read from the database."""

    def __init__(self, api):
        self.api = api
        self.filed: dict[int, object] = {}
        self.ready: dict[int, tuple] = {}
        self.seq = self.by_ring = self.look_rings = self.db_reads = 0
        self.need_db = True

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
            seq, entries = read_results(message) if message[:1] == b"R" else (int(message[1:] or 0), None)
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
            if not settle(waiters, request_id, outcome):
                self.ready[request_id] = outcome
                if len(self.ready) > READY_MAX:  # the oldest unasked goes
                    self.ready.pop(next(iter(self.ready)))

    def read_from_db(self, outcomes: dict) -> None:
        """After a database read: those futures are settled, no ring will bring them."""
        self.db_reads += 1
        for request_id in outcomes:
            self.filed.pop(request_id, None)


def install_api(api) -> str:
    """Rebind the API's poller, wait_for_future, create_future and get_model; the engine inherits the wake id."""
    import time

    from sqlalchemy import event
    from sqlalchemy.orm import Session

    relax_sqlite_sync()
    plain_log()
    wake_id = secrets.token_hex(8)
    bell = Doorbell(wake_id, own="api", peer="engine")
    wake = {"event": None, "waiters": {}}
    results = _state["results"] = Results(api)
    # Every commit in this process may have queued work (a new future) or freed a slot: ring.
    event.listen(Session, "after_commit", lambda _session: bell.ring())

    def on_readable() -> None:
        for message in bell.drain():
            results.heard(message, wake["waiters"])
        if wake["event"] is not None:
            wake["event"].set()

    async def poll_futures(db_engine, waiters, poll_interval_sec=None):
        """By the engine's ring, or from the database when no ring can bring them (at least every API_SAFETY_S)."""
        loop = asyncio.get_running_loop()
        wake["event"], wake["waiters"] = asyncio.Event(), waiters
        loop.add_reader(bell.sock.fileno(), on_readable)
        last_read = 0.0
        try:
            while True:
                wake["event"].clear()
                if not waiters:
                    last_read = time.monotonic()  # the safety read counts from when somebody waits
                if waiters and (results.need_db or time.monotonic() - last_read >= API_SAFETY_S):
                    results.need_db, last_read = False, time.monotonic()
                    try:
                        results.read_from_db(await resolve_finished(api, db_engine, waiters))
                    except Exception as e:  # keep serving: each waiter also has its own timeout
                        log(f"future poller iteration failed: {e!r}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake["event"].wait(), API_SAFETY_S if waiters else None)
        finally:
            loop.remove_reader(bell.sock.fileno())

    stock_wait = api.wait_for_future

    @functools.wraps(stock_wait)
    async def wait_for_future(waiters, request_id, timeout):
        outcome = results.ready.pop(request_id, None)
        if outcome is not None:  # its ring came before its retrieve_future
            return outcome
        if request_id not in results.filed:
            # Not a result the engine will ring with: read the database now. The waiter is added before the
            # stock coroutine first yields, so the poller, woken here, finds it in `waiters`.
            results.need_db = True
        if wake["event"] is not None:
            wake["event"].set()
        return await stock_wait(waiters, request_id, timeout)

    api.poll_futures, api.wait_for_future = poll_futures, wait_for_future
    api.create_future = one_statement_submit(api, results.file)
    _state["model_checks"] = skip_known_model_checks(api)
    os.environ[ENV_ID] = wake_id
    return wake_id


def skip_known_model_checks(api) -> dict:
    """get_model without the read of a model already read, when a MODEL_CHECK_ROUTE awaits it: SkyRL 0.4.0's drop
    the row (tests/integration/server_checks.py reads it in their bytecode), and rows are never deleted. Every other
    caller reads as stock. Returns its counters."""
    stock = api.get_model
    checking = {getattr(api, route).__code__ for route in MODEL_CHECK_ROUTES}
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
    """create_future as one `INSERT ... ON CONFLICT DO NOTHING RETURNING` (sqlite, PostgreSQL); on a conflict the row
    there decides, as stock (a retry gets its id, else 409). Another database keeps SkyRL's function."""
    from datetime import UTC, datetime

    from sqlalchemy.dialects import postgresql, sqlite

    stock = api.create_future
    table = api.FutureDB.__table__
    inserts = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}

    @functools.wraps(stock)
    async def create_future(session, request_type, model_id, request_data, seq_id=None):
        insert = inserts.get(getattr(getattr(session.bind, "dialect", None), "name", None))
        if insert is None:
            return await stock(session, request_type, model_id, request_data, seq_id)
        data = request_data.model_dump(mode="json")
        statement = insert(table).values(request_type=request_type, model_id=model_id, seq_id=seq_id,
                                         request_data=data, status=api.RequestStatus.PENDING,
                                         created_at=datetime.now(UTC))
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
    """Hand finished futures to their waiters as SkyRL's poller does (KeyError for ids with no row); the outcomes."""
    ids = list(waiters)
    table = api.FutureDB
    query = api.select(table.request_id, table.status, table.request_type, table.result_data).where(
        table.request_id.in_(ids))
    async with api.AsyncSession(db_engine) as session:
        rows = (await session.exec(query)).all()
    outcomes = {rid: (status, kind, data) for rid, status, kind, data in rows if status in api.TERMINAL_STATUSES}
    outcomes.update({rid: KeyError(rid) for rid in set(ids) - {row[0] for row in rows}})
    for rid, outcome in outcomes.items():
        settle(waiters, rid, outcome)
    return outcomes


def settle(waiters: dict, request_id: int, outcome) -> bool:
    """Give the waiters of request_id its outcome (a KeyError is raised in them); whether one was still waiting."""
    handed = False
    for waiter in waiters.pop(request_id, ()):
        if not waiter.done():
            waiter.set_exception(outcome) if isinstance(outcome, KeyError) else waiter.set_result(outcome)
            handed = True
    return handed


def describe() -> dict:
    """What the capabilities route says about the request path (API process, after install_api)."""
    results = _state["results"]
    return {"wake": "notify", "engine_joined": _state["engine_joined"], "log": "plain", "submit": "one statement",
            "engine_look": "pending types first", "results": "in the ring", "ring_results_max_bytes": RING_RESULTS_MAX,
            "results_by_ring": results.by_ring, "database_reads": results.db_reads, "look_rings": results.look_rings,
            "model_check": "known models not read again", "model_checks_skipped": _state["model_checks"]["skipped"],
            "rings": {"to_engine": _state["rings_sent"], "from_engine": _state["rings_heard"]},
            "safety_look_s": {"engine": ENGINE_SAFETY_S, "api_while_waiting": API_SAFETY_S}}
