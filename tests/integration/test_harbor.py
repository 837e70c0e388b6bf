"""Harbor tasks in real Docker: grading, in-container timeouts, isolation, limits, cleanup, one training step.

Needs a Docker daemon (`sudo scripts/docker_up.sh`) and the debian:bookworm-slim base image
(`scripts/base_image.sh`); skipped with the reason when either is missing. The fixture images are
built once per session and kept, as rlcli keeps them (one per content: the next session reuses them);
an image built from content unique to a test is removed by that test.

The fixture tasks (tests/fixtures/harbor), with what their oracle (solution/solve.sh) and nop score:
    hello-file       write a file                         oracle 1    nop 0
    sum-numbers      reward.json {"reward", "has_file"}   oracle 1    nop 0
    network-allowed  needs the network (`network = true`)  oracle 1    nop 0
    partial-credit   4 checks, reward = fraction passed   oracle 0.5  nop 0  (the oracle writes 2 of 4 lines)
    always-fails     must predict a fresh kernel UUID     oracle 0    nop 0
    forgets-reward   test.sh writes no reward file        oracle 0    nop 0  (both a counted grading error)
    hangs            waits for a file nobody creates      oracle 0    nop 0  (solve.sh is killed at its timeout)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, popen_rlcli

FIXTURES = REPO / "tests" / "fixtures" / "harbor"
ORACLE = {"hello-file": 1.0, "sum-numbers": 1.0, "network-allowed": 1.0, "partial-credit": 0.5, "always-fails": 0.0,
          "forgets-reward": 0.0, "hangs": 0.0}
pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


@pytest.fixture(scope="module", autouse=True)
def fixture_images(docker_client):
    """The fixture tasks' images, built once (every test here uses them); docker_client is tests/integration's."""
    from rlcli.harbor import images, tasks

    for task in tasks.find_tasks(FIXTURES)[0]:
        images.ensure_image(docker_client, task)


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, RLCLI_HOME=str(tmp_path / "home"))


def labelled(client, owner: str | None = None) -> list:
    from rlcli.harbor.images import LABEL
    from rlcli.harbor.sandbox import OWNER

    label = f"{OWNER}={owner}" if owner else LABEL
    return client.containers.list(all=True, filters={"label": label}, ignore_removed=True)  # others remove theirs


def rlcli(*args: str, env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, str]:
    """Run the CLI; also return the owner label its sandboxes carry, so checks see only its containers
    (other test sessions may use this Docker daemon at the same time)."""
    proc = popen_rlcli(*args, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), f"{socket.gethostname()}:{proc.pid}"


def results(folder: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    return {row["task"]: row for row in rows}


def start_sandbox(client, name: str, lifetime_s: float = 120, network: str = "task"):
    from rlcli.harbor import images, sandbox, tasks

    task = tasks.load_task(FIXTURES / name, network=network)
    return sandbox.Sandbox.start(client, images.ensure_image(client, task)[0], task, lifetime_s)


def running(box) -> list[str]:
    """The command lines of the processes in a sandbox, as `docker top` lists them."""
    return [p[-1] for p in box.container.top()["Processes"]]


def test_oracle_scores_each_fixture_and_the_hang_is_killed(docker_client, env, tmp_path):
    """One oracle run over every fixture; --command-timeout 3 bounds each solve.sh, so the hang ends at 3 s."""
    proc, owner = rlcli("harbor", "run", str(FIXTURES), "--policy", "oracle", "--command-timeout", "3",
                        "--output", str(tmp_path / "out"), env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rows = results(tmp_path / "out")
    assert {name: row["reward"] for name, row in rows.items()} == ORACLE
    assert [name for name, row in rows.items() if row["grading_error"] or row["error"]] == ["forgets-reward"]
    assert rows["sum-numbers"]["rewards"] == {"reward": 1.0, "has_file": 1.0}  # read from reward.json
    assert rows["partial-credit"]["rewards"] == {"reward": 0.5, "passed": 2.0, "total": 4.0}
    assert "wrote no /logs/verifier/reward" in rows["forgets-reward"]["grading_error"]
    assert "3/7 rollouts passed" in proc.stderr and "1 grading error," in proc.stderr  # counted, not hidden
    markdown = (tmp_path / "out" / "hello-file.md").read_text()
    assert "; /solution/solve.sh" in markdown and "## Verifier" in markdown  # run directly: its shebang decides
    # The hang: killed at 3 s inside the container. Its verifier then looked for survivors from inside.
    hang = json.loads((tmp_path / "out" / "hangs.json").read_text())
    command = hang["turns"][0]["commands"][0]
    assert command["timed_out"] and command["exit_code"] == 137 and 2.5 < command["seconds"] < 8, command
    assert hang["stop"] == "timeout" and hang["error"] is None  # graded all the same
    assert rows["hangs"]["rewards"]["left_running"] == 0, hang["verifier_output"]
    assert "killed at its timeout" in (tmp_path / "out" / "hangs.md").read_text()
    assert labelled(docker_client, owner) == []


def test_nop_scores_zero(docker_client, env, tmp_path):
    proc, owner = rlcli("harbor", "run", str(FIXTURES), "--policy", "nop", "--output", str(tmp_path / "out"),
                        env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rows = results(tmp_path / "out")
    assert {name: row["reward"] for name, row in rows.items()} == dict.fromkeys(ORACLE, 0.0)
    assert [name for name, row in rows.items() if row["grading_error"] or row["error"]] == ["forgets-reward"]
    assert labelled(docker_client, owner) == []


def test_hanging_command_is_killed_inside_the_container(docker_client):
    """The hangs fixture's solve.sh (a loop, and a background `tail -f`) run with a 2 s timeout: nothing
    of it is left in `docker top`, and the sandbox still works."""
    box = start_sandbox(docker_client, "hangs")
    try:
        box.put_folder(FIXTURES / "hangs" / "solution", "/solution")
        result = box.exec("bash /solution/solve.sh; echo never", timeout_s=2)
        assert result.timed_out and result.seconds < 10 and "never" not in result.output
        assert box.exec("test -e /root/waiting && echo ran", 10).output.strip() == "ran"  # it did start
        assert not any("solve.sh" in c or "tail -f" in c for c in running(box)), running(box)
        assert box.exec("echo alive", 10).output.strip() == "alive"
    finally:
        box.remove()


def test_no_network_when_the_task_says_so_and_limits_are_set(docker_client):
    box = start_sandbox(docker_client, "hello-file", network="none")  # hello-file says nothing: Harbor's public
    try:
        assert box.exec("ls /sys/class/net", 10).output.split() == ["lo"]
        assert box.exec("getent hosts deb.debian.org", 20).exit_code != 0
        host = box.container.attrs["HostConfig"]
        assert (host["NanoCpus"], host["Memory"], host["PidsLimit"], host["NetworkMode"]) == \
            (1_000_000_000, 256 * 2**20, 128, "none")
        # Nothing of the host reaches a task's container (rlcli/harbor/privileges.py refuses tasks that ask).
        assert not host["Privileged"] and not host.get("Binds") and not host.get("Mounts")
        assert not host.get("Devices") and not host.get("CapAdd") and not host.get("SecurityOpt")
        assert host.get("PidMode", "") == "" and host.get("IpcMode") in ("", "private", "shareable")
        assert not any("docker.sock" in m.get("Source", "") for m in box.container.attrs.get("Mounts") or [])
    finally:
        box.remove()
    allowed = start_sandbox(docker_client, "network-allowed")
    try:
        assert "eth0" in allowed.exec("ls /sys/class/net", 10).output.split()
        assert allowed.container.attrs["HostConfig"]["NetworkMode"] == "bridge"
    finally:
        allowed.remove()


def test_a_dead_container_fails_the_rollout_cleanly(docker_client):
    from rlcli.harbor.sandbox import SandboxError

    box = start_sandbox(docker_client, "hello-file")
    box.container.kill()
    started = time.monotonic()
    with pytest.raises(SandboxError, match="sandbox .* (died|is gone)"):
        box.exec("true", 10)
    assert time.monotonic() - started < 10
    box.remove()


def test_sweep_removes_only_dead_owners(docker_client):
    from rlcli.harbor import images, sandbox, tasks

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is now a dead rlcli's
    image = images.image_tag(tasks.load_task(FIXTURES / "hello-file"))
    labels = {sandbox.LABEL: "1", sandbox.OWNER: f"{socket.gethostname()}:{gone.pid}"}
    dead = docker_client.containers.run(image, entrypoint=["sleep", "60"], labels=labels, detach=True)
    live = start_sandbox(docker_client, "hello-file")
    try:
        assert sandbox.sweep(docker_client) >= 1
        ids = {c.id for c in labelled(docker_client)}
        assert dead.id not in ids and live.container.id in ids
    finally:
        live.remove()
        sandbox._remove(dead)


def test_sigint_mid_rollout_leaves_no_container(docker_client, env, tmp_path):
    # The hangs fixture's solve.sh never ends; --sandbox-timeout lets it run long past the SIGINT.
    proc = popen_rlcli("harbor", "run", str(FIXTURES / "hangs"), "--policy", "oracle", "--sandbox-timeout", "300",
                       "--output", str(tmp_path / "out"), env=env, ctrl_c=True)
    owner = f"{socket.gethostname()}:{proc.pid}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until the oracle's solve.sh runs in the container
            boxes = [c for c in labelled(docker_client, owner) if c.status == "running"]
            if boxes and any("tail -f /dev/null" in p[-1] for p in boxes[0].top()["Processes"]):
                break
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        else:
            pytest.fail("the rollout never started")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    time.sleep(1)  # auto-remove finishes asynchronously in the daemon
    assert labelled(docker_client, owner) == []


def builder_contexts(since: float) -> list[str]:
    """The daemon's copies of build contexts made since then (the classic builder unpacks each into
    /var/lib/docker/tmp/docker-builder*); [] when that folder cannot be read (a remote daemon, no root)."""
    folder = Path("/var/lib/docker/tmp")
    try:
        return [str(p) for p in folder.glob("docker-builder*") if p.stat().st_mtime >= since]
    except OSError:
        return []


@pytest.mark.server
@pytest.mark.timeout(600)
def test_train_harbor_one_step(docker_client, server, tmp_path):
    """One step over all 7 fixtures and two of Harbor's newer forms (a multi-key reward.json, a multi-step
    task) x 2 rollouts, one task's image built by the run itself (a file only this test has joins its build
    context), with a TMPDIR of its own: afterwards no container and no build context is left, neither
    rlcli's (in TMPDIR) nor the daemon's."""
    from rlcli.harbor import images, tasks

    dataset = Path(shutil.copytree(FIXTURES, tmp_path / "tasks"))
    for name in ("multi-key", "multi-step"):
        shutil.copytree(REPO / "tests" / "fixtures" / "harbor-semantics" / name, dataset / name)
    (dataset / "hello-file" / "environment" / "nonce.txt").write_text(f"{tmp_path}\n")
    tag = images.image_tag(tasks.load_task(dataset / "hello-file"))
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    folder, started = tmp_path / "run", time.time()
    try:
        proc, owner = rlcli("train", "harbor", "--loss", "gspo", "--dataset", str(dataset), "--max-steps", "1",
                            "--groups-per-batch", "9", "--group-size", "2", "--max-turns", "2", "--max-tokens", "32",
                            "--command-timeout", "5", "--base-url", server.url, "--log-path", str(folder),
                            env=dict(server.env, TMPDIR=str(scratch)), timeout=540)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"image {tag} for hello-file: built in" in proc.stderr
        metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        step = next(m for m in metrics if "env/all/reward/total" in m)
        assert 0.0 <= step["env/all/reward/total"] <= 1.0 and step["env/all/harbor/grading_error"] > 0
        assert {"env/all/harbor/reward/correctness", "env/all/harbor/reward/style"} <= set(step)  # every key
        records = [json.loads(p.read_text()) for p in (folder / "trajectories").rglob("*.json")]
        assert len(records) == 18  # 9 tasks x 2 rollouts, each graded
        assert all(r["steps"] and r["steps"][0]["name"] == "create" for r in records if r["task"] == "multi-step")
        assert all(r["stop"] and r["error"] is None for r in records)
        assert sorted(r["task"] for r in records if r["grading_error"]) == ["forgets-reward"] * 2
        markdown = next((folder / "trajectories").rglob("hello-file-0.md")).read_text()
        assert markdown.startswith("# hello-file: reward") and "## Turn 1" in markdown and "## Verifier" in markdown
        assert labelled(docker_client, owner) == []
        left = [p for p in scratch.rglob("*") if p.is_file() and tarfile.is_tarfile(p)]
        assert left == [], f"build contexts left in TMPDIR: {left}"
        deadline = time.monotonic() + 30  # other sessions' builds may be running: theirs end too
        while builder_contexts(started) and time.monotonic() < deadline:
            time.sleep(1)
        assert builder_contexts(started) == []
    finally:
        with contextlib.suppress(Exception):  # an image of content only this test had: ours to remove
            docker_client.images.remove(tag)


def test_agent_loop_runs_tool_calls_turn_by_turn(docker_client, embedded_model, tmp_path):
    """HarborEnv under the cookbook's rollout loop, with a scripted "model" that answers in Qwen3's tool
    format: its commands run in the container turn by turn, and the verifier's 1 is the reward."""
    import asyncio

    from tinker_cookbook.completers import TokenCompleter, TokensWithLogprobs
    from tinker_cookbook.renderers import get_renderer
    from tinker_cookbook.rl.rollouts import do_single_rollout

    from rlcli.harbor import tasks
    from rlcli.harbor.agent import AgentSettings, HarborEnv
    from rlcli.harbor.sandbox import SandboxPool, owner_id
    from rlcli.train import renderers

    renderers.register_local_tokenizer(embedded_model)
    renderer = get_renderer(renderers.choose_renderer(embedded_model), renderers._load_tokenizer(embedded_model))
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "%s"}}\n</tool_call><|im_end|>'
    replies = [call % "sleep 30; echo late", call % "echo hello > /root/hello.txt && cat /root/hello.txt",
               "Done.<|im_end|>"]
    prompts: list[str] = []

    class Scripted(TokenCompleter):
        async def __call__(self, model_input, stop, *, max_tokens=None):
            prompts.append(renderer.tokenizer.decode(model_input.to_ints()))
            tokens = renderer.tokenizer.encode(replies[len(prompts) - 1], add_special_tokens=False)
            return TokensWithLogprobs(tokens, [0.0] * len(tokens))

    async def rollout():
        env = HarborEnv(tasks.load_task(FIXTURES / "hello-file"), renderer, AgentSettings(5, 2.0),
                        SandboxPool(docker_client, 1), tmp_path / "hello")
        return await do_single_rollout(Scripted(), env), env.record

    trajectory, record = asyncio.run(rollout())
    assert [t.reward for t in trajectory.transitions] == [0.0, 0.0, 1.0]
    assert all(t.ac.maybe_logprobs for t in trajectory.transitions)  # what training uses, per turn
    assert record.reward == 1.0 and record.stop == "completed" and record.error is None
    first, second = (turn["commands"][0] for turn in record.turns[:2])
    assert first["timed_out"] and "late" not in first["output"]
    assert second["exit_code"] == 0 and second["output"].strip() == "hello"
    assert "killed: it ran past 2 s" in prompts[1] and "hello" in prompts[2]  # outputs went back to the model
    assert (tmp_path / "hello.md").read_text().count("**command**") == 2
    assert labelled(docker_client, owner_id()) == []
