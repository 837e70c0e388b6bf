"""SkyRL's state in a real Postgres (`serve start --database-url`), with tenants: train, isolate, list.

The Postgres is the tests' own (tests/integration/conftest.py: Debian's `postgresql` package, a temp
folder, a loopback port, password auth); skipped, saying why, where that package is not installed.
test_tenants.py runs its keys, isolation, listing, quota and revoke tests on Postgres too.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rlcli.server.private import private_server
from tests.conftest import run_rlcli, shared_server_venv
from tests.integration.test_tenants import _alice_trains, call

pytestmark = pytest.mark.server


def test_tenants_on_postgres(postgres, tmp_path_factory, embedded_model, monkeypatch):
    home = tmp_path_factory.mktemp("rlcli-pg-home")
    env = dict(os.environ, RLCLI_HOME=str(home))
    keys = {name: run_rlcli("tenant", "add", name, env=env, check=True, timeout=60).stdout.strip()
            for name in ("alice", "bob")}
    with private_server(embedded_model, "--tenants", "--slots", "2", "--database-url", postgres, home=home,
                        venv=shared_server_venv(), timeout=900) as srv:
        password = postgres.split(":")[2].split("@")[0]
        cmdlines = [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in os.listdir("/proc") if pid.isdigit()
                    and Path(f"/proc/{pid}/cmdline").exists()]
        assert not any(password.encode() in c for c in cmdlines), "the database password is on a command line"
        assert not (srv.home / "servers" / "default" / "tinker.db").exists()  # sqlite unused
        client, path = _alice_trains(srv, keys["alice"], monkeypatch)
        api = srv.url + "/api/v1"
        assert call(f"{api}/get_info", "POST", {"model_id": client.model_id}, key=keys["bob"])[0] == 404
        assert call(f"{api}/training_runs", key=keys["bob"])[1]["training_runs"] == []
        runs = call(f"{api}/training_runs", key=keys["alice"])[1]["training_runs"]
        assert [r["training_run_id"] for r in runs] == [client.model_id]
        doctor = run_rlcli("doctor", env=dict(srv.env, TINKER_API_KEY=keys["alice"]), timeout=120)
        assert "ok    database" in doctor.stdout and password not in doctor.stdout, doctor.stdout
    # the runs are in Postgres: a fresh connection from the server venv finds the model
    code = ("import sys, sqlalchemy; e = sqlalchemy.create_engine(sys.argv[1]); c = e.connect(); "
            "print(c.execute(sqlalchemy.text('select model_id from models')).fetchall())")
    rows = subprocess.run([str(shared_server_venv() / "bin" / "python"), "-c", code, postgres.replace("postgresql://", "postgresql+psycopg2://")],
                          capture_output=True, text=True, timeout=60)
    assert client.model_id in rows.stdout, rows.stdout + rows.stderr
