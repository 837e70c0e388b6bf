"""Harbor 0.25's semantics in real Docker: network per phase, --network none, allowlist refusal, multi-key
reward.json, the image's entrypoint, multi-step tasks, prebuilt images with workdir and env, failed builds.

The fixture tasks (tests/fixtures/harbor-semantics), with what their oracle and nop score:
    phase-network         agent offline, verifier online     oracle 1     nop 0   (--network none: oracle 0)
    multi-key             {"correctness", "style"}           oracle 0.75  nop 0   (--reward-key style: 0.5)
    entrypoint-service    needs what its ENTRYPOINT starts   oracle 1     nop 0
    multi-step            two steps, min_reward on the first oracle 1     nop 0   (nop stops after step 1;
                          step 1's test.sh is a perl script: scripts run by their shebang)
    prebuilt-workdir-env  docker_image, workdir, env tables  oracle 1     nop 0
    allowlist             network_mode = "allowlist"         refused; with --network none: oracle 1
    broken-build          a RUN step that fails              skipped with the build's last line
    missing-base          FROM an image that is not here     skipped with the offline base-image hint
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, popen_rlcli

SEMANTICS = REPO / "tests" / "fixtures" / "harbor-semantics"
ORACLE = {"phase-network": 1.0, "multi-key": 0.75, "entrypoint-service": 1.0, "multi-step": 1.0,
          "prebuilt-workdir-env": 1.0}
pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def harbor_run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, dict], str]:
    """`rlcli harbor run` over the fixtures: (process, results by task, the owner label of its sandboxes)."""
    out = tmp_path / "out"
    env = dict(os.environ, RLCLI_HOME=str(tmp_path / "home"))
    proc = popen_rlcli("harbor", "run", str(SEMANTICS), "--output", str(out), *args, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] \
        if (out / "results.jsonl").exists() else []
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return done, {row["task"]: row for row in rows}, f"{socket.gethostname()}:{proc.pid}"


def left_running(client, owner: str) -> list:
    from rlcli.harbor.sandbox import OWNER

    return client.containers.list(all=True, filters={"label": f"{OWNER}={owner}"})


def test_oracle_scores_what_it_earns_and_broken_tasks_are_skipped(docker_client, tmp_path):
    proc, rows, owner = harbor_run(tmp_path, "--policy", "oracle")
    assert proc.returncode == 1, proc.stderr  # two tasks could not be built: the run says it was incomplete
    assert {name: row["reward"] for name, row in rows.items()} == ORACLE, proc.stderr
    assert rows["multi-key"]["rewards"] == {"correctness": 1.0, "style": 0.5} and not rows["multi-key"]["grading_error"]
    assert rows["phase-network"]["network"] == "agent no-network, verifier public"
    steps = rows["multi-step"]["steps"]
    assert [s["name"] for s in steps] == ["create", "extend"] and rows["multi-step"]["rewards"] == \
        {"reward": 1.0, "lines": 1.0}  # each key's mean over the steps; "lines" was missing in step 1: 0
    assert rows["prebuilt-workdir-env"]["notes"] == ["storage_mb = 1024"]
    table = proc.stderr[proc.stderr.index("task "):]
    assert "returned a non-zero code" in table and "rlcli-fixture/no-such-base:1 is not on this machine" in table
    assert "make base-image" in table and "skipped: network_mode = \"allowlist\"" in table
    assert "5/5 rollouts passed" not in table and "4/5 rollouts passed" in table  # multi-key scores 0.75
    assert "2 tasks whose image could not be made, 1 folders skipped" in table
    assert left_running(docker_client, owner) == []


def test_nop_scores_zero_and_a_failed_step_stops_the_rest(docker_client, tmp_path):
    proc, rows, owner = harbor_run(tmp_path, "--policy", "nop", "--task-filter", "phase-*,multi-*,entry*,pre*")
    assert proc.returncode == 0, proc.stderr
    assert {name: row["reward"] for name, row in rows.items()} == dict.fromkeys(ORACLE, 0.0)
    step = rows["multi-step"]
    assert [s["name"] for s in step["steps"]] == ["create"] and "below min_reward 1" in step["aborted"]
    assert not any(row["grading_error"] or row["error"] for row in rows.values())
    assert left_running(docker_client, owner) == []


def test_network_none_and_reward_key(docker_client, tmp_path):
    """--network none: the task that needs the network at grading time fails, the allowlist task runs
    offline; --reward-key picks one key of a multi-key reward.json."""
    proc, rows, owner = harbor_run(tmp_path, "--policy", "oracle", "--network", "none", "--reward-key", "style",
                                   "--task-filter", "phase-network,allowlist,multi-key")
    assert proc.returncode == 0, proc.stderr
    assert rows["multi-key"]["reward"] == 0.5 and rows["multi-key"]["rewards"]["correctness"] == 1.0
    assert rows["phase-network"]["reward"] == 0.0 and rows["phase-network"]["network"] == "no-network"
    assert "--reward-key style is not among the rewards" in rows["phase-network"]["grading_error"]
    assert rows["allowlist"]["network"] == "no-network" and rows["allowlist"]["rewards"] == {"reward": 1.0}
    assert left_running(docker_client, owner) == []


def sandbox_for(client, folder: Path):
    from rlcli.harbor import images, sandbox, tasks

    task = tasks.load_task(folder)
    return sandbox.Sandbox.start(client, images.ensure_image(client, task)[0], task, 120)


def interfaces(box) -> list[str]:
    return sorted(box.exec("ls /sys/class/net", 10).output.split())


def test_network_switches_per_phase_in_one_container(docker_client, tmp_path):
    box = sandbox_for(docker_client, SEMANTICS / "multi-key")  # never online: no network at all
    try:
        assert interfaces(box) == ["lo"] and box.container.attrs["HostConfig"]["NetworkMode"] == "none"
    finally:
        box.remove()
    box = sandbox_for(docker_client, SEMANTICS / "phase-network")  # public baseline, agent phase off
    try:
        assert len(interfaces(box)) == 2
        box.set_network(False)
        assert interfaces(box) == ["lo"]
        box.set_network(True)
        assert len(interfaces(box)) == 2 and box.exec("grep -c 00000000 /proc/net/route", 10).output.strip() != "0"
    finally:
        box.remove()
    # Offline environment, online verifier: the entrypoint starts with no network; grading gets one.
    task = Path(shutil.copytree(SEMANTICS / "phase-network", tmp_path / "offline-start"))
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace('[agent]\ntimeout_sec = 60.0\nnetwork_mode = "no-network"',
                                             "[agent]\ntimeout_sec = 60.0")
                    .replace("memory_mb = 256", 'memory_mb = 256\nnetwork_mode = "no-network"')
                    .replace("timeout_sec = 30.0", 'timeout_sec = 30.0\nnetwork_mode = "public"'))
    box = sandbox_for(docker_client, task)
    try:
        assert interfaces(box) == ["lo"] and box.container.attrs["HostConfig"]["NetworkMode"] == "bridge"
        box.set_network(True)
        assert len(interfaces(box)) == 2
    finally:
        box.remove()


def test_model_policy_runs_the_steps_in_one_conversation(docker_client, embedded_model, tmp_path):
    """HarborEnv with a scripted "model" on the multi-step task: step 1's reply, then step 2's instruction
    arrives as the next user turn in the same container, and both steps are graded."""
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
    replies = [call % "echo alpha > /root/notes.txt", "Step one done.<|im_end|>",
               call % "cat /root/seed.txt >> /root/notes.txt", "Done.<|im_end|>"]
    prompts: list[str] = []

    class Scripted(TokenCompleter):
        async def __call__(self, model_input, stop, *, max_tokens=None):
            prompts.append(renderer.tokenizer.decode(model_input.to_ints()))
            tokens = renderer.tokenizer.encode(replies[len(prompts) - 1], add_special_tokens=False)
            return TokensWithLogprobs(tokens, [0.0] * len(tokens))

    async def rollout():
        env = HarborEnv(tasks.load_task(SEMANTICS / "multi-step"), renderer, AgentSettings(5, 10.0),
                        SandboxPool(docker_client, 1), tmp_path / "multi")
        return await do_single_rollout(Scripted(), env), env.record

    trajectory, record = asyncio.run(rollout())
    assert [t.reward for t in trajectory.transitions] == [0.0, 0.0, 0.0, 1.0]
    assert record.reward == 1.0 and [s["name"] for s in record.steps] == ["create", "extend"]
    assert "seed.txt" not in prompts[1] and "Append the contents of /root/seed.txt" in prompts[2]
    assert trajectory.transitions[-1].metrics["harbor/steps"] == 2.0
    assert trajectory.transitions[-1].metrics["harbor/reward/lines"] == 1.0  # every key reaches metrics.jsonl
    assert left_running(docker_client, owner_id()) == []


def test_cookbook_harbor_recipe_runs_on_local_docker(docker_client, embedded_model):
    """tinker-cookbook's own Harbor environment (recipes/harbor_rl) with rlcli's Docker sandbox as its
    SandboxInterface: a scripted model's tool call runs in the container and the cookbook's grader scores 1."""
    from tinker_cookbook.completers import TokenCompleter, TokensWithLogprobs
    from tinker_cookbook.rl.rollouts import do_single_rollout
    from tinker_cookbook.sandbox import SandboxInterface

    from rlcli.harbor.cookbook_sandbox import docker_sandbox_factory, harbor_recipe
    from rlcli.harbor.sandbox import owner_id
    from rlcli.train import renderers

    renderers.register_local_tokenizer(embedded_model)
    recipe, factory = harbor_recipe(), docker_sandbox_factory()
    folder = REPO / "tests" / "fixtures" / "harbor" / "hello-file"
    task = recipe.HarborTask(task_name="hello-file", instruction=(folder / "instruction.md").read_text(),
                             task_dir=folder)
    builder = recipe.HarborEnvGroupBuilder(task=task, model_name=embedded_model, group_size=1, max_turns=3,
                                           renderer_name=renderers.choose_renderer(embedded_model),
                                           sandbox_timeout=120, command_timeout=10, grader_timeout=30,
                                           sandbox_factory=factory)
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hello > /root/hello.txt"}}\n</tool_call>'
    replies = [call + "<|im_end|>", "Done.<|im_end|>"]
    outputs: list[str] = []

    async def rollout():
        (env,) = await builder.make_envs()
        tokenizer = renderers._load_tokenizer(embedded_model)

        class Scripted(TokenCompleter):
            async def __call__(self, model_input, stop, *, max_tokens=None):
                outputs.append(tokenizer.decode(model_input.to_ints()))
                tokens = tokenizer.encode(replies[len(outputs) - 1], add_special_tokens=False)
                return TokensWithLogprobs(tokens, [0.0] * len(tokens))

        assert isinstance(builder._sandboxes[0], SandboxInterface)  # the cookbook's protocol, checked at run time
        try:
            return await do_single_rollout(Scripted(), env)
        finally:
            await builder.cleanup()

    trajectory = asyncio.run(rollout())
    assert sum(t.reward for t in trajectory.transitions) == 1.0
    assert '"exit_code": 0' in outputs[1]  # the command's result went back to the model
    assert left_running(docker_client, owner_id()) == []
