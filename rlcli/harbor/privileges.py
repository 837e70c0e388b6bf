"""What a task may never ask for: privileged mode, host mounts, devices, added capabilities, the host's pid, ipc
or network namespace, or the Docker socket. Each would hand the task's code the machine that runs rlcli. Nor may
its env tables copy rlcli's own secrets into the container (taskconfig.resolve_env refuses RLCLI_SECRETS).

rlcli's own container spec sets none of them (sandbox.run_options); this refuses a task that declares one,
in task.toml or in a docker-compose file beside its Dockerfile (rlcli never applies compose, but a task that
asks there expects to get it), before any image is built or container started. One line says what and how
to go on. Pure file reading, no Docker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlcli.errors import UsageError

# task.toml or compose key -> what it would give the task. Any value but an empty or false one is refused.
KEYS = {
    "privileged": "privileged mode",
    "volumes": "host mounts", "mounts": "host mounts", "binds": "host mounts",
    "devices": "host devices", "device_cgroup_rules": "host devices",
    "cap_add": "added capabilities", "capabilities": "added capabilities",
    "security_opt": "security options (seccomp/AppArmor off)",
    "pid": "the host's pid namespace", "pid_mode": "the host's pid namespace",
    "ipc": "the host's ipc namespace", "ipc_mode": "the host's ipc namespace",
    "userns_mode": "the host's user namespace", "uts": "the host's uts namespace",
    "cgroup_parent": "a host cgroup", "cgroupns": "the host's cgroup namespace",
}
# network_mode has task-level meanings (public, no-network, allowlist); these values share the host's or another
# container's network namespace instead.
HOST_NETWORK = ("host",)
SOCKET = "docker.sock"
# rlcli's own secrets: a task's env table cannot copy them into its container ("${TINKER_API_KEY}").
RLCLI_SECRETS = ("TINKER_API_KEY", "RLCLI_DATABASE_URL", "PGPASSWORD")
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")
WHAT_TO_DO = ("rlcli runs every task in an unprivileged container with no host mounts, devices or Docker socket: "
              "remove it from the task")


def _refuse(where: str, what: str, key: str, value: Any) -> None:
    raise UsageError(f"{where}: {key} = {value!r} asks for {what}, which a task cannot have; {WHAT_TO_DO}")


def check_table(table: dict[str, Any], where: str) -> None:
    """Refuse a table (task.toml's [environment], a compose service) that asks for a privilege."""
    for key, value in table.items():
        if key in KEYS and value not in (None, False, "", [], {}, "private", "none"):
            _refuse(where, KEYS[key], key, value)
        network = str(value).lower() if key in ("network_mode", "network") and isinstance(value, str) else ""
        if network in HOST_NETWORK or network.startswith(("container:", "service:")):
            _refuse(where, "another network namespace than the task's own", key, value)
        if SOCKET in repr(value):  # in a table (env), name only the entry that holds it: the rest may be secrets
            inner = [k for k, v in value.items() if SOCKET in repr(v)] if isinstance(value, dict) else []
            _refuse(where, "the Docker socket", f"{key}.{inner[0]}" if inner else key,
                    value[inner[0]] if inner else value)


def _tables(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """task.toml's tables where a container setting could be declared: the environment and each phase's."""
    found = [(name, doc[name]) for name in ("environment", "agent", "verifier", "solution")
             if isinstance(doc.get(name), dict)]
    for n, step in enumerate(doc.get("steps") or []):
        if isinstance(step, dict):
            found += [(f"[[steps]] #{n + 1} {name}", step[name]) for name in ("agent", "verifier")
                      if isinstance(step.get(name), dict)]
    return found


def check_task_toml(doc: dict[str, Any], where: str) -> None:
    for name, table in _tables(doc):
        check_table(table, f"{where} [{name}]")


def check_compose(folder: Path) -> None:
    """Refuse a compose file in environment/ whose services ask for a privilege (or mention the socket)."""
    for name in COMPOSE_FILES:
        path = folder / "environment" / name
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if SOCKET in text:
            raise UsageError(f"{path} mentions {SOCKET}: it asks for the Docker socket, which a task cannot have; "
                             f"{WHAT_TO_DO}")
        import yaml

        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise UsageError(f"{path} is not valid YAML ({str(e).splitlines()[0]}): fix or remove it") from None
        services = doc.get("services") if isinstance(doc, dict) else None
        for service, spec in (services or {}).items() if isinstance(services, dict) else ():
            if isinstance(spec, dict):
                check_table(spec, f"{path} service {service}")


def check_task(folder: Path, doc: dict[str, Any], where: str) -> None:
    """Refuse the task folder if task.toml or its compose file asks for privileged mode, host mounts, devices,
    capabilities, host namespaces or the Docker socket."""
    check_task_toml(doc, where)
    check_compose(folder)
