"""Harbor pieces that need no Docker and no server: task.toml, task discovery, image hashes, rewards,
dataset resolution offline, limits mapping, the agent's tool protocol, and train harbor's fail-fast order."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli.errors import RlcliError, UsageError
from rlcli.harbor import tasks
from rlcli.harbor.images import image_tag
from rlcli.harbor.sandbox import run_options
from rlcli.harbor.taskconfig import Network
from rlcli.harbor.tasks import Limits

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "harbor"
NAMES = ["always-fails", "forgets-reward", "hangs", "hello-file", "network-allowed", "partial-credit", "sum-numbers"]


def copy_task(tmp_path: Path, name: str = "hello-file") -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def test_task_toml_defaults():
    """Harbor's defaults: the public network, a 600 s verifier, no prebuilt image."""
    fields = tasks.parse_task_toml("")
    assert fields["limits"] == Limits(cpus=1.0, memory_mb=2048, pids=1024)
    assert fields["network"] == Network("public")
    (step,) = fields["steps"]
    assert (step.agent_timeout_s, step.verifier_timeout_s, fields["build_timeout_s"]) == (600, 600, 600)
    assert step.agent_network == step.verifier_network == Network("public")
    assert fields["docker_image"] is None and fields["workdir"] is None and fields["notes"] == ()


@pytest.mark.parametrize("env, limits, mode", [
    ('cpus = 2\nmemory_mb = 300\npids_limit = 64\nnetwork = true', Limits(2.0, 300, 64), "public"),
    ('memory = "1G"\nallow_internet = false', Limits(1.0, 1024, 1024), "no-network"),
    ('memory = "512M"\nnetwork = "none"', Limits(1.0, 512, 1024), "no-network"),
    ('memory = 768\nnetwork = "bridge"\ncpus = 0.5', Limits(0.5, 768, 1024), "public"),
    ('network_mode = "no-network"\nallow_internet = true', Limits(), "no-network"),  # network_mode wins
])
def test_task_toml_limits(env, limits, mode):
    text = f"[agent]\ntimeout_sec = 30\n[verifier]\ntimeout_sec = 5.5\n[environment]\n{env}\n"
    fields = tasks.parse_task_toml(text)
    assert fields["limits"] == limits and fields["network"].mode == mode
    (step,) = fields["steps"]
    assert (step.agent_timeout_s, step.verifier_timeout_s) == (30, 5.5)


@pytest.mark.parametrize("text, needle", [
    ("[environment]\ncpus = -1", "cpus must be a positive number"),
    ('[environment]\nmemory = "lots"', "not a size"),
    ("[environment]\nmemory_mb = 2", "too small"),
    ('[environment]\nnetwork = "maybe"', "allow_internet must be true or false"),
    ('[environment]\nnetwork_mode = "private"', "network_mode must be one of public, no-network, allowlist"),
    ('[environment]\nallowed_hosts = ["a.org"]', 'allowed_hosts needs network_mode = "allowlist"'),
    ('[verifier]\nnetwork_mode = "public"\nallowed_hosts = ["a.org"]', "allowed_hosts must be a list"),
    ('[environment]\nworkdir = "app"', "workdir must be an absolute path"),
    ('[environment.env]\nTOKEN = "${RLCLI_SURELY_UNSET_VAR}"', r"needs \$RLCLI_SURELY_UNSET_VAR set"),
    ('multi_step_reward_strategy = "max"', "must be mean or final"),
    ("[agent]\ntimeout_sec = 0", "timeout_sec must be a positive number"),
    ("[environment\n", "not valid TOML"),
])
def test_task_toml_errors_are_one_line(text, needle):
    with pytest.raises(UsageError, match=needle) as e:
        tasks.parse_task_toml(text, "x/task.toml")
    assert "\n" not in str(e.value) and "x/task.toml" in str(e.value)


def test_fixture_tasks_load():
    found, skipped = tasks.find_tasks(FIXTURES)
    assert [t.name for t in found] == NAMES and skipped == []
    by_name = {t.name: t for t in found}
    # rlcli's older `network = true` still reads; a task that says nothing gets Harbor's default: public.
    assert by_name["network-allowed"].network.public and by_name["hello-file"].network.public
    assert by_name["hello-file"].limits == Limits(1.0, 256, 128)
    assert by_name["sum-numbers"].limits.memory_mb == 512
    assert by_name["hangs"].agent_timeout_s == 20  # a plain oracle run of the fixtures ends
    assert all(t.solution() is not None and t.has_dockerfile for t in found)
    single, _ = tasks.find_tasks(FIXTURES / "hello-file")
    assert [t.name for t in single] == ["hello-file"]


