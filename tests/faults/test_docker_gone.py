"""The Docker daemon dies during `rlcli harbor run` or `rlcli train harbor`: the rollout in flight fails with the
reason, the run stops with one line within a bounded time (or goes on when the daemon is back within
--docker-timeout), and no rlcli container is left once the daemon is back; a stopped training run resumes.

The daemon killed is a private one this test starts (its own data root, exec root, socket, pid file and
bridge, no iptables), never the machine's (nor its docker0): rlcli is pointed at it through DOCKER_HOST.
The base image is copied into it from the machine's daemon (`docker save | docker load`, read-only there).
Skipped with the reason where a private dockerd cannot be started (not root, no dockerd, no base image).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rlcli.harbor.images import LABEL
from rlcli.harbor.sandbox import OWNER
from tests.faults.conftest import trainer, wait_for
from tests.faults.test_server_dies import last_line, record

pytestmark = [pytest.mark.docker, pytest.mark.faults, pytest.mark.timeout(600)]

IMAGE = "debian:bookworm-slim"
# Documentation ranges (routed nowhere); the first one this machine uses in no address and no route.
BRIDGE_NETS = ("198.51.100", "203.0.113", "192.0.2")


def free_bridge_address() -> str | None:
    used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    return next((f"{net}.1/24" for net in BRIDGE_NETS if f"{net}." not in used), None)
TIMEOUT_S = 3  # --docker-timeout when the daemon stays away
NOTICE_BOUND_S = 60  # generous: the broken stream, one ping, the wait, unwinding, on a loaded 2-core machine


class PrivateDockerd:
    """A dockerd of the test's own that it may kill -9 and start again."""

    def __init__(self, root: Path, bridge: str):
        self.root, self.sock, self.bridge = root, root / "sock", bridge
        self.host = f"unix://{self.sock}"
        self.proc: subprocess.Popen | None = None

    def start(self, tries: int = 3) -> None:
        """Start it; again when it gives up at once (the killed one's containerd may still be letting go)."""
        for left in range(tries - 1, -1, -1):
            try:
                return self._start()
            except RuntimeError:
                if not left:
                    raise
                time.sleep(2)

    def _start(self) -> None:
        self._forget_dead_containerd()
        cmd = ["dockerd", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
               "--pidfile", str(self.root / "pid"), "-H", self.host, f"--bridge={self.bridge}", "--iptables=false",
               "--ip6tables=false", "--ip-forward=false", "--ip-masq=false"]
        log = open(self.root / "dockerd.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while not self.answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.root / "dockerd.log").read_text(errors="replace")[-400:]
                raise RuntimeError(f"the private dockerd did not start: {tail}")
            time.sleep(0.3)

    def _forget_dead_containerd(self) -> None:
        """The killed daemon's containerd dies with it but stays a zombie until init reaps it, and dockerd counts
        a zombie in containerd.pid as a live containerd: it then waits ~15 s for that one's socket and gives up.
        Where init reaps late (a container's init), remove the dead one's pid file so dockerd starts its own."""
        pidfile = self.root / "exec" / "containerd" / "containerd.pid"
        try:
            pid = int(pidfile.read_text().strip())
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return  # no pid file, or that process is gone: dockerd starts a containerd itself
        if state == "Z":
            pidfile.unlink(missing_ok=True)

    def answers(self) -> bool:
        return subprocess.run(["docker", "-H", self.host, "version"], capture_output=True).returncode == 0

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=60)
            if self.proc.poll() is None:
                self.kill9()

    def clean_up(self) -> None:
        """Stop it, end what its containerd left running (shims of a daemon that never came back), undo its
        mounts (it bind-mounts its data root; overlays of live containers), remove its folder."""
        self.stop()
        root, parents = str(self.root), {}
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            with contextlib.suppress(OSError, ValueError):
                parents[pid] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        for shim, _ in list(parents.items()):
            with contextlib.suppress(OSError):
                cmdline = Path(f"/proc/{shim}/cmdline").read_bytes().decode(errors="replace")
                if "containerd-shim" in cmdline and root in cmdline:
                    for pid in [p for p, parent in parents.items() if parent == shim] + [shim]:  # container, shim
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m == root or m.startswith(root + "/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)

    def rlcli_containers(self, pid: int | None = None) -> list[str]:
        """rlcli's containers in this daemon; those of the rlcli process `pid` only, if given."""
        owner = ["--filter", f"label={OWNER}={socket.gethostname()}:{pid}"] if pid is not None else []
        out = subprocess.run(["docker", "-H", self.host, "ps", "-a", "-q", "--filter", f"label={LABEL}", *owner],
                             capture_output=True, text=True, check=True).stdout
        return out.split()

    def left_after_restart(self) -> list[str]:
        """rlcli's containers still here once the daemon, started again, has removed the killed one's: it removes
        them (auto-remove) as it starts, but asynchronously, seconds later on a busy machine (up to 60 s)."""
        deadline = time.monotonic() + 60
        while (left := self.existing(self.rlcli_containers())) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def existing(self, ids: list[str]) -> list[str]:
        """Those of ids the daemon can inspect. Docker 20.10, restarted while an auto-remove container's shim
        died, may go on listing it after its own removal failed ("No such container"): a ghost that neither
        inspect nor rm finds, and no container of rlcli's."""
        return [i for i in ids if subprocess.run(["docker", "-H", self.host, "inspect", i], capture_output=True,
                                                 text=True).returncode == 0]

    def describe(self, ids: list[str]) -> str:
        """For a failed assertion: each container's owner, state and age, and the daemon's lines about it."""
        if not ids:
            return ""
        out = subprocess.run(["docker", "-H", self.host, "inspect", "--format",
                              f'{{{{.Id}}}} owner={{{{index .Config.Labels "{OWNER}"}}}} state={{{{json .State}}}} '
                              "created={{.Created}}", *ids], capture_output=True, text=True)
        log = (self.root / "dockerd.log").read_text(errors="replace").splitlines()
        about = [line for line in log if any(i[:12] in line for i in ids)][-20:]
        return f"containers left behind:\n{out.stdout}{out.stderr}\ndockerd on them:\n" + "\n".join(about)


@pytest.fixture(scope="module")
def dockerd():
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    if not shutil.which("dockerd") or not shutil.which("docker"):
        pytest.skip("no dockerd/docker binaries on this machine")
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        pytest.skip(f"no {IMAGE} image in the machine's Docker to copy: build it with scripts/base_image.sh")
    if not shutil.which("ip"):
        pytest.skip("no `ip` command to make the private dockerd's own bridge")
    root = Path(tempfile.mkdtemp(prefix="rlcli-dockerd-"))  # short: a unix socket path has ~100 bytes
    # Its own bridge, never docker0: a dockerd started with --bridge=none deletes the host's docker0
    # interface (breaking the machine's daemon), and one on docker0 would share it.
    bridge = f"rlcli{os.getpid() % 100000}"
    docker0 = Path("/sys/class/net/docker0").exists()
    daemon = PrivateDockerd(root, bridge)
    address = free_bridge_address()
    if address is None:
        pytest.skip(f"every candidate subnet for a private bridge is in use here: {BRIDGE_NETS}")
    try:
        # Its data root (the base image, ~7,000 files) in memory where a tmpfs can be mounted: the load is quicker
        # and clean_up's umount frees it at once, where deleting those files from a disk took 6-15 s.
        (root / "data").mkdir(mode=0o700)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,mode=0700", "tmpfs", str(root / "data")],
                       capture_output=True)
        made = subprocess.run(["ip", "link", "add", "name", bridge, "type", "bridge"], capture_output=True, text=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make a bridge for a private dockerd: {made.stderr.strip()}")
        subprocess.run(["ip", "addr", "add", address, "dev", bridge], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", bridge, "up"], check=True, capture_output=True)
        try:
            daemon.start()
        except (RuntimeError, OSError) as e:
            pytest.skip(f"cannot start a private dockerd here: {e}")
        save = subprocess.Popen(["docker", "save", IMAGE], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", daemon.host, "load", "-q"], stdin=save.stdout, check=True,
                       capture_output=True)
        save.wait()
        assert Path("/sys/class/net/docker0").exists() == docker0, "the private dockerd touched docker0"
        yield daemon
    finally:
        daemon.clean_up()
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def sleepy_task(root: Path, name: str, seconds: int, grading_s: int = 0) -> Path:
    """A task on the prebuilt base image whose solution sleeps, then passes (its grading sleeps grading_s)."""
    task = root / name
    (task / "solution").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "instruction.md").write_text("Write /root/done.\n")
    (task / "task.toml").write_text(f'version = "1.0"\n[agent]\ntimeout_sec = 120.0\n[verifier]\ntimeout_sec = 30.0\n'
                                    f'[environment]\ndocker_image = "{IMAGE}"\ncpus = 1\nmemory_mb = 256\n')
    (task / "solution" / "solve.sh").write_text(f"#!/bin/sh\nsleep {seconds}\ntouch /root/done\n")
    (task / "tests" / "test.sh").write_text(f"#!/bin/sh\nsleep {grading_s}\nmkdir -p /logs/verifier\n"
                                            "if [ -f /root/done ]; then r=1; else r=0; fi\n"
                                            "echo $r > /logs/verifier/reward.txt\n")
    return task


def harbor_run(task: Path, out: Path, dockerd: PrivateDockerd, home: Path, docker_timeout: int):
    env = dict(os.environ, DOCKER_HOST=dockerd.host, RLCLI_HOME=str(home))
    return trainer("harbor", "run", str(task), "--policy", "oracle", "--network", "none", "--output", str(out),
                   "--docker-timeout", str(docker_timeout), env=env)


def wait_for_sandbox(dockerd: PrivateDockerd, proc: subprocess.Popen) -> None:
    # This run's own: a container an earlier test's killed daemon left for its successor to remove is not one.
    wait_for(lambda: bool(dockerd.rlcli_containers(proc.pid)), 120, proc, "a sandbox to start")
    time.sleep(1.5)  # the solution's sleep is under way


class Stderr:
    """A background rlcli's stderr, read as it comes (a test waits for a line in it), kept whole for the asserts."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.lines = proc, []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        self.reader.start()

    def wait_for(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(needle in line for line in list(self.lines)):
            if time.monotonic() > deadline or not self.reader.is_alive():
                raise AssertionError(f"rlcli never said {needle!r}: {self.text(0)[-3000:]}")
            time.sleep(0.2)

    def text(self, timeout_s: float = 30) -> str:
        self.reader.join(timeout_s)
        return "".join(self.lines)


def restart_once_noticed(dockerd: PrivateDockerd, stderr: Stderr) -> None:
    """Kill the daemon, and start it again only once rlcli has said it is gone: however busy the machine, rlcli
    sees the outage (a daemon back before rlcli looks is the test above)."""
    dockerd.kill9()
    try:
        stderr.wait_for("stopped answering", NOTICE_BOUND_S)
    finally:
        dockerd.start()


def test_docker_dies_mid_rollout_and_stays_away(dockerd, tmp_path):
    task = sleepy_task(tmp_path / "tasks", "sleepy", 20)
    proc = harbor_run(task, tmp_path / "out", dockerd, tmp_path / "home", TIMEOUT_S)
    try:
        wait_for_sandbox(dockerd, proc)
        dockerd.kill9()
        killed = time.monotonic()
        out, err = proc.communicate(timeout=NOTICE_BOUND_S)
        noticed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        if dockerd.proc is None or dockerd.proc.poll() is not None:
            dockerd.start()
    line = last_line(err)
    assert proc.returncode != 0, err
    assert "Traceback" not in err, err
    assert "Docker daemon" in line and "did not come back" in line and "--docker-timeout" in line, err
    assert "error: the Docker daemon" in out, out  # the rollout in flight failed with the reason
    leftover = dockerd.left_after_restart()  # the daemon is back (restarted above)
    assert leftover == [], dockerd.describe(leftover)
    record("docker daemon killed during harbor run", seconds_to_notice=round(noticed, 1),
           docker_timeout_s=TIMEOUT_S, exit_code=proc.returncode,
           message=line.replace(dockerd.host, "unix://<private dockerd>"))


def two_task_run(dockerd: PrivateDockerd, tmp_path: Path) -> subprocess.Popen:
    """`harbor run` of a slow task, then (one sandbox at a time) a quick one, waiting up to 120 s for Docker."""
    tasks = tmp_path / "tasks"
    sleepy_task(tasks, "a-first", 20)
    sleepy_task(tasks, "b-second", 1)
    env = dict(os.environ, DOCKER_HOST=dockerd.host, RLCLI_HOME=str(tmp_path / "home"))
    return trainer("harbor", "run", str(tasks), "--policy", "oracle", "--network", "none", "--output",
                   str(tmp_path / "out"), "--docker-timeout", "120", "--max-sandboxes", "1", env=env)


def test_docker_back_within_timeout_run_goes_on(dockerd, tmp_path):
    proc = two_task_run(dockerd, tmp_path)
    stderr = Stderr(proc)
    try:
        wait_for_sandbox(dockerd, proc)
        restart_once_noticed(dockerd, stderr)
        proc.wait(timeout=300)
        out, err = proc.stdout.read(), stderr.text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err, err
    assert "answers again" in err, err
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "error: the Docker daemon" in rows["a-first"], out  # in flight: failed with its reason
    assert "passed" in rows["b-second"], out  # after the daemon came back: ran as usual
    assert proc.returncode != 0  # one rollout failed
    assert (left := dockerd.left_after_restart()) == [], dockerd.describe(left)


def test_docker_restarts_before_rlcli_looks_run_goes_on(dockerd, tmp_path):
    """The daemon is killed and back before rlcli looks (rlcli is stopped meanwhile, as a busy machine may leave
    it): the command in flight ends with its container gone, named as such, and the run goes on."""
    proc = two_task_run(dockerd, tmp_path)
    try:
        wait_for_sandbox(dockerd, proc)
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            dockerd.kill9()
            dockerd.start()
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err, err
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    # Two true namings, by when rlcli runs again: the command's connection was dropped and the daemon, asked at
    # once, no longer knew the container (DockerRestarted), or the container was found gone at the next look.
    named = ("came back without it (it restarted", "the Docker daemon restarted")
    assert "error: " in rows["a-first"] and any(words in rows["a-first"] for words in named), out
    assert "passed" in rows["b-second"], out
    assert proc.returncode != 0  # one rollout failed
    assert (left := dockerd.left_after_restart()) == [], dockerd.describe(left)


# --- train harbor: the same faults while training ------------------------------------------------------


def train_harbor(task: Path, folder: Path, dockerd: PrivateDockerd, server, docker_timeout: int, *flags: str):
    """One step of one task, 2 rollouts of one short turn; grading sleeps, so the sandboxes live a while."""
    env = dict(server.env, DOCKER_HOST=dockerd.host, TINKER_API_KEY="tml-faults")
    return trainer("train", "harbor", "--dataset", str(task), "--max-steps", "1", "--groups-per-batch", "1",
                   "--group-size", "2", "--max-turns", "1", "--max-tokens", "16", "--command-timeout", "5",
                   "--network", "none", "--docker-timeout", str(docker_timeout), "--base-url", server.url,
                   "--log-path", str(folder), *flags, env=env)


@pytest.mark.server
def test_train_harbor_docker_dies_and_stays_away_then_resumes(dockerd, server, tmp_path):
    task, folder = sleepy_task(tmp_path / "tasks", "slow-grading", 0, grading_s=10), tmp_path / "run"
    proc = train_harbor(task, folder, dockerd, server, TIMEOUT_S)
    try:
        wait_for_sandbox(dockerd, proc)
        dockerd.kill9()
        killed = time.monotonic()
        _, err = proc.communicate(timeout=NOTICE_BOUND_S + 60)
        noticed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        dockerd.start()
    line = last_line(err)
    record("docker daemon killed during train harbor", seconds_to_notice=round(noticed, 1),
           docker_timeout_s=TIMEOUT_S, exit_code=proc.returncode,
           message=line.replace(dockerd.host, "unix://<private dockerd>"))
    assert proc.returncode != 0 and "Traceback" not in err, err[-3000:]
    assert line.startswith("rlcli: error: the Docker daemon") and "did not come back" in line, err[-3000:]
    assert f"--log-path {folder} --resume" in line, line
    assert (left := dockerd.left_after_restart()) == [], dockerd.describe(left)
    done = train_harbor(task, folder, dockerd, server, 60, "--resume")
    out, err = done.communicate(timeout=600)
    assert done.returncode == 0, err[-3000:]
    assert "resuming" in err and json.loads((folder / "checkpoints.jsonl").read_text().splitlines()[-1])["name"] \
        == "final"


@pytest.mark.server
def test_train_harbor_docker_back_within_timeout_finishes(dockerd, server, tmp_path):
    task, folder = sleepy_task(tmp_path / "tasks", "slow-grading", 0, grading_s=10), tmp_path / "run"
    proc = train_harbor(task, folder, dockerd, server, 120)
    stderr = Stderr(proc)
    try:
        wait_for_sandbox(dockerd, proc)
        restart_once_noticed(dockerd, stderr)
        proc.wait(timeout=600)
        err = stderr.text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "answers again" in err, err[-3000:]
    assert len([line for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]) == 1
    assert (left := dockerd.left_after_restart()) == [], dockerd.describe(left)
