"""runtime/rlcli_sqlite.py's inline connection on real sqlite files (stdlib only: no SkyRL, no SQLAlchemy)."""

from __future__ import annotations

import asyncio
import importlib.util
import sqlite3

import pytest

from rlcli.server import commands


def _module():
    spec = importlib.util.spec_from_file_location("rlcli_sqlite_under_test", commands.RUNTIME_DIR / "rlcli_sqlite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_lock_refusals_count_as_locked(tmp_path):
    sq = _module()
    holder = sqlite3.connect(tmp_path / "db", isolation_level=None)
    holder.execute("CREATE TABLE t (v)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(tmp_path / "db", timeout=0)
    with pytest.raises(sqlite3.OperationalError) as locked:
        other.execute("INSERT INTO t VALUES (1)")
    assert sq.is_locked(locked.value)
    with pytest.raises(sqlite3.OperationalError) as wrong:
        other.execute("SELECT nothing FROM nowhere")
    assert not sq.is_locked(wrong.value)
    assert not sq.is_locked(ValueError("database is locked"))


@pytest.mark.parametrize("sql, wanted", [("PRAGMA busy_timeout=30000", "30000"), ("pragma BUSY_TIMEOUT = 5;", "5"),
                                         ("PRAGMA busy_timeout", None), ("PRAGMA journal_mode=WAL", None)])
def test_the_busy_timeout_pragma_is_recognised(sql, wanted):
    match = _module().SET_BUSY_TIMEOUT.match(sql)
    assert (match.group(1) if match else None) == wanted


def test_statements_run_inline_and_a_locked_one_waits_in_a_thread(tmp_path):
    sq = _module()
    path = str(tmp_path / "db")

    async def scenario():
        conn = await sq.InlineConnection.open(path, timeout=5.0)
        assert conn.patience_ms == 5000
        cursor = await conn.execute("PRAGMA busy_timeout=30000")  # SkyRL's; kept aside, the loop's stays 0
        assert conn.patience_ms == 30000
        assert (await (await conn.execute("PRAGMA busy_timeout")).fetchone()) == (0,)
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        cursor = await conn.execute("INSERT INTO t (v) VALUES (?)", ("a",))
        assert cursor.lastrowid == 1 and cursor.rowcount == 1
        await conn.commit()
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        waited = sq._state["waited_in_thread"]
        task = asyncio.create_task(conn.execute("INSERT INTO t (v) VALUES (?)", ("b",)))
        await asyncio.sleep(0.2)  # the loop runs while the insert waits for the lock
        assert not task.done() and sq._state["waited_in_thread"] == waited + 1
        holder.execute("COMMIT")
        await asyncio.wait_for(task, 30)
        await conn.commit()
        rows = await (await conn.execute("SELECT v FROM t ORDER BY id")).fetchall()
        assert rows == [("a",), ("b",)]
        assert (await (await conn.execute("PRAGMA busy_timeout")).fetchone()) == (0,)  # restored after the wait
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await conn.execute("SELECT * FROM nowhere")
        await conn.close()
        assert conn._connection is None
        holder.close()

    asyncio.run(scenario())


def test_a_cancelled_lock_wait_frees_the_connection_before_it_returns(tmp_path):
    sq = _module()
    path = str(tmp_path / "db")

    async def scenario():
        conn = await sq.InlineConnection.open(path, timeout=30.0)
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("CREATE TABLE t (v)")
        await conn.commit()
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        task = asyncio.create_task(conn.execute("INSERT INTO t VALUES (1)"))
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.sleep(0.2)
        assert not task.done()  # still waiting for the worker, which waits for the lock
        holder.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await task
        await conn.rollback()  # the connection is free: the caller's cleanup runs on it at once
        assert await (await conn.execute("SELECT count(*) FROM t")).fetchall() == [(0,)]
        await conn.close()
        holder.close()

    asyncio.run(scenario())
