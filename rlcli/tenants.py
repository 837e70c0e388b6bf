"""`rlcli tenant add|list|revoke`: the API keys of a server a team shares.

    rlcli tenant add alice --max-models 2     # prints alice's key once: tml-...
    rlcli serve start --tenants               # the server then answers only requests with a valid key
    TINKER_API_KEY=tml-... rlcli train sl ... # stock tinker clients send it as X-API-Key

Keys live in RLCLI_HOME/tenants.json (mode 0600) as SHA-256 hashes only: a key is 32 random bytes, so a
fast hash is as safe as a slow one, and the server checks a request in microseconds. The server
(runtime/rlcli_tenants.py) rereads the file when it changes, so `tenant revoke` takes effect on the next
request without a restart.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rlcli import config
from rlcli.errors import UsageError
from rlcli.files import staged_file
from rlcli.options import Opt, Record, option
from rlcli.server import process
from rlcli.server.runtime.shared import OWNERS_FILE, TENANTS_FILE_ENV, TENANTS_INTERNAL_ENV

KEY_PREFIX = "tml-"  # the tinker client refuses keys without it
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
FILE_ENV, INTERNAL_ENV = TENANTS_FILE_ENV, TENANTS_INTERNAL_ENV  # the tenant gate reads these (runtime/shared.py)


def tenants_file() -> Path:
    return config.rlcli_home() / "tenants.json"


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def load() -> dict[str, dict]:
    try:
        return json.loads(tenants_file().read_text())["tenants"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError) as e:
        raise UsageError(f"{tenants_file()} is unreadable ({e}); fix or remove it and add the tenants again") from None


def _save(tenants: dict[str, dict]) -> None:
    config.private_dir(config.rlcli_home())
    with staged_file(tenants_file(), shared=False) as f:  # mkstemp: 0600, replaced in one rename
        f.write(json.dumps({"tenants": tenants}, indent=1, sort_keys=True).encode())


TENANT = Opt("the tenant's name: lower-case letters, digits, - and _, starting with a letter or digit")
SERVER = Opt("which managed server (its sqlite database and owners record; a Postgres one is not read here)")


@dataclass(frozen=True, kw_only=True)
class AddOptions(Record):
    name: str = TENANT(positional=True)
    max_models: int | None = option(None, "LoRA models the tenant may hold at once on the server (default: no limit)",
                                    low=1)
    max_queued: int | None = option(None, "requests the tenant may have waiting in the engine's queue (default: no "
                                          "limit)", low=1)


@dataclass(frozen=True, kw_only=True)
class Tenant(Record):
    name: str = TENANT(positional=True)


@dataclass(frozen=True, kw_only=True)
class ListOptions(Record):
    name: str = process.NAME("default")


@dataclass(frozen=True, kw_only=True)
class OrphansOptions(Record):
    server: str = SERVER("default")


@dataclass(frozen=True, kw_only=True)
class ClaimOptions(OrphansOptions):
    name: str = TENANT(positional=True)
    runs: str = option(help="run (model) ids, comma-separated, as `rlcli tenant orphans` lists them", positional=True)


def add(o: AddOptions) -> int:
    """Add a tenant and print its new API key once (only its hash is kept)."""
    name, max_models, max_queued = o.name, o.max_models, o.max_queued
    if not NAME_RE.match(name):
        raise UsageError(f"tenant name {name!r}: use 1-32 lower-case letters, digits, - or _, starting with a "
                         "letter or digit")
    tenants = load()
    if name in tenants:
        raise UsageError(f"tenant {name!r} exists already: `rlcli tenant revoke {name}` first to give it a new key")
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    tenants[name] = {"key_sha256": key_hash(key), "max_models": max_models, "max_queued": max_queued,
                     "created": int(time.time())}
    _save(tenants)
    print(f"rlcli: tenant {name!r} added; its key is printed once, below (give it as TINKER_API_KEY or "
          "--api-key; a lost key is replaced by revoke and add)", file=sys.stderr)
    print(key)
    return 0




def models_held(server: str = "default") -> dict[str, int]:
    """Models each tenant created and did not unload, as the server's owners record says."""
    held: dict[str, set[str]] = {}
    try:
        lines = (config.server_state_dir(server) / OWNERS_FILE).read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        try:
            kind, ident, tenant = json.loads(line)
        except ValueError:
            continue
        if kind == "model":
            held.setdefault(tenant, set()).add(ident)
        elif kind == "unload":
            held.get(tenant, set()).discard(ident)
    return {tenant: len(ids) for tenant, ids in held.items()}


