"""rlcli server extension: the API's sqlite statements run on its event loop, not one thread round trip each.

Runs INSIDE the server venv (Python 3.12): standard library, skyrl and what skyrl imports; never rlcli.
The launcher imports it when RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, unless
--no-extensions) and calls `register(role)`; only the API process changes (the engine uses plain sqlite3).

Why: SkyRL 0.4.0's API reaches its sqlite database through SQLAlchemy's aiosqlite driver, which runs every
call on a thread of its own and hands the answer back to the event loop: a cursor, its execute, its fetch and
its close are one round trip each. A submit (look up the model, look for a retried seq_id, savepoint, insert,
release, commit, the pool's rollback) takes about twenty, a look for finished futures about five. Each is
two thread wake-ups, and on a busy machine the thread and the loop wait for a core each time: milliseconds
per request for statements that themselves take microseconds.

How: the API's async engine gets (SQLAlchemy's own `async_creator` hook) a connection that keeps aiosqlite's
interface but runs each statement directly, on the loop, with sqlite's busy timeout at zero. A statement that
finds the database locked (the engine is committing) fails at once, without effect, and is run again in a
worker thread with the busy timeout SkyRL asked for (`PRAGMA busy_timeout=30000`): the wait for a lock never
blocks the loop, and it ends as stock's would. The statements, transactions, commits and PRAGMAs are the
same as stock's (the database file is the same; the engine reads the queue as before; crash safety is
unchanged). Only a file sqlite database changes: Postgres (asyncpg is natively async), an in-memory database
or an engine created with a creator of its own keeps SkyRL's path, and the capabilities route says which.

Off unless RLCLI_SQLITE_INLINE=1 is in the server's environment. Measured on a loaded 2-core machine, the
database part of a request got faster (benchmarks/db_path.py: submit 1.6 -> 1.1 ms, a poll 0.50 -> 0.32 ms
p50) but the whole request did not (benchmarks/request_path.py --ab-env: 2-3 ms MORE overhead per request in
two alternating runs); until a quiet A/B says otherwise it stays opt-in.
`python rlcli_sqlite.py` checks in this venv that every piece it relies on is where it expects, and runs a
few statements through a real SQLAlchemy async engine on a temporary database.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import sys

NAME = "rlcli_sqlite"
VERSION = "1.0"
ON_ENV = "RLCLI_SQLITE_INLINE"  # "1": inline; anything else: stock (the default)
LOCKED_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # primary codes; extended ones share the low byte
SET_BUSY_TIMEOUT = re.compile(r"\s*PRAGMA\s+busy_timeout\s*=\s*(\d+)\s*;?\s*$", re.IGNORECASE)
DEFAULT_PATIENCE_MS = 5000  # sqlite3.connect's own default timeout (5 s), what aiosqlite would have used

_state = {"mode": None, "why": None, "connections": 0, "statements": 0, "waited_in_thread": 0}


def log(message: str) -> None:
    # The launcher's supervisor copies this process's stderr into the server log.
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


def is_locked(error: BaseException) -> bool:
    """Did sqlite refuse because another connection holds a lock (SQLITE_BUSY/LOCKED and their variants)?"""
    code = getattr(error, "sqlite_errorcode", None)
    return isinstance(error, sqlite3.OperationalError) and code is not None and (code & 0xFF) in LOCKED_CODES


class InlineConnection:
    """aiosqlite.Connection's interface, as SQLAlchemy's aiosqlite adapter uses it, over one sqlite3 connection.

    Every method runs the sqlite3 call directly. `_run` is the only place a statement may wait for a lock,
    and it does so in a worker thread."""

    def __init__(self, connection: sqlite3.Connection, patience_ms: int):
        self._connection: sqlite3.Connection | None = connection  # the adapter tests it for "still open"
        self.patience_ms = patience_ms
        self._tx = _InlineQueue()  # the adapter's isolation_level setter queues (future, fn) here

    @classmethod
    async def open(cls, database, **kwargs) -> InlineConnection:
        patience_s = kwargs.pop("timeout", DEFAULT_PATIENCE_MS / 1000)
        kwargs.pop("iter_chunk_size", None)
        kwargs["check_same_thread"] = False  # a locked statement is retried on a worker thread
        connection = sqlite3.connect(database, timeout=0, **kwargs)
        _state["connections"] += 1
        return cls(connection, int(patience_s * 1000))

    @property
    def _conn(self) -> sqlite3.Connection:
        return self._connection

    async def _run(self, fn, *args):
        _state["statements"] += 1
        try:
            return fn(*args)
        except sqlite3.OperationalError as e:
            if not is_locked(e):
                raise
        _state["waited_in_thread"] += 1
        waiting = asyncio.ensure_future(asyncio.to_thread(self._patiently, fn, *args))
        try:
            return await asyncio.shield(waiting)
        except asyncio.CancelledError:
            # The caller's cleanup (a rollback, a close) comes next on this connection: let the worker finish
            # with it first, as aiosqlite's queue would have (its rollback waited behind the statement too).
            await asyncio.wait([waiting])
            raise

    def _patiently(self, fn, *args):
        """fn again, allowed to wait for the lock as long as SkyRL asked (stock behaviour, off the loop)."""
        self._connection.execute(f"PRAGMA busy_timeout = {int(self.patience_ms)}")
        try:
            return fn(*args)
        finally:
            self._connection.execute("PRAGMA busy_timeout = 0")

    def cursor(self) -> InlineCursor:
        return InlineCursor(self)

    async def execute(self, sql, parameters=None) -> InlineCursor:
        cursor = self.cursor()
        return await cursor.execute(sql, parameters)

    async def commit(self) -> None:
        await self._run(self._connection.commit)

    async def rollback(self) -> None:
        self._connection.rollback()

    async def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def stop(self) -> None:  # the adapter's forced terminate
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def create_function(self, *args, **kwargs) -> None:
        self._connection.create_function(*args, **kwargs)

    @property
    def isolation_level(self):
        return self._connection.isolation_level

    @isolation_level.setter
    def isolation_level(self, value) -> None:
        self._connection.isolation_level = value


class _InlineQueue:
    """Runs what SQLAlchemy's adapter would put on aiosqlite's worker queue, at once."""

    @staticmethod
    def put_nowait(item) -> None:
        future, function = item
        try:
            future.set_result(function())
        except Exception as e:
            future.set_exception(e)


class InlineCursor:
    """aiosqlite.Cursor's interface over one sqlite3 cursor."""

    def __init__(self, connection: InlineConnection):
        self._owner = connection
        self._cursor = connection._connection.cursor()

    async def __aenter__(self) -> InlineCursor:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def execute(self, sql, parameters=None) -> InlineCursor:
        wanted = None if parameters else SET_BUSY_TIMEOUT.match(sql)
        if wanted:  # SkyRL's patience: kept for locked statements, the loop's own connection stays at 0
            self._owner.patience_ms = int(wanted.group(1))
            sql = "PRAGMA busy_timeout = 0"
        await self._owner._run(self._cursor.execute, sql, () if parameters is None else parameters)
        return self

    async def executemany(self, sql, seq_of_parameters) -> InlineCursor:
        await self._owner._run(self._cursor.executemany, sql, seq_of_parameters)
        return self

    async def fetchone(self):
        return self._cursor.fetchone()

    async def fetchmany(self, size=None):
        return self._cursor.fetchmany() if size is None else self._cursor.fetchmany(size)

    async def fetchall(self):
        return self._cursor.fetchall()

    async def close(self) -> None:
        self._cursor.close()

    @property
    def description(self):
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self):
        return self._cursor.lastrowid

    @property
    def arraysize(self) -> int:
        return self._cursor.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cursor.arraysize = value