def test_broken_tasks_are_skipped_with_the_reason(tmp_path):
    copy_task(tmp_path / "set")
    no_tests = copy_task(tmp_path / "set", "sum-numbers")
    shutil.rmtree(no_tests / "tests")
    compose = copy_task(tmp_path / "set", "forgets-reward")
    (compose / "environment" / "Dockerfile").rename(compose / "environment" / "docker-compose.yaml")
    nested = tmp_path / "set" / "abc123"  # Harbor's downloads put each task under a hash folder
    copy_task(nested, "network-allowed")
    found, skipped = tasks.find_tasks(tmp_path / "set")
    assert sorted(t.name for t in found) == ["hello-file", "network-allowed"]
    reasons = " ".join(why for _, why in skipped)
    assert "no tests/test.sh" in reasons and "docker-compose tasks are not supported" in reasons
    with pytest.raises(UsageError, match="no Harbor task under"):
        tasks.find_tasks(tmp_path / "set" / "abc123" / "network-allowed" / "environment")


def test_select_and_split():
    found, _ = tasks.find_tasks(FIXTURES)
    assert [t.name for t in tasks.select_tasks(found, "he*,sum-*", None)] == ["hello-file", "sum-numbers"]
    assert [t.name for t in tasks.select_tasks(found, None, 2)] == NAMES[:2]
    with pytest.raises(UsageError, match="matches none"):
        tasks.select_tasks(found, "nothing*", None)
    train, held = tasks.split_tasks(found, 1)
    assert len(held) == 1 and held[0] not in train and len(train) == len(found) - 1
    assert tasks.split_tasks(list(reversed(found)), 1)[1] == held  # by name hash, not position
    with pytest.raises(UsageError, match="leaves no task"):
        tasks.split_tasks(found, len(found))


def test_image_tag_follows_the_build_context(tmp_path):
    task_dir = copy_task(tmp_path)
    load = lambda: tasks.load_task(task_dir)  # noqa: E731
    first = image_tag(load())
    assert first.startswith("rlcli-harbor/hello-file:") and image_tag(load()) == first
    assert image_tag(tasks.load_task(copy_task(tmp_path / "copy"))) == first  # same content, same image
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "RUN true\n")
    second = image_tag(load())
    assert second != first
    extra = task_dir / "environment" / "data.txt"
    extra.write_text("x")
    third = image_tag(load())
    assert third != second
    extra.chmod(0o755)
    fourth = image_tag(load())
    assert fourth != third
    (task_dir / "instruction.md").write_text("something else")  # not part of the image
    assert image_tag(load()) == fourth


@pytest.mark.parametrize("json_bytes, txt_bytes, reward, error", [
    (b'{"reward": 0.5, "passed": 2, "total": 4}', None, 0.5, None),  # "reward" is the reward, the rest details
    (b'{"passed": 0.25}', None, 0.25, None),  # one number: that one, whatever its name
    (b'{"a": 1, "b": 0}', None, 0.5, None),  # several, none named reward: their mean
    (None, b"1\n", 1.0, None),
    (None, b" 0.75 ", 0.75, None),
    (b'{"reward": 1}', b"0", 1.0, None),  # reward.json first, as Harbor 0.25 reads them
    (None, None, 0.0, "wrote no /logs/verifier/reward.json or reward.txt"),
    (None, b"PASSED", 0.0, "reward.txt is not a number"),
    (None, b"nan", 0.0, "not a finite number"),
    (None, b"", 0.0, "reward.txt is not a number"),
    (b"[1]", None, 0.0, "not an object of numbers"),
    (b'{"reward": true}', None, 0.0, "not an object of numbers"),
    (b'{"reward": 1, "note": "ok"}', None, 0.0, "not an object of numbers"),
    (b"{}", None, 0.0, "not an object of numbers"),
    (b"{oops", None, 0.0, "reward.json is not JSON"),
])
def test_parse_reward(json_bytes, txt_bytes, reward, error):
    from rlcli.harbor.verify import parse_reward, scalar_reward

    rewards, problem = parse_reward(json_bytes, txt_bytes)
    assert scalar_reward(rewards)[0] == reward
    assert (problem is None) if error is None else (error in problem)


