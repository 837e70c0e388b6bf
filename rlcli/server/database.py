"""`serve start --database-url` (or RLCLI_DATABASE_URL): SkyRL's database, sqlite by default, or Postgres.

SkyRL keeps sessions, models, futures and checkpoints in one SQLAlchemy database and ships the Postgres
drivers (asyncpg for its API, psycopg2 for its engine). A team server wants Postgres: several servers'
state in one place, backups, no sqlite write lock. SkyRL puts the URL on its engine's command line, which
every local user can read, so a password in the URL is taken out of it and handed over as PGPASSWORD
(both drivers read it) in the server's environment, which only its owner can read. A plain
postgresql:// URL is given to SkyRL as postgresql+psycopg2:// (its engine's driver; its API swaps in
asyncpg for any postgresql URL).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rlcli.errors import UsageError

ENV = "RLCLI_DATABASE_URL"
SCHEMES = ("postgresql", "postgresql+asyncpg", "postgresql+psycopg2", "sqlite")


def resolve(database_url: str | None) -> tuple[str | None, dict[str, str]]:
    """(the URL for SkyRL's flags without its password, environment to add); (None, {}) keeps sqlite."""
    url = database_url or os.environ.get(ENV)
    if not url:
        return None, {}
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise UsageError(f"--database-url: {parts.scheme or url!r} is not a database SkyRL serves; give "
                         "postgresql://USER[:PASSWORD]@HOST:PORT/DB or sqlite:///FILE")
    if parts.scheme == "sqlite":
        return url, {}  # as given: urlunsplit would fold sqlite:////abs/path's empty host away
    if parts.scheme == "postgresql":  # SQLAlchemy's default driver for it (psycopg 3) is not in SkyRL's venv
        parts = parts._replace(scheme="postgresql+psycopg2")
    if parts.password is None:
        return urlunsplit(parts), {}
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}")), {"PGPASSWORD": parts.password}


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def check(url: str, venv: Path, timeout: float = 10.0) -> str | None:
    """Why the server venv cannot connect to this database, or None when it can (`rlcli doctor`)."""
    flags_url, env = resolve(url)
    code = ("import sys, sqlalchemy\n"
            "engine = sqlalchemy.create_engine(sys.argv[1])\n"
            "with engine.connect() as c: c.execute(sqlalchemy.text('select 1'))\n")
    try:
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", code, flags_url or url], capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **env})
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{type(e).__name__}: {e}"
    if proc.returncode == 0:
        return None
    last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return last[:300]
