"""The API's database work per request, stock (aiosqlite) vs runtime/rlcli_sqlite.py (inline), alternately.

    .venv/bin/python benchmarks/db_path.py --reps 300 --rounds 6

No server and no engine: in the server venv, one temporary sqlite database with SkyRL's tables, and two async
engines on it, SkyRL's (sqlite+aiosqlite, a thread round trip per call) and rlcli_sqlite's inline one, both with
SkyRL's PRAGMAs and rlcli_wake's synchronous=NORMAL, as `rlcli serve start` runs them. Per engine, in
alternating rounds (A B, B A, ...), --reps of:
- submit: what SkyRL's forward_backward route does with the database (get_model, create_future with a seq_id,
  commit), through SkyRL's own functions;
- poll: the future poller's query for the awaited ids (one pending request);
- complete: an engine-like writer in another connection marks the future completed (not timed), then the poll
  that finds it.
The end-to-end request path (a real server, wall vs engine time) is benchmarks/request_path.py; this one shows
the database part alone, where a loaded machine's noise is smaller than the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import versions, write_receipt  # noqa: E402
from models import server_versions  # noqa: E402

from rlcli.config import server_venv_dir  # noqa: E402
from rlcli.server import commands  # noqa: E402

MEASURE = r"""
import asyncio, json, sqlite3, sys, tempfile, time
runtime, reps, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, runtime)
import rlcli_sqlite
from skyrl.tinker import api, types
from skyrl.tinker.db_models import FutureDB, ModelDB, SessionDB, RequestStatus, enable_sqlite_wal
from sqlalchemy import event
from sqlalchemy.ext.asyncio import create_async_engine
from sqlmodel import SQLModel
from sqlmodel.ext.asyncio.session import AsyncSession

def synchronous_normal(dbapi_connection, _record):  # what rlcli_wake sets on the served database
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()

async def main(folder):
    url = f"sqlite+aiosqlite:///{folder}/tinker.db"
    creator, _ = rlcli_sqlite.inline_creator(url)
    engines = {"stock": create_async_engine(url), "inline": create_async_engine(url, async_creator=creator)}
    for engine in engines.values():
        enable_sqlite_wal(engine.sync_engine)
        event.listen(engine.sync_engine, "connect", synchronous_normal)
    async with engines["stock"].begin() as conn:
        await conn.run_sync(SQLModel.metadata.create_all)
    async with AsyncSession(engines["stock"]) as session:
        session.add(SessionDB(session_id="s", sdk_version="0"))
        session.add(ModelDB(model_id="m", base_model="b", lora_config={}, status="ready", session_id="s", request_id=0))
        await session.commit()
    writer = sqlite3.connect(f"{folder}/tinker.db", isolation_level=None)
    request = types.OptimStepInput(adam_params=types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8,
                                                                   weight_decay=0.0))
    seq = [0]
    out = {name: {"submit_ms": [], "poll_ms": [], "poll_done_ms": []} for name in engines}

    async def one(name):
        engine, times = engines[name], out[name]
        seq[0] += 1
        t0 = time.perf_counter()
        async with AsyncSession(engine) as session:
            await api.get_model(session, "m")
            rid = await api.create_future(session, types.RequestType.OPTIM_STEP, "m", request, seq_id=seq[0])
            await session.commit()
        t1 = time.perf_counter()
        query = api.select(FutureDB.request_id, FutureDB.status, FutureDB.result_data).where(
            FutureDB.request_id.in_([rid]))
        async with AsyncSession(engine) as session:
            rows = (await session.exec(query)).all()
        t2 = time.perf_counter()
        assert rows[0][1] == RequestStatus.PENDING
        writer.execute("UPDATE futures SET status = 'COMPLETED', result_data = '{}' WHERE request_id = ?", (rid,))
        t3 = time.perf_counter()
        async with AsyncSession(engine) as session:
            rows = (await session.exec(query)).all()
        t4 = time.perf_counter()
        assert rows[0][1] == RequestStatus.COMPLETED, rows
        times["submit_ms"].append((t1 - t0) * 1e3)
        times["poll_ms"].append((t2 - t1) * 1e3)
        times["poll_done_ms"].append((t4 - t3) * 1e3)

    for name in engines:  # warm both pools and statement caches
        for _ in range(20):
            await one(name)
    out = {name: {k: [] for k in v} for name, v in out.items()}
    for r in range(rounds):
        for name in (("inline", "stock") if r % 2 == 0 else ("stock", "inline")):
            for _ in range(reps):
                await one(name)
    print(json.dumps({"raw_ms": out, "inline_state": rlcli_sqlite._state}))

with tempfile.TemporaryDirectory() as folder:
    asyncio.run(main(folder))
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300, help="requests per engine per round")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds (inline, stock / stock, inline)")
    parser.add_argument("--label", default="", help="added to the receipt's name")
    args = parser.parse_args()
    python = server_venv_dir() / "bin" / "python"
    load_before = os.getloadavg()
    proc = subprocess.run([str(python), "-c", MEASURE, str(commands.RUNTIME_DIR), str(args.reps), str(args.rounds)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the measurement failed in the server venv:\n{proc.stderr[-2000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    results = {name: {kind: {"p50": percentile(v, 50), "p95": percentile(v, 95), "n": len(v)}
                      for kind, v in kinds.items()} for name, kinds in found["raw_ms"].items()}
    body = {"label": args.label, "results_ms": results, "inline_state": found["inline_state"],
            "config": vars(args), "versions": {**versions(), "server": server_versions()},
            "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()}, "raw_ms": found["raw_ms"]}
    print(json.dumps({name: {k: round(v["p50"], 3) for k, v in kinds.items()} for name, kinds in results.items()}))
    name = "db-path" + (f"-{args.label}" if args.label else "")
    print(f"receipt: {write_receipt(name, body)}")


if __name__ == "__main__":
    main()