def test_parse_reward_keeps_every_number():
    from rlcli.harbor.verify import parse_reward

    assert parse_reward(b'{"reward": 0.5, "passed": 2, "total": 4}', None)[0] == \
        {"reward": 0.5, "passed": 2.0, "total": 4.0}
    assert parse_reward(None, b"1")[0] == {"reward": 1.0}


def test_build_context_has_no_name_on_disk(tmp_path, monkeypatch):
    """The tarball docker-py would leave in $TMPDIR if rlcli died mid-upload never has a name there."""
    import tarfile
    import tempfile

    from rlcli.harbor.images import build_context

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    env = copy_task(tmp_path / "task", "sum-numbers") / "environment"
    (env / "data").mkdir()
    (env / "data" / "keep.txt").write_text("x")
    (env / "notes.log").write_text("not for the image")
    (env / ".dockerignore").write_text("# build-only files\n*.log\n")
    with build_context(env) as context:
        assert list((tmp_path / "tmp").iterdir()) == []  # while the context exists, as in the upload
        names = tarfile.open(fileobj=context).getnames()
    assert sorted(names) == [".dockerignore", "Dockerfile", "data", "data/keep.txt"]


def test_oracle_time_is_the_agent_phase_unless_bounded():
    from rlcli.harbor.agent import AgentSettings

    task = tasks.load_task(FIXTURES / "hangs")
    assert AgentSettings().solve_budget(task) == 20  # the task's [agent] timeout_sec
    assert AgentSettings(solve_timeout_s=3).solve_budget(task) == 3
    assert AgentSettings(solve_timeout_s=300, sandbox_timeout_s=60).solve_budget(task) == 60


def test_dataset_resolution_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLCLI_HARBOR_REGISTRY", "http://127.0.0.1:9/registry.json")  # refused at once
    with pytest.raises(UsageError) as e:
        tasks.resolve_dataset("terminal-bench@2.0")
    message = str(e.value)
    assert "\n" not in message
    assert "harbor datasets download terminal-bench@2.0 -o DIR" in message and "--dataset DIR" in message
    with pytest.raises(UsageError, match="no task folder at nowhere/tasks"):
        tasks.resolve_dataset("nowhere/tasks")
    assert tasks.resolve_dataset(str(FIXTURES)) == FIXTURES
    cached = tmp_path / "home" / "harbor" / "datasets" / "tiny@1.0"
    copy_task(cached)
    assert tasks.resolve_dataset("tiny@1.0") == cached  # the cache answers without the registry


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_dataset_download_through_a_registry(monkeypatch, tmp_path):
    """The online path, offline: a file:// registry whose task lives in a local git repository."""
    repo = tmp_path / "repo"
    copy_task(repo / "tasks")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "task"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps([{"name": "tiny", "version": "1.0", "tasks": [
        {"name": "hello", "git_url": str(repo), "git_commit_id": commit, "path": "tasks/hello-file"}]}]))
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RLCLI_HARBOR_REGISTRY", registry.as_uri())
    folder = tasks.resolve_dataset("tiny@1.0")
    assert (folder / "hello" / "tests" / "test.sh").is_file()
    assert [t.name for t in tasks.find_tasks(folder)[0]] == ["hello"]
    with pytest.raises(UsageError, match="versions of tiny: 1.0"):
        tasks.resolve_dataset("tiny@2.0")


def test_limits_mapping():
    options = run_options(Limits(cpus=0.5, memory_mb=512, pids=64), 900, online=False, host_cpus=2)
    assert options["nano_cpus"] == 500_000_000 and options["mem_limit"] == "512m" == options["memswap_limit"]
    assert options["pids_limit"] == 64 and options["network_mode"] == "none"
    # The image's ENTRYPOINT is kept (Harbor keeps it): only the command is set.
    assert "entrypoint" not in options and options["command"] == ["sleep", "900"]
    assert options["auto_remove"] and options["init"]
    wide = run_options(Limits(cpus=8), 60, online=True, host_cpus=2)
    assert wide["nano_cpus"] == 2_000_000_000 and wide["network_mode"] == "bridge"  # Docker refuses more than the host


def test_no_docker_daemon_is_one_line(monkeypatch):
    from rlcli.harbor.sandbox import connect

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(RlcliError) as e:
        connect()
    assert "\n" not in str(e.value) and "scripts/docker_up.sh" in str(e.value)


