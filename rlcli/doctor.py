"""`rlcli doctor`: is this machine ready for rlcli, and is the server? One line per check, with the fix.

Launch:  rlcli doctor [--base-url http://host:8000] [--manifest]
         python scripts/doctor.py

ok / warn / fail per line; the exit code is 1 when any check fails (a warning does not fail). Each check
is cheap: no torch, jax or tinker import, a few subprocesses and HTTP calls; the whole run takes seconds.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlcli import config
from rlcli.errors import RlcliError
from rlcli.options import BASE_URL, Record, option
from rlcli.server.backend_config import map_count_warning, read_map_count
from rlcli.server.server_venv import installed_version

GB = 1024**3
HARBOR_IMAGE = "debian:bookworm"
TRAIN_MEMORY_FACTOR = 4  # weights + grads + Adam moments, roughly, for a full training step in memory


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<15} {self.detail}"


@dataclass
class Server:
    """What the server checks learn once and share."""

    url: str
    explicit: bool  # --base-url or TINKER_BASE_URL named it: unreachable is then a failure
    reachable: bool = False
    model: str | None = None


def check_client_python() -> Check:
    v = sys.version_info
    if v >= (3, 11):
        return Check("client-python", "ok", f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable}")
    return Check("client-python", "fail", f"Python {v.major}.{v.minor} is too old: rlcli needs 3.11 or newer")


def check_server_python() -> Check:
    from rlcli.server import server_venv

    try:
        return Check("server-python", "ok", f"Python 3.12 for the server venv: {server_venv.find_python()}")
    except RlcliError as e:
        venv_python = config.server_venv_dir() / "bin" / "python"
        if venv_python.exists():
            return Check("server-python", "warn", f"the server venv has one, but a rebuild would not: {e}")
        return Check("server-python", "fail", str(e))


def compare_pins(client: str | None, server: str | None) -> tuple[str, str]:
    """The client's tinker against the SDKs rlcli's server answers (manifest.SERVED_SDKS), whatever tinker the
    server venv holds for SkyRL's types (docs/decisions.md, "The server answers tinker 0.25 to 0.38")."""
    from rlcli.server.runtime import manifest

    if client is None:
        return "fail", "tinker is not installed in this venv: `make venv` (or pip install polygramme-rlcli)"
    if server is None:
        return "warn", f"client tinker {client}; no server venv to compare with (`rlcli serve install`)"
    served = f"the server answers tinker {manifest.SERVED_SDKS}"
    if manifest.satisfies(client, manifest.SERVED_SDKS):
        return "ok", f"client tinker {client}, server venv {server}: {served}"
    return "fail", (f"client tinker {client}: {served}; "
                    f"`pip install 'tinker{manifest.PINS['tinker']}'` here (env/client.lock pins it)")


def check_tinker_pins() -> Check:
    from importlib import metadata

    try:
        client: str | None = metadata.version("tinker")
    except metadata.PackageNotFoundError:
        client = None
    lib = config.server_venv_dir() / "lib"
    server = next((v for sp in sorted(lib.glob("python3*/site-packages")) if (v := installed_version(sp, "tinker"))),
                  None)
    return Check("tinker-pins", *compare_pins(client, server))


def check_manifest() -> Check:
    """The server venv's SkyRL and jax against the versions rlcli's changes to them are written for."""
    from rlcli.server.runtime import manifest

    lib = config.server_venv_dir() / "lib"
    site = next(iter(sorted(lib.glob("python3*/site-packages"))), None)
    found = {package: installed_version(site, package) if site else None for package in manifest.SERVER_PINS}
    if not any(found.values()):
        return Check("manifest", "warn", "no server venv to compare with (`rlcli serve install`)")
    drift = [f"{p} {v or 'missing'} (rlcli expects {p}{manifest.PINS[p]})" for p, v in found.items()
             if v is None or not manifest.satisfies(v, manifest.PINS[p])]
    if drift:
        return Check("manifest", "fail", f"the server venv has {'; '.join(drift)}: rlcli's server would refuse to "
                     "start; `rlcli serve install` rebuilds it from the pins")
    return Check("manifest", "ok", f"{', '.join(f'{p} {v}' for p, v in found.items())} as pinned; rlcli overrides "
                 f"{len(manifest.overridden())} names in them and the client's (`rlcli doctor --manifest`)")