def inline_creator(url):
    """An async_creator for a sqlite+aiosqlite file URL, or (None, why not) where stock must stay."""
    from sqlalchemy.dialects.sqlite.aiosqlite import SQLiteDialect_aiosqlite
    from sqlalchemy.engine import make_url

    url = make_url(url)
    if url.drivername != "sqlite+aiosqlite":
        return None, f"{url.get_backend_name()} ({url.drivername}): SkyRL's own async driver"
    if not SQLiteDialect_aiosqlite._is_url_file_db(url):
        return None, "an in-memory sqlite database: SkyRL's aiosqlite path"
    args, kwargs = SQLiteDialect_aiosqlite().create_connect_args(url)

    async def creator() -> InlineConnection:
        return await InlineConnection.open(*args, **dict(kwargs))

    return creator, None


def check_targets() -> None:
    """Raise unless the SkyRL and SQLAlchemy pieces this extension relies on are where it expects."""
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path
    from skyrl.tinker import api
    from sqlalchemy.dialects.sqlite import aiosqlite
    from sqlalchemy.ext.asyncio import engine as async_engine

    lifespan = getattr(api.lifespan, "__wrapped__", api.lifespan)
    pins.require(NAME, {
        "skyrl.tinker.api.create_async_engine": getattr(api, "create_async_engine", None),
        "api.lifespan calling create_async_engine by name": "create_async_engine" in lifespan.__code__.co_names,
        "skyrl.tinker.db_models.get_async_database_url (sqlite -> sqlite+aiosqlite)":
            getattr(api, "get_async_database_url", None),
        "sqlalchemy create_async_engine(async_creator=)":
            "async_creator" in async_engine.create_async_engine.__code__.co_consts,
        "sqlalchemy aiosqlite dialect's _is_url_file_db": aiosqlite.SQLiteDialect_aiosqlite._is_url_file_db,
        "sqlalchemy aiosqlite dialect's create_connect_args": aiosqlite.SQLiteDialect_aiosqlite.create_connect_args,
    })


