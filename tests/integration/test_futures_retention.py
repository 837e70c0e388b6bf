"""Futures retention (runtime/rlcli_futures.py): the engine deletes SkyRL's futures rows finished more than
--futures-retention minutes ago, never a pending row nor the newest, on sqlite and on Postgres; the running server
prunes and keeps handing out new ids above every old one.

The policy runs `prune` itself in the server venv against SkyRL's own tables (fast); the real server prunes the rows
an earlier server left in its database, finished two hours ago (a retention of minutes cannot be waited for in a
test). Those rows are written with SkyRL's own models into the file the server then opens, as its API makes it
(SQLModel's create_all): one server start, not a first one to leave rows and a second to prune them.
"""

from __future__ import annotations

import sqlite3
import subprocess

import pytest

from rlcli.server import commands
from rlcli.server.private import private_server
from tests.conftest import shared_compile_cache, shared_server_venv

pytestmark = pytest.mark.server

# Rows (status, minutes since completion); the last row is the newest and old: it must stay.
POLICY = r"""
import sys
from datetime import datetime, timedelta, timezone
import rlcli_futures as futures
from skyrl.tinker import types
from skyrl.tinker.db_models import FutureDB, RequestStatus
from sqlmodel import Session, SQLModel, create_engine, select

engine = create_engine(sys.argv[1])
SQLModel.metadata.create_all(engine)
now = datetime.now(timezone.utc)
rows = [("completed", 120), ("failed", 90), ("pending", None), ("completed", 30), ("completed", 61),
        ("completed", 5), ("completed", 200)]
with Session(engine) as session:
    for status, minutes in rows:
        session.add(FutureDB(request_type=types.RequestType.FORWARD, request_data={}, status=RequestStatus(status),
                             completed_at=None if minutes is None else now - timedelta(minutes=minutes)))
    session.commit()
futures.BATCH = 2  # several statements, as a first prune of a long-kept table takes
deleted = futures.prune(engine, now - timedelta(minutes=60))
with Session(engine) as session:
    kept = session.exec(select(FutureDB.request_id).order_by(FutureDB.request_id)).all()
    session.add(FutureDB(request_type=types.RequestType.FORWARD, request_data={}))
    session.commit()
    newest = session.exec(select(FutureDB.request_id).order_by(FutureDB.request_id.desc())).first()
print(deleted, list(kept), newest)
"""

# What an earlier server leaves: finished rows (its readiness round trip's), here finished two hours ago.
EARLIER = r"""
import sys
from datetime import datetime, timedelta, timezone
from skyrl.tinker import types
from skyrl.tinker.db_models import FutureDB, RequestStatus
from sqlmodel import Session, SQLModel, create_engine

engine = create_engine(sys.argv[1])
SQLModel.metadata.create_all(engine)
aged = datetime.now(timezone.utc) - timedelta(hours=2)
with Session(engine) as session:
    for status in ("completed", "failed", "completed"):
        session.add(FutureDB(request_type=types.RequestType.FORWARD, request_data={}, status=RequestStatus(status),
                             completed_at=aged))
    session.commit()
"""


def _in_server_venv(script: str, url: str) -> str:
    python = shared_server_venv() / "bin" / "python"
    run = subprocess.run([str(python), "-c", script, url], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(commands.RUNTIME_DIR), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def _policy(url: str) -> str:
    return _in_server_venv(POLICY, url)


def test_old_finished_rows_go_pending_recent_and_the_newest_stay_on_sqlite(tmp_path):
    # ids 1..7: 1, 2 and 5 finished over an hour ago; 3 is pending; 4 and 6 are recent; 7 is old but the newest.
    # The next row takes 8: the newest's id is never handed out again.
    assert _policy(f"sqlite:///{tmp_path / 'tinker.db'}") == "3 [3, 4, 6, 7] 8"


def test_the_same_on_postgres(request):
    url = request.getfixturevalue("postgres").replace("postgresql://", "postgresql+psycopg2://")
    assert _policy(url) == "3 [3, 4, 6, 7] 8"


def test_a_running_server_prunes_what_an_earlier_start_left(tmp_path, embedded_model):
    """An earlier server's rows, finished two hours ago: this start's engine deletes them at its first look, and its
    own requests take ids above every one of them."""
    home = shared_compile_cache(tmp_path / "home")  # the programs earlier sessions compiled
    db = home / "servers" / "default" / "tinker.db"
    db.parent.mkdir(parents=True, mode=0o700)
    _in_server_venv(EARLIER, f"sqlite:///{db}")
    with sqlite3.connect(db) as con:
        first = [i for (i,) in con.execute("SELECT request_id FROM futures ORDER BY request_id")]
    assert len(first) == 3, first
    with private_server(embedded_model, home=home) as server:
        log = server.log.read_text()
    with sqlite3.connect(db) as con:
        kept = [i for (i,) in con.execute("SELECT request_id FROM futures ORDER BY request_id")]
    # The first look may come before or after this start's own readiness rows: the earlier server's newest row
    # stays only while it is the newest of all.
    gone = len(first) - len(set(first) & set(kept))
    assert set(first) & set(kept) <= {first[-1]} and gone >= len(first) - 1, (first, kept)
    assert f"deleted {gone} futures rows finished more than 60 minutes ago" in log, log[-3000:]
    assert [i for i in kept if i not in first] and min(i for i in kept if i not in first) > first[-1]
