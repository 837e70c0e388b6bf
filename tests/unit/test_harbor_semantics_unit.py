"""Harbor 0.25's task.toml and reward rules as rlcli reads them, without Docker: network per phase, allowlist
refusal, --network none, steps and their rewards, reward.json keys, base images, the closing table."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlcli.errors import UsageError
from rlcli.harbor import taskconfig, tasks
from rlcli.harbor.images import base_images
from rlcli.harbor.summary import summary_table
from rlcli.harbor.taskconfig import Network
from rlcli.harbor.verify import scalar_reward

SEMANTICS = Path(__file__).resolve().parent.parent / "fixtures" / "harbor-semantics"
PUBLIC, OFF = Network("public"), Network("no-network")


def steps_of(text: str, names=()) -> tuple:
    return tasks.parse_task_toml(text, "t/task.toml", {n: f"do {n}" for n in names} | {None: "do it"})["steps"]


@pytest.mark.parametrize("text, agent, verifier", [
    ("", PUBLIC, PUBLIC),  # Harbor's default
    ("[environment]\nallow_internet = false", OFF, OFF),  # the older spelling
    ('[environment]\nnetwork_mode = "no-network"\n[verifier]\nnetwork_mode = "public"', OFF, PUBLIC),
    ('[agent]\nnetwork_mode = "no-network"', OFF, PUBLIC),
    # allow_internet on a phase is not Harbor's: only network_mode sets a phase
    ('[environment]\nnetwork_mode = "no-network"\n[agent]\nallow_internet = true', OFF, OFF),
])
def test_network_per_phase(text, agent, verifier):
    (step,) = steps_of(text)
    assert (step.agent_network, step.verifier_network) == (agent, verifier)


def test_step_network_overrides_the_task_phase():
    text = ('[agent]\nnetwork_mode = "no-network"\n[[steps]]\nname = "a"\n[[steps]]\nname = "b"\n'
            '[steps.agent]\nnetwork_mode = "public"\n[steps.verifier]\nnetwork_mode = "no-network"\n')
    a, b = steps_of(text, ["a", "b"])
    assert (a.agent_network, a.verifier_network) == (OFF, PUBLIC)
    assert (b.agent_network, b.verifier_network) == (PUBLIC, OFF)


def test_allowlist_is_parsed_then_refused_unless_offline():
    (step,) = steps_of('[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["PyPI.org.", "*.example.com"]')
    assert step.verifier_network == Network("allowlist", ("pypi.org", "*.example.com"))
    with pytest.raises(UsageError) as e:
        tasks.load_task(SEMANTICS / "allowlist")
    assert "\n" not in str(e.value) and "cannot be enforced" in str(e.value) and "--network none" in str(e.value)
    offline = tasks.load_task(SEMANTICS / "allowlist", network="none")
    assert offline.network == OFF and not offline.needs_network
    assert all(s.agent_network == s.verifier_network == OFF for s in offline.steps)


def test_network_none_turns_every_phase_off():
    task = tasks.load_task(SEMANTICS / "phase-network")
    assert task.needs_network and task.describe_network() == "agent no-network, verifier public"
    forced = tasks.load_task(SEMANTICS / "phase-network", network="none")
    assert not forced.needs_network and forced.describe_network() == "no-network"
    from rlcli.harbor.run import HarborRunOptions
    from rlcli.harbor.train import HarborTrainOptions
    from rlcli.options import specs

    def network(record: type) -> tuple[str, ...] | None:
        return next(spec.choices for spec in specs(record) if spec.name == "network")

    assert network(HarborRunOptions) == network(HarborTrainOptions) == ("task", "none")


def test_semantics_fixtures_load():
    found, skipped = tasks.find_tasks(SEMANTICS)
    assert [Path(f).name for f, _ in skipped] == ["allowlist"]
    by_name = {t.name: t for t in found}
    step = by_name["multi-step"]
    assert step.multi_step and [s.name for s in step.steps] == ["create", "extend"]
    create, extend = step.steps
    assert create.min_reward == 1.0 and extend.agent_timeout_s == 60 and create.agent_timeout_s == 600
    assert step.solution(extend).parent.parent.name == "extend" and step.step_workdir(extend).name == "workdir"
    assert [f.relative_to(step.path).as_posix() for f in step.tests(extend)[0]] == ["tests", "steps/extend/tests"]
    assert "### Step create" in step.instruction and "### Step extend" in step.instruction
    pre = by_name["prebuilt-workdir-env"]
    assert pre.docker_image == "debian:bookworm-slim" and not pre.has_dockerfile and pre.workdir == "/srv/app"
    assert pre.env == {"GREETING": "hello from task.toml"} and pre.solution_env == {"SOLVER": "oracle"}
    assert pre.steps[0].verifier_env == {"EXPECTED_DIR": "/srv/app"}
    assert pre.notes == ("storage_mb = 1024",)


def test_env_templates_read_rlcli_environment(monkeypatch):
    monkeypatch.setenv("RLCLI_FIXTURE_GREETING", "from the host")
    assert tasks.load_task(SEMANTICS / "prebuilt-workdir-env").env == {"GREETING": "from the host"}


def test_steps_need_their_instructions(tmp_path):
    task = Path(shutil.copytree(SEMANTICS / "multi-step", tmp_path / "multi-step"))
    (task / "steps" / "extend" / "instruction.md").unlink()
    with pytest.raises(UsageError, match="step extend has no steps/extend/instruction.md"):
        tasks.load_task(task)
    with pytest.raises(UsageError, match="unique name"):
        steps_of('[[steps]]\nname = "a"\n[[steps]]\nname = "a"', ["a"])


@pytest.mark.parametrize("rewards, key, value, error", [
    ({"correctness": 1.0, "style": 0.5}, None, 0.75, None),  # none named reward: the mean
    ({"reward": 0.25, "passed": 1.0}, None, 0.25, None),  # a "reward" key is the reward
    ({"correctness": 1.0, "style": 0.5}, "style", 0.5, None),
    ({"reward": 1.0}, "style", 0.0, "--reward-key style is not among the rewards (reward)"),
    ({}, None, 0.0, None),
])
def test_scalar_reward(rewards, key, value, error):
    assert scalar_reward(rewards, key) == (value, error)


def test_step_rewards_combine_as_harbor_does():
    per_step = [{"reward": 1.0}, {"reward": 0.5, "lines": 2.0}]
    assert taskconfig.combine_step_rewards(per_step, "mean") == {"lines": 1.0, "reward": 0.75}  # missing key: 0
    assert taskconfig.combine_step_rewards(per_step, "final") == {"reward": 0.5, "lines": 2.0}
    assert taskconfig.below_min_reward({"reward": 0.0}, 1.0) == "reward = 0 is below min_reward 1"
    assert taskconfig.below_min_reward({"a": 1.0}, {"a": 1.0, "b": 0.5}).startswith("b = -inf")
    assert taskconfig.below_min_reward({"reward": 1.0}, None) is None


def test_base_images_of_a_dockerfile(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG BASE=x\nFROM --platform=linux/amd64 golang:1.22 AS build\nRUN true\n"
                          "FROM ${BASE}\nFROM build\nfrom debian:bookworm-slim\nFROM scratch\n")
    assert base_images(dockerfile) == ["golang:1.22", "debian:bookworm-slim"]


def test_summary_table_says_why():
    task = SimpleNamespace(name="ok-task", describe_network=lambda: "public")
    broken = SimpleNamespace(name="broken", describe_network=lambda: "no-network")
    record = lambda reward, **kw: SimpleNamespace(**{"task": "ok-task", "network": "public", "reward": reward,  # noqa: E731
                                                     "error": None, "grading_error": None, "aborted": "",
                                                     "notes": [], "seconds": 2.0, **kw})
    table = summary_table([task, broken], [record(1.0), record(0.0, grading_error="no reward.json")],
                          {"broken": "building the image of task broken failed: exit 1"},
                          [("set/allowlist", "set/allowlist: network_mode ...")], rollouts=2)
    lines = table.splitlines()
    assert lines[0].split() == ["task", "network", "image", "reward", "pass@2", "time", "note"]
    assert lines[1].split()[:7] == ["ok-task", "public", "ok", "0.500", "1", "(1/2)", "2.0s"]
    assert "grading error: no reward.json" in lines[1]
    assert "FAILED" in lines[2] and lines[2].endswith("exit 1")
    assert lines[3].startswith("allowlist") and lines[3].endswith("skipped: network_mode ...")
    assert "1/2 rollouts passed" in lines[-1] and "1 tasks whose image could not be made" in lines[-1]


class FakeImages:
    """docker's images API as ensure_image uses it: which images exist, and what was built."""

    def __init__(self, present: set[str]):
        self.present, self.built = present, []

    def get(self, name: str):
        import docker

        if name not in self.present:
            raise docker.errors.ImageNotFound(name)
        return name


