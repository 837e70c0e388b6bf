"""`serve start --database-url` (or RLCLI_DATABASE_URL): SkyRL's database, sqlite by default, or Postgres.

SkyRL keeps sessions, models, futures and checkpoints in one SQLAlchemy database and ships the Postgres
drivers (asyncpg for its API, psycopg2 for its engine). A team server wants Postgres: several servers'
state in one place, backups, no sqlite write lock. SkyRL puts the URL on its engine's command line, which
every local user can read, so a password in the URL is taken out of it and handed over as PGPASSWORD
(both drivers read it) in the server's environment, which only its owner can read. For `serve restart` the
password is kept in one file, libpq's password file in the server's folder (0600, handed over as PGPASSFILE,
which both drivers read too), never in the recorded settings, a log or `serve status`. A plain
postgresql:// URL is given to SkyRL as postgresql+psycopg2:// (its engine's driver; its API swaps in
asyncpg for any postgresql URL).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from rlcli.errors import UsageError

ENV = "RLCLI_DATABASE_URL"
SCHEMES = ("postgresql", "postgresql+asyncpg", "postgresql+psycopg2", "sqlite")
PASSFILE = "pgpass"  # in the server's folder: the one place a --database-url password is kept


def keep_password(database_url: str | None, state_dir: Path) -> str | None:
    """--database-url as `serve start` records it: a password is moved out of it into the server's password
    file (libpq's format: host:port:db:user:password, ':' and '\\' escaped), read again by resolve."""
    parts = urlsplit(database_url or "")
    if not database_url or parts.password is None or not parts.scheme.startswith("postgresql"):
        return database_url
    from rlcli.files import staged_file

    fields = [parts.hostname or "localhost", str(parts.port or 5432), unquote(parts.path.lstrip("/")) or "*",
              unquote(parts.username or "") or "*", unquote(parts.password)]
    line = ":".join(f.replace("\\", "\\\\").replace(":", "\\:") for f in fields) + "\n"
    with staged_file(state_dir / PASSFILE, shared=False) as f:  # mkstemp: 0600, which libpq requires
        f.write(line.encode())
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}@{host}" if parts.username else host))


def resolve(database_url: str | None, state_dir: Path | None = None) -> tuple[str | None, dict[str, str]]:
    """(the URL for SkyRL's flags without its password, environment to add); (None, {}) keeps sqlite. A URL
    without a password uses the password file keep_password left in state_dir, if any."""
    url = database_url or os.environ.get(ENV)
    if not url:
        return None, {}
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise UsageError(f"--database-url: {parts.scheme or redacted(url)!r} is not a database SkyRL serves; give "
                         "postgresql://USER[:PASSWORD]@HOST:PORT/DB or sqlite:///FILE")
    if parts.scheme == "sqlite":
        return url, {}  # as given: urlunsplit would fold sqlite:////abs/path's empty host away
    if parts.scheme == "postgresql":  # SQLAlchemy's default driver for it (psycopg 3) is not in SkyRL's venv
        parts = parts._replace(scheme="postgresql+psycopg2")
    if parts.password is None:
        passfile = state_dir / PASSFILE if state_dir else None
        return urlunsplit(parts), {"PGPASSFILE": str(passfile)} if passfile and passfile.is_file() else {}
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}")), {"PGPASSWORD": parts.password}


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))


def check(url: str, venv: Path, timeout: float = 10.0, state_dir: Path | None = None) -> str | None:
    """Why the server venv cannot connect to this database, or None when it can (`rlcli doctor`)."""
    flags_url, env = resolve(url, state_dir)
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