def test_tool_calls_and_text_protocol():
    from tinker_cookbook.renderers.base import ToolCall

    from rlcli.harbor.agent import parse_calls

    call = ToolCall(id="c1", function=ToolCall.FunctionBody(name="bash", arguments='{"command": "ls /"}'))
    wrong = ToolCall(function=ToolCall.FunctionBody(name="python", arguments="{}"))
    calls = parse_calls({"role": "assistant", "content": "", "tool_calls": [call, wrong]}, native=True)
    assert calls[0] == ("c1", "ls /", "") and calls[1][1] is None and "only tool is bash" in calls[1][2]
    text = {"role": "assistant", "content": "Let me look.\n```bash\ncat /root/nums.txt\n```\n"}
    assert parse_calls(text, native=False) == [(None, "cat /root/nums.txt", "")]
    assert parse_calls({"role": "assistant", "content": "Done."}, native=False) == []


def test_markdown_keeps_backticks_inside_blocks():
    from rlcli.harbor.agent import Record, to_markdown
    from rlcli.harbor.sandbox import ExecResult

    record = Record("t", "model", "do it", turns=[{"assistant": "ok", "commands": []}], stop="completed")
    record.add_command("echo '```'", ExecResult(0, "```\n", False, 0.1))
    markdown = to_markdown(record)
    assert "````bash\necho '```'\n````" in markdown and "## Verifier" in markdown


def fake_served(served: set[str]):
    return lambda url, timeout=10.0: ("fake", set(served))


def train_harbor(**options):
    from rlcli.harbor.train import HarborTrainOptions, train_harbor

    return train_harbor(HarborTrainOptions(**options))


def test_train_harbor_fails_fast_on_loss_before_the_dataset(monkeypatch):
    from rlcli.train import losses

    monkeypatch.setattr(losses, "served_losses", fake_served(losses.STOCK_JAX))
    with pytest.raises(UsageError, match="pass --dataset"):
        train_harbor(dataset=None)
    for kwargs, needle in [({"loss": "gspo", "passes": "1"}, "does not serve gspo fused"),
                           ({"loss": "dppo"}, "does not serve loss dppo"),
                           ({"loss": "cross_entropy"}, "--loss cross_entropy: choose from gspo")]:
        with pytest.raises(UsageError, match=needle):  # not the dataset's error: the loss is planned first
            train_harbor(dataset="missing@1.0", base_url="http://127.0.0.1:9", **kwargs)
    with pytest.raises(UsageError, match="--group-size must be at least 2"):
        train_harbor(dataset=str(FIXTURES), group_size=1)
    with pytest.raises(UsageError, match="--eval-dataset evaluates on others: pick one"):
        train_harbor(dataset=str(FIXTURES), eval_tasks=1, eval_dataset=str(FIXTURES))


def test_train_harbor_dry_run(monkeypatch, tmp_path, capsys):
    from rlcli.train import losses

    monkeypatch.setenv("RLCLI_HOME", str(tmp_path))
    monkeypatch.setattr(losses, "served_losses", fake_served(losses.STOCK_JAX))
    assert train_harbor(dataset=str(FIXTURES), model="Qwen/Qwen3-8B", base_url="http://127.0.0.1:9",
                        eval_tasks=1, dry_run=True) is None
    out = capsys.readouterr().out
    assert "loss: gspo 2-pass" in out and "6 to train on" in out and "1 held out" in out
    assert not (tmp_path / "runs").exists()  # a dry run makes nothing