def test_prebuilt_image_is_preferred_when_present(tmp_path, monkeypatch):
    """Harbor prefers docker_image over the Dockerfile; without a registry, a missing one falls back to it."""
    from rlcli.harbor import images

    folder = Path(shutil.copytree(SEMANTICS / "multi-key", tmp_path / "both"))
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("[environment]", '[environment]\ndocker_image = "vendor/prebuilt:1"'))
    task = tasks.load_task(folder)
    built: list[str] = []
    monkeypatch.setattr(images, "build_image", lambda client, t, tag: built.append(tag))
    assert images.ensure_image(SimpleNamespace(images=FakeImages({"vendor/prebuilt:1"})), task) == \
        ("vendor/prebuilt:1", False) and built == []
    image, made = images.ensure_image(SimpleNamespace(images=FakeImages(set())), task)
    assert made and image.startswith("rlcli-harbor/both:") and built == [image]


def test_what_is_not_applied_is_named():
    text = ('[agent]\nuser = "agent"\n[verifier.environment]\ncpus = 1\n'
            '[environment]\ngpus = 1\nstorage_mb = 512\nhealthcheck = { command = "true" }\n')
    notes = tasks.parse_task_toml(text, "t/task.toml")["notes"]
    assert notes[:2] == ("storage_mb = 512", "gpus = 1") and notes[2].startswith("healthcheck")
    assert "a separate verifier environment" in notes[3] and notes[4].startswith("[agent] user")