def install_api() -> None:
    from skyrl.tinker import api

    check_targets()
    original = api.create_async_engine

    def create_async_engine(url, **kwargs):
        creator, why = (None, "the caller brought its own creator") if (
            "creator" in kwargs or "async_creator" in kwargs) else inline_creator(url)
        if creator is None:
            _state.update(mode="stock", why=why)
            log(f"stock database path: {why}")
            return original(url, **kwargs)
        _state.update(mode="inline", why=None)
        log("sqlite statements run on the API's event loop; a locked one waits in a worker thread")
        return original(url, async_creator=creator, **kwargs)

    api.create_async_engine = create_async_engine


def describe() -> dict:
    """What the capabilities route says about the API's database path."""
    if _state["mode"] != "inline":
        return {"db_path": "stock (aiosqlite thread per statement)" if _state["mode"] is None else "stock",
                "why": _state["why"] or "not installed"}
    return {"db_path": "inline", "connections": _state["connections"], "statements": _state["statements"],
            "waited_for_lock_in_thread": _state["waited_in_thread"]}


def register(role: str) -> None:
    if role != "api":
        return
    if os.environ.get(ON_ENV) != "1":
        _state.update(mode="stock", why=f"{ON_ENV} is not 1 (opt-in)")
        return
    install_api()


async def _self_check() -> None:
    """Statements through a real SQLAlchemy async engine on a temporary file: results, errors, a lock wait."""
    import tempfile

    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite+aiosqlite:///{folder}/check.db"
        creator, why = inline_creator(url)
        assert creator is not None, why
        engine = create_async_engine(url, async_creator=creator)
        async with engine.begin() as conn:
            await conn.execute(text("PRAGMA journal_mode=WAL"))
            await conn.execute(text("PRAGMA busy_timeout=30000"))
            await conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT UNIQUE)"))
            await conn.execute(text("INSERT INTO t (v) VALUES ('a'), ('b')"))
        async with engine.connect() as conn:
            rows = (await conn.execute(text("SELECT id, v FROM t ORDER BY id"))).all()
            assert [tuple(r) for r in rows] == [(1, "a"), (2, "b")], rows
        try:
            async with engine.begin() as conn:
                await conn.execute(text("INSERT INTO t (v) VALUES ('a')"))
            raise AssertionError("a duplicate insert passed")
        except Exception as e:
            assert "UNIQUE" in str(e), e
        holder = sqlite3.connect(f"{folder}/check.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process's writer, like the engine completing futures
        before = _state["waited_in_thread"]

        async def writer():
            async with engine.begin() as conn:
                await conn.execute(text("INSERT INTO t (v) VALUES ('c')"))

        task = asyncio.create_task(writer())
        await asyncio.sleep(0.2)
        assert not task.done() and _state["waited_in_thread"] == before + 1, "a locked insert did not wait aside"
        holder.execute("COMMIT")
        await asyncio.wait_for(task, 10)
        holder.close()
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 3
        await engine.dispose()


if __name__ == "__main__":
    check_targets()
    asyncio.run(_self_check())
    print(f"{NAME} {VERSION}: skyrl.tinker.api.create_async_engine and sqlalchemy's aiosqlite hooks present; "
          "inline statements, errors and a lock wait checked")
