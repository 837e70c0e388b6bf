"""Futures retention: the engine deletes SkyRL's futures rows that finished more than FUTURES_RETENTION_ENV minutes
ago (`rlcli serve start --futures-retention`, default DEFAULT_MINUTES; 0 keeps every row), at most once a minute.

SkyRL writes one row per request and never deletes one (31,000 an hour under the soak's mix). Kept whatever their
age: pending rows, and the newest row, whose id SkyRL's sqlite table hands out again once it is gone (the next id is
max(id) + 1). Why an hour: docs/decisions.md, "Futures rows are kept for an hour".
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta

from shared import FUTURES_RETENTION_ENV
from skyrl.tinker.db_models import FutureDB, RequestStatus
from sqlalchemy import delete, func, select
from sqlmodel import Session

DEFAULT_MINUTES = 60
EVERY_S = 60.0
BATCH = 20_000  # rows per statement: a first prune of a long-kept table never holds the database for long


def log(message: str) -> None:
    print(f"[rlcli futures] {message}", file=sys.stderr, flush=True)


def retention_minutes() -> int:
    raw = os.environ.get(FUTURES_RETENTION_ENV, "").strip()
    if not raw:
        return DEFAULT_MINUTES
    if not raw.isdigit():
        raise SystemExit(f"rlcli futures: {FUTURES_RETENTION_ENV}={raw!r}: give a whole number of minutes "
                         "(0 keeps every futures row)")
    return int(raw)


def prune(db_engine, older_than: datetime) -> int:
    """Delete finished rows completed before `older_than` (UTC), never a pending row nor the newest; how many."""
    newest = select(func.max(FutureDB.request_id)).scalar_subquery()
    old = (select(FutureDB.request_id)
           .where(FutureDB.status != RequestStatus.PENDING, FutureDB.completed_at < older_than,
                  FutureDB.request_id < newest)
           .order_by(FutureDB.request_id).limit(BATCH))
    deleted = 0
    with Session(db_engine) as session:
        while True:
            # A derived table: MySQL refuses a subquery on the table a DELETE changes; sqlite and Postgres take both.
            ids = select(old.subquery().c.request_id)
            count = session.execute(delete(FutureDB).where(FutureDB.request_id.in_(ids))).rowcount
            session.commit()
            deleted += count
            if count < BATCH:
                return deleted


class Pruner:
    """The engine's: `maybe()` after each look prunes when EVERY_S have passed since the last prune."""

    def __init__(self, db_engine, minutes: int, every_s: float = EVERY_S):
        self.db_engine, self.minutes, self.every_s = db_engine, minutes, every_s
        self.last = -every_s  # the first look prunes: rows an earlier server left

    def maybe(self) -> None:
        if not self.minutes or time.monotonic() - self.last < self.every_s:
            return
        self.last = time.monotonic()
        try:
            if deleted := prune(self.db_engine, datetime.now(UTC) - timedelta(minutes=self.minutes)):
                log(f"deleted {deleted} futures rows finished more than {self.minutes} minutes ago")
        except Exception as e:  # housekeeping: the engine serves without it, and tries again next time
            log(f"could not delete old futures rows: {type(e).__name__}: {e}")