def manifest_lines() -> list[str]:
    """rlcli's manifest (rlcli/server/runtime/manifest.py) as `rlcli doctor --manifest` prints it."""
    from rlcli.server.runtime import manifest

    out = [f"rlcli overrides {len(manifest.overridden())} names in SkyRL, jax, tinker and tinker-cookbook "
           f"({', '.join(f'{p}{s}' for p, s in manifest.PINS.items())}):"]
    for e in manifest.ENTRIES:
        checked = " ".join(str(part) for part in e.check) or "resolves"
        out.append(f"{e.kind:<18} {e.target}\n    for: {e.why}\n    checked: {checked} ({e.where})"
                   + (f"\n    goes: {e.goes}" if e.goes else ""))
    return out


def check_server_venv() -> Check:
    from rlcli.server import process, server_venv

    venv = config.server_venv_dir()
    state = process.read_state(config.server_state_dir())
    backend = state.backend if state else "jax"
    if server_venv.is_complete(venv, backend):
        if not server_venv.has_bytecode(venv):
            return Check("server-venv", "warn", f"{venv} matches {server_venv.pins_file(backend).name} but has no "
                         "bytecode, so every server process compiles its imports: `rlcli serve install` writes it")
        if not server_venv.has_top_level_names(venv):
            return Check("server-venv", "warn", f"{venv} matches {server_venv.pins_file(backend).name} but its "
                         "packages do not declare their import names, so each engine start lists every installed "
                         "file (~1 s): `rlcli serve install` writes them")
        return Check("server-venv", "ok", f"{venv} matches {server_venv.pins_file(backend).name}")
    what = "is missing" if not (venv / "bin" / "python").exists() else "is incomplete or from older pins"
    return Check("server-venv", "warn", f"{venv} {what}: `rlcli serve install --backend {backend}` builds it "
                 "(~7 min; `serve start` does it too)")


def check_processes() -> Check:
    from rlcli.server import scaling

    lib = config.server_venv_dir() / "lib"
    site = next(iter(sorted(lib.glob("python3*/site-packages"))), None)
    return Check("processes", *scaling.doctor_check(site))


def _get_json(url: str, timeout: float = 3.0) -> dict:
    from rlcli.client import request_json

    return request_json(url, timeout=timeout)


def check_server(srv: Server) -> Check:
    from rlcli.server import commands, process

    managed = config.managed_server_url()
    word = commands.server_status()[0] if managed == srv.url else None
    srv.reachable = process.healthz(srv.url)
    if srv.reachable:
        try:
            srv.model = _get_json(f"{srv.url}/api/v1/get_server_capabilities")["supported_models"][0]["model_name"]
        except (OSError, ValueError, KeyError, IndexError):
            pass
        if word == "starting":
            return Check("server", "warn", f"{srv.url} answers but its engine is still starting; wait a minute")
        return Check("server", "ok", f"{srv.url} ready" + (f", model {srv.model}" if srv.model else ""))
    if word in ("dead", "unresponsive"):
        return Check("server", "fail", f"the managed server at {srv.url} is {word}: `rlcli serve logs`, then "
                     "`rlcli serve restart`")
    if srv.explicit:
        return Check("server", "fail", f"nothing answers at {srv.url}: check the URL, or start a server there")
    return Check("server", "warn", f"no server running at {srv.url}: `rlcli serve start`")


