"""Harbor tasks in real Docker: grading, in-container timeouts, isolation, limits, cleanup, one training step.

Needs a Docker daemon (`sudo scripts/docker_up.sh`) and the debian:bookworm-slim base image
(`scripts/base_image.sh`); skipped with the reason when either is missing. The fixture images are
built once per session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, RLCLI

FIXTURES = REPO / "tests" / "fixtures" / "harbor"
SOLVABLE = ("hello-file", "sum-numbers", "network-allowed")
pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


@pytest.fixture(scope="session")
def docker_client():
    from rlcli.errors import RlcliError
    from rlcli.harbor import sandbox, tasks

    try:
        client = sandbox.connect()
    except RlcliError as e:
        pytest.skip(f"no Docker daemon: {e}")
    if not client.images.list(name="debian:bookworm-slim"):
        pytest.skip("no debian:bookworm-slim image: build it offline with `scripts/base_image.sh` (make base-image)")
    for task in tasks.find_tasks(FIXTURES)[0]:
        sandbox.ensure_image(client, task)  # once per session; every test below reuses them
    return client


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, RLCLI_HOME=str(tmp_path / "home"))


def labelled(client, owner: str | None = None) -> list:
    from rlcli.harbor.sandbox import LABEL, OWNER

    label = f"{OWNER}={owner}" if owner else LABEL
    return client.containers.list(all=True, filters={"label": label})


def rlcli(*args: str, env: dict, timeout: float) -> tuple[subprocess.CompletedProcess, str]:
    """Run the CLI; also return the owner label its sandboxes carry, so checks see only its containers
    (other test sessions may use this Docker daemon at the same time)."""
    proc = subprocess.Popen([*RLCLI, *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), f"{socket.gethostname()}:{proc.pid}"


def results(folder: Path) -> dict[str, dict]:
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    return {row["task"]: row for row in rows}


def start_sandbox(client, name: str, lifetime_s: float = 120):
    from rlcli.harbor import sandbox, tasks

    task = tasks.load_task(FIXTURES / name)
    return sandbox.Sandbox.start(client, sandbox.ensure_image(client, task)[0], task, lifetime_s)


def test_oracle_solves_and_the_broken_verifier_is_a_grading_error(docker_client, env, tmp_path):
    proc, owner = rlcli("harbor", "run", str(FIXTURES), "--policy", "oracle", "--output", str(tmp_path / "out"),
                        env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rows = results(tmp_path / "out")
    for name in SOLVABLE:
        assert rows[name]["reward"] == 1.0 and rows[name]["grading_error"] is None, rows[name]
    assert rows["sum-numbers"]["rewards"] == {"reward": 1.0, "has_file": 1.0}  # read from reward.json
    broken = rows["forgets-reward"]
    assert broken["reward"] == 0.0 and "wrote no /logs/verifier/reward" in broken["grading_error"]
    assert "1 grading error" in proc.stderr
    markdown = (tmp_path / "out" / "hello-file.md").read_text()
    assert "bash /solution/solve.sh" in markdown and "## Verifier" in markdown
    assert labelled(docker_client, owner) == []


def test_nop_scores_zero(docker_client, env, tmp_path):
    proc, owner = rlcli("harbor", "run", str(FIXTURES), "--policy", "nop", "--output", str(tmp_path / "out"),
                        env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rows = results(tmp_path / "out")
    assert all(row["reward"] == 0.0 for row in rows.values())
    assert rows["forgets-reward"]["grading_error"] and rows["hello-file"]["grading_error"] is None
    assert labelled(docker_client, owner) == []


def test_command_past_its_timeout_is_killed_inside_the_container(docker_client):
    box = start_sandbox(docker_client, "hello-file")
    try:
        result = box.exec("sleep 300 & sleep 301; echo never", timeout_s=2)
        assert result.timed_out and result.seconds < 10 and "never" not in result.output
        commands = [p[-1] for p in box.container.top()["Processes"]]
        assert not any("sleep 30" in c for c in commands), commands  # the child and the background job
        assert box.exec("echo alive", 10).output.strip() == "alive"
    finally:
        box.remove()


def test_no_network_by_default_and_limits_are_set(docker_client):
    box = start_sandbox(docker_client, "hello-file")
    try:
        assert box.exec("ls /sys/class/net", 10).output.split() == ["lo"]
        assert box.exec("getent hosts deb.debian.org", 20).exit_code != 0
        host = box.container.attrs["HostConfig"]
        assert (host["NanoCpus"], host["Memory"], host["PidsLimit"], host["NetworkMode"]) == \
            (1_000_000_000, 256 * 2**20, 128, "none")
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
    from rlcli.harbor import sandbox, tasks

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid is now a dead rlcli's
    image = sandbox.image_tag(tasks.load_task(FIXTURES / "hello-file"))
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
    task = Path(shutil.copytree(FIXTURES / "hello-file", tmp_path / "slow-task"))
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\nsleep 300\n")
    proc = subprocess.Popen([*RLCLI, "harbor", "run", str(task), "--policy", "oracle", "--output",
                             str(tmp_path / "out")], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    owner = f"{socket.gethostname()}:{proc.pid}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until the oracle's `sleep 300` runs in the container
            boxes = [c for c in labelled(docker_client, owner) if c.status == "running"]
            if boxes and any("sleep 300" in p[-1] for p in boxes[0].top()["Processes"]):
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


@pytest.mark.server
@pytest.mark.timeout(600)
def test_train_harbor_one_step(docker_client, server, tmp_path):
    folder = tmp_path / "run"
    proc, owner = rlcli("train", "harbor", "--loss", "gspo", "--dataset", str(FIXTURES), "--max-steps", "1",
                        "--group-size", "2", "--max-turns", "2", "--max-tokens", "32", "--base-url", server.url,
                        "--log-path", str(folder), env=server.env, timeout=540)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "env/all/reward/total" in m)
    assert step["env/all/reward/total"] >= 0.0 and "env/all/harbor/grading_error" in step
    records = [json.loads(p.read_text()) for p in (folder / "trajectories").rglob("*.json")]
    assert len(records) == 8  # 4 tasks x 2 rollouts, each graded
    assert all(r["stop"] and r["error"] is None for r in records)
    assert sum(bool(r["grading_error"]) for r in records) == 2  # the forgets-reward task's two rollouts
    markdown = next((folder / "trajectories").rglob("hello-file-0.md")).read_text()
    assert markdown.startswith("# hello-file: reward") and "## Turn 1" in markdown and "## Verifier" in markdown
    assert labelled(docker_client, owner) == []


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
