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
VERSION = "1.1"
ENV_ID = "RLCLI_WAKE_ID"
# "1" keeps SkyRL's rich log handler (the A/B of benchmarks/request_path.py --ab-env, or a taste for it).
RICH_LOG_ENV = "RLCLI_RICH_LOG"
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
]

_state = {"installed": None, "engine_joined": False, "rings_sent": 0, "rings_heard": 0, "log": "rich (stock)"}


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
                      for name in ("FutureDB", "TERMINAL_STATUSES", "AsyncSession", "select")})
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
    os.environ[ENV_ID] = wake_id  # the engine process is started by the API and inherits this
    _state["installed"] = "api"
    return wake_id


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


if __name__ == "__main__":
    check_targets()
    print(f"{NAME} {VERSION}: " + ", ".join(f"{m}.{a}" for m, a in TARGETS) + " present")