def check_api_key(srv: Server) -> Check:
    """Does the server take this key (TINKER_API_KEY or --api-key)? Only a server with --tenants checks one."""
    import urllib.error

    key = os.environ.get("TINKER_API_KEY")
    if not srv.reachable:
        return Check("api-key", "warn", "no server to check the key against")
    try:
        _get_json(f"{srv.url}/api/v1/training_runs?limit=1")
    except urllib.error.HTTPError as e:
        if e.code == 401:
            from rlcli.client import key_refused

            return Check("api-key", "fail", key_refused(srv.url))
        return Check("api-key", "warn", f"could not check the key: HTTP {e.code}")
    except (OSError, ValueError) as e:
        return Check("api-key", "warn", f"could not check the key: {e}")
    return Check("api-key", "ok", "the server accepts this key" if key else "the server checks no keys")


def check_database() -> Check:
    """Can the server venv reach the database `serve start` uses (RLCLI_DATABASE_URL or the recorded one)?"""
    from rlcli.server import database, process

    state = process.read_state(config.server_state_dir())
    url = os.environ.get(database.ENV) or (state.settings.get("database_url") if state else None)
    if not url:
        return Check("database", "ok", "sqlite in the server's folder (the embedded default)")
    venv = config.server_venv_dir()
    if not (venv / "bin" / "python").exists():
        return Check("database", "warn", f"{database.redacted(url)}: no server venv to check it with")
    why = database.check(url, venv, state_dir=config.server_state_dir())
    if why:
        return Check("database", "fail", f"cannot connect to {database.redacted(url)}: {why}")
    return Check("database", "ok", f"{database.redacted(url)} answers")


def check_backend(srv: Server) -> Check:
    if not srv.reachable:
        return Check("backend", "warn", "skipped: the server is not reachable")
    from rlcli.train.losses import served_losses

    description, losses = served_losses(srv.url, timeout=5.0)
    return Check("backend", "ok", f"{description}; losses: {', '.join(sorted(losses))}")


def check_cuda() -> Check:
    from rlcli.server.backend_config import has_cuda

    if has_cuda():
        return Check("cuda", "ok", "NVIDIA driver present (fsdp/megatron backends can run)")
    return Check("cuda", "warn", "no NVIDIA GPU: the jax backend runs on CPU; fsdp and megatron need CUDA")


def check_docker() -> Check:
    try:
        import docker
        from docker.errors import DockerException, ImageNotFound
    except ImportError:
        return Check("docker", "warn", "the docker SDK is missing: `pip install docker` (harbor sandboxes need it)")
    try:
        client = docker.from_env(timeout=3)
        client.ping()
    except DockerException:
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        return Check("docker", "warn", f"no Docker daemon answers at {where}: harbor tasks need one; "
                     "`sudo scripts/docker_up.sh` (`make docker`) starts one")
    try:
        client.images.get(HARBOR_IMAGE)
    except ImageNotFound:
        return Check("docker", "warn", f"daemon up, no {HARBOR_IMAGE} image (harbor's base): "
                     f"`sudo scripts/base_image.sh` (`make base-image`) builds it offline, or `docker pull`")
    return Check("docker", "ok", f"daemon up, {HARBOR_IMAGE} present")


def disk_status(free_bytes: int) -> str:
    return "fail" if free_bytes < 2 * GB else "warn" if free_bytes < 10 * GB else "ok"


def check_disk() -> Check:
    home = config.rlcli_home()
    probe = next(p for p in (home, *home.parents) if p.exists())
    free = shutil.disk_usage(probe).free
    status = disk_status(free)
    fix = "" if status == "ok" else ": venvs need ~7 GB and checkpoints grow; free space or set RLCLI_HOME elsewhere"
    return Check("disk", status, f"{free / GB:.1f} GB free for {home}{fix}")


def check_map_count() -> Check:
    limit = read_map_count()
    warning = map_count_warning(limit)
    if warning:
        return Check("map-count", "warn", warning)
    return Check("map-count", "ok", "no such limit here" if limit is None else f"vm.max_map_count is {limit}")


