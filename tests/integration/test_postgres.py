"""SkyRL's state in a real Postgres (`serve start --database-url`), with tenants: train, isolate, list.

The test starts its own Postgres (Debian's `postgresql` package: initdb into a temp folder, a loopback
port, password auth) and skips, saying why, where that package is not installed.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from rlcli.server.private import free_port, private_server
from tests.conftest import run_rlcli, shared_server_venv
from tests.integration.test_tenants import _alice_trains, call

pytestmark = pytest.mark.server


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="module")
def postgres():
    """postgresql://rlcli:PASSWORD@127.0.0.1:PORT/postgres, stopped and removed at the end."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("no Postgres server here: `apt-get install -y postgresql` (Debian) installs the one this uses")
    folder = Path(tempfile.mkdtemp(prefix="rlcli-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: run the cluster as Debian's postgres user
        try:
            pg = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the cluster as")
        os.chown(folder, pg.pw_uid, pg.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    password, port = secrets.token_hex(12), free_port()
    pwfile = folder / "pw"
    pwfile.write_text(password)
    if as_user:
        os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
    data = folder / "data"
    subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "rlcli", "--auth=scram-sha-256",
                    f"--pwfile={pwfile}"], check=True, capture_output=True, timeout=120)
    opts = f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={folder}"
    subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(folder / "log"),
                    "-w", "start"], check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql://rlcli:{password}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


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
