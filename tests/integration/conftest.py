"""Fixtures for the integration tests that need more than the session server: a private Postgres, Docker.

The cluster is Debian's `postgresql` package: initdb into a temp folder, a loopback port, password auth,
started once per test session; each module that asks for `postgres` gets a fresh database of its own (two
SkyRL servers must never share one). Skipped, saying why, where that package is not installed.
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

from rlcli.server.private import free_port


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@pytest.fixture(scope="session")
def postgres_cluster():
    """(bin folder, password, port) of a running cluster with user rlcli; stopped and removed at the end."""
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
        yield bindir, password, port
    finally:
        subprocess.run([*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres(postgres_cluster):
    """postgresql://rlcli:PASSWORD@127.0.0.1:PORT/DB, a database of this module's own in the session's cluster."""
    bindir, password, port = postgres_cluster
    name = "rlcli_" + secrets.token_hex(4)
    subprocess.run([str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "rlcli", name],
                   env=dict(os.environ, PGPASSWORD=password), check=True, capture_output=True, timeout=60)
    return f"postgresql://rlcli:{password}@127.0.0.1:{port}/{name}"


@pytest.fixture(scope="session")
def docker_client():
    """A client of the local Docker daemon that has the offline base image; skips with the reason otherwise."""
    from rlcli.errors import RlcliError
    from rlcli.harbor import sandbox

    try:
        client = sandbox.connect()
    except RlcliError as e:
        pytest.skip(f"no Docker daemon: {e}")
    if not client.images.list(name="debian:bookworm-slim"):
        pytest.skip("no debian:bookworm-slim image: build it offline with `scripts/base_image.sh` (make base-image)")
    return client