def mem_available(meminfo: str) -> int | None:
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def weights_bytes(model: str) -> int | None:
    """Size of a model's weight files: a local folder, or a hub id already in the HF cache."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
        snapshots = sorted((hub.expanduser() / f"models--{model.replace('/', '--')}" / "snapshots").glob("*"))
        if not snapshots:
            return None
        folder = snapshots[-1]
    files = [*folder.glob("*.safetensors"), *folder.glob("*.bin")]
    return sum(f.stat().st_size for f in files) or None


def _size(n: int) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 2**20:.0f} MB"


def memory_check(available: int | None, weights: int | None, model: str | None) -> Check:
    if available is None:
        return Check("memory", "warn", "cannot read MemAvailable from /proc/meminfo")
    have = f"{_size(available)} available"
    if not weights:
        return Check("memory", "ok", have + (f"; size of {model} unknown (not on this machine)" if model else ""))
    need = weights * TRAIN_MEMORY_FACTOR
    detail = f"{have}, training {model} needs ~{_size(need)} ({_size(weights)} of weights x{TRAIN_MEMORY_FACTOR})"
    if available < weights:
        return Check("memory", "fail", detail + ": not even the weights fit; use a smaller model or a bigger machine")
    if available < need:
        return Check("memory", "warn", detail + ": expect swapping or OOM; use a smaller model or fewer LoRA slots")
    return Check("memory", "ok", detail)


def check_memory(srv: Server) -> Check:
    try:
        available = mem_available(Path("/proc/meminfo").read_text())
    except OSError:
        available = None
    model = srv.model
    if model is None:
        from rlcli.model import embedded_model_dir

        model = str(embedded_model_dir()) if embedded_model_dir().exists() else None
    return memory_check(available, weights_bytes(model) if model else None, model)


def run_checks(srv: Server) -> list[Check]:
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("client-python", check_client_python),
        ("server-python", check_server_python),
        ("tinker-pins", check_tinker_pins),
        ("server-venv", check_server_venv),
        ("manifest", check_manifest),
        ("server", lambda: check_server(srv)),
        ("api-key", lambda: check_api_key(srv)),
        ("database", check_database),
        ("backend", lambda: check_backend(srv)),
        ("cuda", check_cuda),
        ("processes", check_processes),
        ("docker", check_docker),
        ("disk", check_disk),
        ("memory", lambda: check_memory(srv)),
        ("map-count", check_map_count),
    ]
    checks = []
    for name, step in steps:
        try:
            check = step()
        except Exception as e:  # a broken check is reported as one, never ends the run
            check = Check(name, "fail", f"the check itself failed: {type(e).__name__}: {e}")
        print(check.line(), flush=True)
        checks.append(check)
    return checks


@dataclass(frozen=True, kw_only=True)
class DoctorOptions(Record):
    """`rlcli doctor`'s options (--api-key, as for every command, goes to TINKER_API_KEY first: rlcli.cli)."""

    base_url: str | None = BASE_URL(None)
    manifest: bool = option(False, "print every name rlcli overrides or relies on in SkyRL, jax, tinker and "
                                   "tinker-cookbook (what for, how it is checked, when it can go), then stop")


def doctor(o: DoctorOptions) -> int:
    """Check this machine and the server: Pythons, pins, venv, manifest, server, backend, CUDA, processes, Docker,
    disk, memory, map count."""
    if o.manifest:
        print("\n".join(manifest_lines()))
        return 0
    explicit = bool(o.base_url or os.environ.get("TINKER_BASE_URL"))
    checks = run_checks(Server(config.resolve_base_url(o.base_url), explicit))
    failed = [c.name for c in checks if c.status == "fail"]
    warned = sum(c.status == "warn" for c in checks)
    print(f"doctor: {len(checks) - len(failed) - warned} ok, {warned} warn, {len(failed)} fail"
          + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0
