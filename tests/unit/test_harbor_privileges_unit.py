"""A task cannot ask for privileged mode, host mounts, devices, capabilities, host namespaces or the Docker socket
(rlcli/harbor/privileges.py), and rlcli's own container spec never sets them. No Docker here: the refusal comes
before any image or container (tests/integration/test_harbor_privileges.py runs the command against a daemon)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlcli.errors import UsageError
from rlcli.harbor import tasks
from rlcli.harbor.sandbox import run_options
from rlcli.harbor.tasks import Limits

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "harbor"
# What would give a container something of the host's, as docker SDK `containers.create` keywords.
ESCALATIONS = ("privileged", "volumes", "mounts", "devices", "device_requests", "device_cgroup_rules", "cap_add",
               "security_opt", "pid_mode", "ipc_mode", "userns_mode", "uts_mode", "cgroupns", "cgroup_parent",
               "volumes_from", "sysctls")
# (kind, task.toml [environment] lines, compose service lines): one of each kind is refused.
KINDS = {
    "privileged": ("privileged = true", "privileged: true"),
    "host mounts": ('volumes = ["/:/host"]', 'volumes: ["/etc:/host-etc:ro"]'),
    "host devices": ('devices = ["/dev/kvm"]', 'devices: ["/dev/fuse:/dev/fuse"]'),
    "added capabilities": ('cap_add = ["SYS_ADMIN"]', 'cap_add: ["NET_ADMIN"]'),
    "pid namespace": ('pid = "host"', 'pid: "host"'),
    "ipc namespace": ('ipc_mode = "host"', 'ipc: "host"'),
    "network namespace": ('network_mode = "host"', 'network_mode: "host"'),
    "Docker socket": ('env = { TOKEN = "not-to-repeat", DOCKER_HOST = "unix:///var/run/docker.sock" }',
                      'volumes: ["/var/run/docker.sock:/var/run/docker.sock"]'),
}


def task_with(tmp_path: Path, toml_line: str = "", compose: str = "") -> Path:
    folder = Path(shutil.copytree(FIXTURES / "hello-file", tmp_path / "task"))
    (folder / "steps" / "one").mkdir(parents=True)  # for a toml_line that declares [[steps]] name = "one"
    (folder / "steps" / "one" / "instruction.md").write_text("Write the file.")
    if toml_line:
        with (folder / "task.toml").open("a") as f:
            f.write(f"{toml_line}\n")  # the fixture's last table is [environment]
    if compose:
        service = f"services:\n  main:\n    build: .\n    {compose}\n"
        (folder / "environment" / "docker-compose.yaml").write_text(service)
    return folder


@pytest.mark.parametrize("kind", KINDS)
def test_task_toml_asking_for_a_privilege_is_refused_in_one_line(tmp_path, kind):
    with pytest.raises(UsageError) as e:
        tasks.load_task(task_with(tmp_path, toml_line=KINDS[kind][0]))
    message = str(e.value)
    assert "\n" not in message and "[environment]" in message and "remove it from the task" in message
    assert kind.split()[-1] in message and "not-to-repeat" not in message


@pytest.mark.parametrize("kind", KINDS)
def test_compose_file_asking_for_a_privilege_is_refused(tmp_path, kind):
    with pytest.raises(UsageError) as e:
        tasks.load_task(task_with(tmp_path, compose=KINDS[kind][1]))
    assert "docker-compose.yaml" in str(e.value) and "\n" not in str(e.value)


def test_a_privilege_asked_in_a_phase_or_step_is_refused(tmp_path):
    for table in ("[solution]", "[[steps]]\nname = \"one\"\n[steps.agent]"):
        folder = task_with(tmp_path / str(len(table)), toml_line=f"{table}\nprivileged = true")
        with pytest.raises(UsageError, match="privileged mode"):
            tasks.load_task(folder)


def test_harmless_values_and_compose_files_pass(tmp_path):
    """false, empty and private values ask for nothing; a compose file that asks for nothing is still ignored."""
    folder = task_with(tmp_path, toml_line='privileged = false\nvolumes = []\nipc_mode = "private"',
                       compose='environment: ["A=1"]')
    assert tasks.load_task(folder).name == "task"


def test_a_dataset_skips_a_privileged_task_and_runs_the_rest(tmp_path):
    shutil.copytree(FIXTURES / "sum-numbers", tmp_path / "sum-numbers")
    task_with(tmp_path, toml_line="privileged = true")
    found, skipped = tasks.find_tasks(tmp_path)
    assert [t.name for t in found] == ["sum-numbers"]
    assert len(skipped) == 1 and "privileged mode" in skipped[0][1]


@pytest.mark.parametrize("online", [False, True])
def test_rlcli_container_spec_gives_nothing_of_the_host(online):
    options = run_options(Limits(cpus=1, memory_mb=256, pids=64), 60, online=online, host_cpus=2)
    assert not set(ESCALATIONS) & set(options), set(ESCALATIONS) & set(options)
    assert options["network_mode"] == ("bridge" if online else "none")
    assert "docker.sock" not in repr(options)


@pytest.mark.parametrize("table", ["", "[solution]", "[[steps]]\nname = \"one\"\n[steps.verifier]"])
def test_a_task_cannot_copy_rlclis_key_into_its_container(tmp_path, monkeypatch, table):
    """The fixture's last table is [environment] (table ""); [verifier] env and a step's env alike."""
    monkeypatch.setenv("TINKER_API_KEY", "tml-not-for-tasks")
    line = f'{table}\nenv = {{ KEY = "${{TINKER_API_KEY}}" }}'
    with pytest.raises(UsageError, match=r"\$TINKER_API_KEY, rlcli's own secret") as e:
        tasks.load_task(task_with(tmp_path, toml_line=line))
    assert "tml-not-for-tasks" not in str(e.value)