def list_(o: ListOptions) -> int:
    """List the tenants: name, quotas, models held on the server, when added (never keys)."""
    name = o.name
    tenants = load()
    if not tenants:
        print(f"no tenants in {tenants_file()}: `rlcli tenant add NAME`", file=sys.stderr)
        return 0
    held = models_held(name)
    print(f"{'name':<20} {'max-models':>10} {'max-queued':>10} {'models':>7}  added")
    for tenant, t in sorted(tenants.items()):
        added = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t.get("created", 0)))
        print(f"{tenant:<20} {t.get('max_models') or '-':>10} {t.get('max_queued') or '-':>10} "
              f"{held.get(tenant, 0):>7}  {added} UTC")
    return 0


def revoke(o: Tenant) -> int:
    """Remove a tenant: its key is refused from the server's next request on."""
    name = o.name
    tenants = load()
    if str(name) not in tenants:
        raise UsageError(f"no tenant {name!r} (`rlcli tenant list` shows them)")
    del tenants[str(name)]
    _save(tenants)
    print(f"rlcli: tenant {name!r} revoked; running servers refuse its key from the next request",
          file=sys.stderr)
    return 0


def _owners_path(server: str) -> Path:
    return config.server_state_dir(server) / OWNERS_FILE


def _owned(server: str) -> dict[str, str]:
    """run (model) id -> its tenant, as the server's owners record says."""
    owned = {}
    with contextlib.suppress(OSError):
        for line in _owners_path(server).read_text().splitlines():
            with contextlib.suppress(ValueError):
                kind, ident, tenant = json.loads(line)
                if kind == "model":
                    owned[ident] = tenant
    return owned


def orphans(o: OrphansOptions) -> int:
    """List the runs nobody owns: created before `serve start --tenants` was on, so no tenant can see them."""
    server = o.server
    database = config.server_state_dir(server) / "tinker.db"
    if not database.exists():
        raise UsageError(f"no sqlite database at {database}: a server with --database-url keeps its runs in "
                         "Postgres; list them there (`select model_id from models`) and `rlcli tenant claim` them")
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        runs = [row[0] for row in db.execute("select model_id from models order by created_at")]
    owned = _owned(server)
    for run in runs:
        if run not in owned:
            print(run)
    return 0


def claim(o: ClaimOptions) -> int:
    """Give runs nobody owns (made before --tenants was on) to a tenant: its key then reaches them and their
    checkpoints. Only while the server is stopped (a running one keeps who owns what in memory)."""
    name, server = o.name, o.server
    if str(name) not in load():
        raise UsageError(f"no tenant {name!r} (`rlcli tenant list` shows them)")
    runs = [run.strip() for run in o.runs.split(",") if run.strip()]
    if not runs:
        raise UsageError("name the runs to claim (`rlcli tenant orphans` lists the runs nobody owns)")
    state = process.read_state(config.server_state_dir(server))
    if state is not None and process.live_members(state):
        raise UsageError("the server is running and keeps who owns what in memory: `rlcli serve stop`, claim, "
                         "then start it again")
    owned = _owned(server)
    taken = [f"{run} ({owned[run]})" for run in runs if run in owned]
    if taken:
        raise UsageError(f"already owned: {', '.join(taken)}; a run changes hands only from nobody")
    path = _owners_path(server)
    config.private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.writelines(json.dumps(["model", run, str(name)]) + "\n" for run in runs)
    print(f"rlcli: {len(runs)} run(s) now belong to {name!r}", file=sys.stderr)
    return 0


def check_exposure(host: str, tenants: bool, insecure: bool, loopback: bool) -> None:
    """A server reachable from the network must check keys, or be started with --insecure on purpose."""
    if loopback or tenants or insecure:
        return
    raise UsageError(f"--host {host} exposes the server to the network and SkyRL checks no credentials: anyone "
                     "who can reach the port could train on, read and delete every model. Add --tenants (and "
                     "`rlcli tenant add NAME`), or --insecure if the network itself is trusted")


def server_env() -> tuple[dict[str, str], str]:
    """The server's environment for --tenants, and the key this start proves readiness with."""
    if not load():
        raise UsageError("--tenants: no tenants yet, so nobody could use the server; add one first "
                         "(`rlcli tenant add NAME`)")
    internal = KEY_PREFIX + secrets.token_urlsafe(32)
    return {FILE_ENV: str(tenants_file()), INTERNAL_ENV: key_hash(internal)}, internal


def api_key(explicit: str | None = None) -> str | None:
    """--api-key, else TINKER_API_KEY; put where the tinker client and rlcli's own requests read it."""
    if explicit:
        if not explicit.startswith(KEY_PREFIX):
            raise UsageError(f"--api-key: a key starts with {KEY_PREFIX!r} (`rlcli tenant add NAME` prints one)")
        os.environ["TINKER_API_KEY"] = explicit
    return os.environ.get("TINKER_API_KEY")