def test_harbor_commands_import_nothing_heavy():
    """`rlcli train harbor --help` and `rlcli harbor run --help` load train.py and run.py: the cookbook,
    tinker, chz and docker must wait until a run needs them (agent.py, dataset.py, images.py, sandbox.py)."""
    code = ("import sys, rlcli.harbor.train, rlcli.harbor.run; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tinker', 'tinker_cookbook', 'chz', 'docker'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_daemon_gone_is_told_from_one_containers_failure(monkeypatch):
    import docker
    import requests

    from rlcli.harbor.daemon import DockerGone, SandboxError, gone_error, is_gone

    assert is_gone(requests.exceptions.ConnectionError("('Connection aborted.', ConnectionRefusedError(111))"))
    assert is_gone(docker.errors.DockerException("Error while fetching server API version: Connection refused"))
    assert not is_gone(docker.errors.APIError("409 Conflict: No such file or directory in the container"))
    assert not is_gone(SandboxError("sandbox abc died (exited, exit 137, killed for memory)"))
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/x.sock")
    error = gone_error(" (task t)")
    assert isinstance(error, DockerGone) and isinstance(error, SandboxError)
    assert str(error) == "the Docker daemon at unix:///run/x.sock stopped answering (task t)"


def test_the_watch_stops_the_run_when_the_daemon_stays_away(monkeypatch, tmp_path):
    import asyncio

    from rlcli.harbor.daemon import DockerGone, DockerWatch

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")  # nothing listens there
    watch = DockerWatch(0.5)
    with pytest.raises(DockerGone, match="did not come back within 0.5s"):
        asyncio.run(watch.check("t"))
    with pytest.raises(DockerGone):  # every later rollout stops too, without waiting again
        asyncio.run(watch.check("u"))


def test_train_harbor_stops_after_the_step_in_which_docker_was_lost(monkeypatch, tmp_path):
    """The cookbook trains on without a rollout that raised: the line after that step raises the verdict."""
    import asyncio
    import io

    from rlcli.harbor import daemon
    from rlcli.harbor.train import HarborProgress

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    monkeypatch.setattr(daemon, "LOST", [])
    progress = HarborProgress(2, "gspo", 1, stream=io.StringIO())
    progress.log_metrics({"progress/batch": 0}, step=0)  # Docker answered (or was never asked): goes on
    with pytest.raises(daemon.DockerGone):
        asyncio.run(daemon.DockerWatch(0.2).check("t"))  # the rollout's failure: swallowed by the cookbook
    with pytest.raises(daemon.DockerGone, match="did not come back within 0.2s"):
        progress.log_metrics({"progress/batch": 1}, step=1)
    assert "step 2/2" in progress.stream.getvalue()  # the step's line is printed first


def test_a_sandbox_removed_between_list_and_inspect_is_skipped():
    """A daemon just back from an outage removes its auto-remove containers while a finished run sweeps its own:
    one listed and gone before the docker SDK inspects it used to end the run with a 404 (No such container).
    The real SDK collection runs here over a stand-in of the daemon's HTTP API."""
    import docker
    from docker.models.containers import ContainerCollection

    from rlcli.harbor import sandbox

    owner = f"{sandbox.OWNER}={sandbox.owner_id()}"

    class Api:
        removed: list[str] = []

        def containers(self, all=False, filters=None, **_):
            assert all and filters == {"label": owner}, filters
            return [{"Id": i} for i in ("gone", "here") if i not in self.removed]

        def inspect_container(self, container_id):
            if container_id == "gone":
                raise docker.errors.NotFound("No such container: gone")
            return {"Id": container_id, "Config": {"Labels": {}}}

        def remove_container(self, container_id, **_):
            self.removed.append(container_id)

    class Client:
        api = Api()

    Client.containers = ContainerCollection(client=Client)
    assert sandbox.remove_mine(Client) == 1 and Api.removed == ["here"]


def test_an_unawaited_rollout_lost_to_docker_prints_no_traceback(caplog):
    """The cookbook stops waiting for a rollout it retried; when that task later ends with DockerGone the run's one
    line already says so, and asyncio's "never retrieved" traceback is dropped. Any other exception still shows."""
    import asyncio
    import gc

    from rlcli.harbor.daemon import DockerGone, quiet_lost_rollouts

    async def fail(error: Exception) -> None:
        raise error

    async def main() -> None:
        quiet_lost_rollouts()
        quiet_lost_rollouts()  # once per loop, however often a pool opens a sandbox
        for error in (DockerGone("the Docker daemon at unix:///x stopped answering"), ValueError("a real bug")):
            task = asyncio.get_running_loop().create_task(fail(error))
            await asyncio.sleep(0)
            del task
            gc.collect()

    with caplog.at_level("ERROR", logger="asyncio"):
        asyncio.run(main())
    reported = [r.getMessage() + repr(getattr(r, "exc_info", None)) for r in caplog.records]
    assert len(reported) == 1 and "a real bug" in reported[0], reported


def fake_daemon(states: list[list[str]], refuse: int = 0):
    """A client over the real SDK collection whose daemon lists states[k] at the k-th ask (the last one after)
    and refuses the first `refuse` removals with 409, as a daemon does while removing a container itself."""
    import docker
    from docker.models.containers import ContainerCollection

    class Api:
        asks, removals = 0, []

        def containers(self, **_):
            Api.asks += 1
            return [{"Id": i} for i in states[min(Api.asks, len(states)) - 1]]

        def inspect_container(self, container_id):
            return {"Id": container_id, "Config": {"Labels": {}}}

        def remove_container(self, container_id, **_):
            Api.removals.append(container_id)
            if len(Api.removals) <= refuse:
                response = type("R", (), {"status_code": 409, "reason": "Conflict"})()
                raise docker.errors.APIError("removal of container is already in progress", response)

    class Client:
        api = Api()

    Client.containers = ContainerCollection(client=Client)
    return Client, Api


def test_sandboxes_the_daemon_is_still_removing_are_asked_for_until_gone(capsys):
    """A daemon back from an outage removes the killed one's containers itself and refuses a second removal
    (409) meanwhile: the run's last sweep asks again until none of its own is left."""
    from rlcli.harbor import sandbox

    client, api = fake_daemon([["a1", "b2"], ["a1"], []], refuse=2)
    assert sandbox.remove_mine(client) == 2
    assert api.asks == 3 and api.removals == ["a1", "b2", "a1"]
    assert capsys.readouterr().err == ""


def test_a_sandbox_that_cannot_be_removed_is_named(capsys):
    from rlcli.harbor import sandbox

    client, api = fake_daemon([["stuck1234567"]], refuse=1000)
    assert sandbox.remove_mine(client, settle_s=1.0) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "could not be removed within 1s" in err and "docker rm -f stuck123456" in err, err
    assert api.asks >= 2


class _Stream:
    """An exec's output stream whose connection breaks after one chunk."""

    def __init__(self, error: Exception):
        self.error = error

    def __iter__(self):
        yield b"42\n", None
        raise self.error


def broken_exec_sandbox(error: Exception, after: str):
    """A Sandbox whose command's stream breaks with `error`; asked afterwards, the daemon says `after`:
    "running" (the container is there), "gone" (404) or "down" (no answer)."""
    import docker
    import requests

    from rlcli.harbor.sandbox import Sandbox

    class Api:
        def exec_create(self, *_, **__):
            return {"Id": "e1"}

        def exec_start(self, *_, **__):
            return _Stream(error)

    class Container:
        id, short_id, attrs = "c" * 64, "cccccccccccc", {"State": {"Status": "running"}}
        client = type("Client", (), {"api": Api()})()
        asks = 0

        def reload(self):
            Container.asks += 1
            if Container.asks > 1 and after == "gone":
                raise docker.errors.NotFound("No such container")
            if Container.asks > 1 and after == "down":
                raise requests.exceptions.ConnectionError("('Connection aborted.', ConnectionRefusedError(111))")

    return Sandbox(Container(), "sh", True, "/root")


def test_a_command_cut_by_a_daemon_restart_is_told_as_a_restart(monkeypatch):
    """The daemon drops a command's connection: away still -> DockerGone; already back without the container ->
    DockerRestarted (a kind of DockerGone, so the run says so and goes on); back with it -> this rollout's own
    failure. Where the stream broke for another reason, a vanished container is just gone."""
    import requests
    import urllib3

    from rlcli.harbor.daemon import DockerGone, DockerRestarted, SandboxError

    monkeypatch.setenv("DOCKER_HOST", "unix:///run/x.sock")
    dropped = urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(0 bytes read)")
    with pytest.raises(DockerRestarted, match="at unix:///run/x.sock dropped a command in sandbox cccccccccccc"):
        broken_exec_sandbox(dropped, "gone").exec("sleep 10", 30)
    with pytest.raises(DockerGone) as down:
        broken_exec_sandbox(requests.exceptions.ChunkedEncodingError("x"), "down").exec("sleep 10", 30)
    assert not isinstance(down.value, DockerRestarted), down.value
    with pytest.raises(SandboxError, match="connection to the Docker daemon broke") as blip:
        broken_exec_sandbox(dropped, "running").exec("sleep 10", 30)
    assert not isinstance(blip.value, DockerGone)
    with pytest.raises(SandboxError, match="is gone") as removed:
        broken_exec_sandbox(ValueError("not a connection error"), "gone").exec("sleep 10", 30)
    assert not isinstance(removed.value, DockerGone)


def test_the_watch_says_once_that_the_daemon_restarted(monkeypatch, capsys):
    import asyncio

    from rlcli.harbor import daemon

    monkeypatch.setattr(daemon, "daemon_answers", lambda *a: True)
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/x.sock")
    watch = daemon.DockerWatch(5)

    async def rollouts() -> None:  # a group of rollouts, all cut by one restart, and one ordinary failure
        await asyncio.gather(*(watch.check(f"t{i}", daemon.restarted_error(f"s{i}")) for i in range(3)))
        await watch.check("u", daemon.SandboxError("sandbox s9 died (exited, exit 1)"))

    asyncio.run(rollouts())
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "restarted during the rollout of t0" in err and "answers again" in err, err
