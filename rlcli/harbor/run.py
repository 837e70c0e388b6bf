"""`rlcli harbor run`: run and grade Harbor tasks in local Docker, without training.

Launch:  rlcli harbor run tests/fixtures/harbor --policy oracle      (each task's solution: checks the tasks)
         rlcli harbor run tests/fixtures/harbor/hello-file --policy nop   (do nothing: should score 0)
         rlcli harbor run tests/fixtures/harbor/hangs --policy oracle --command-timeout 3   (killed at 3 s)
         rlcli harbor run ~/tb2 --policy model --checkpoint tinker://RUN/sampler_weights/final --max-turns 30
         rlcli harbor run ~/tb2 --policy oracle --network none --reward-key passed   (offline; one reward key)

Policies: oracle runs solution/solve.sh, nop runs nothing, model lets the server's model (or --checkpoint)
act through the bash tool exactly as in `rlcli train harbor`. Tasks run concurrently (--max-sandboxes),
--rollouts times each. Writes <output>/results.jsonl (one line per rollout) and <output>/<task>.md/.json
(the trajectory), and ends with a table: per task its network, image, mean reward, pass@k, time, and why
for anything skipped or failed.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from rlcli.config import ensure_api_key, resolve_base_url
from rlcli.errors import EXIT_FAILED, RlcliError, UsageError
from rlcli.harbor.daemon import DEFAULT_DOCKER_TIMEOUT_S
from rlcli.harbor.summary import summary_table
from rlcli.harbor.tasks import NetworkChoice, Task, load_tasks
from rlcli.train import run as trainer
from rlcli.train.folder import run_folder

Policy = Literal["oracle", "nop", "model"]
DEFAULT_COMMAND_TIMEOUT_S = 120.0


def status_of(record: Any) -> str:
    if record.error:
        return f"error: {record.error}"
    if record.grading_error:
        return f"grading error: {record.grading_error}"
    return "passed" if record.reward >= 1.0 else "partial" if record.reward > 0 else "failed"


def sampling_policy(model: str | None, checkpoint: str | None, base_url: str | None, renderer: str | None,
                    max_tokens: int, temperature: float) -> tuple[Any, Any]:
    """(token completer, renderer) for --policy model: the server's base model, or a sampler checkpoint."""
    import tinker
    from tinker_cookbook.completers import TinkerTokenCompleter
    from tinker_cookbook.renderers import get_renderer
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    url = resolve_base_url(base_url)
    model = trainer.resolve_model(model, url, required=True)
    name = trainer.prepare_model(model, renderer)
    ensure_api_key()
    service = tinker.ServiceClient(base_url=url)
    client = (service.create_sampling_client(model_path=checkpoint) if checkpoint
              else service.create_sampling_client(base_model=model))
    return TinkerTokenCompleter(client, max_tokens=max_tokens, temperature=temperature), \
        get_renderer(name, get_tokenizer(model))


async def run_all(tasks: list[Task], policy: str, client: Any, settings: Any, folder: Path, max_sandboxes: int,
                  sampler: tuple[Any, Any] | None, rollouts: int = 1,
                  docker_timeout: float = DEFAULT_DOCKER_TIMEOUT_S) -> list[Any]:
    from tinker_cookbook.rl.rollouts import do_single_rollout

    from rlcli.harbor.agent import HarborEnv, run_scripted
    from rlcli.harbor.daemon import DockerWatch
    from rlcli.harbor.sandbox import SandboxPool

    watch = DockerWatch(docker_timeout)
    pool = SandboxPool(client, max_sandboxes, on_gone=watch.check)

    async def one(task: Task, i: int) -> Any:
        stem = folder / (task.name.replace("/", "_") + (f"-{i}" if rollouts > 1 else ""))
        if sampler is None:
            record = await run_scripted(task, policy, pool, settings, stem)
        else:
            env = HarborEnv(task, sampler[1], settings, pool, stem, policy="model")
            try:
                await do_single_rollout(sampler[0], env)
            except Exception as e:  # this task's rollout failed: say so in its record, go on with the others
                env.record.error = env.record.error or f"{type(e).__name__}: {e}"
            finally:
                await env.close()
            record = env.record
        print(f"{task.name:<32} reward {record.reward:.3f}  {status_of(record)}  {record.seconds:.1f}s", flush=True)
        if record.error:
            await watch.check(task.name)
        return record

    return list(await asyncio.gather(*(one(t, i) for t in tasks for i in range(rollouts))))


def run(task_dir: str, policy: Policy = "oracle", task_filter: str | None = None, limit: int | None = None,
        model: str | None = None, checkpoint: str | None = None, base_url: str | None = None,
        renderer: str | None = None, max_turns: int = 10, max_tokens: int = 1024, temperature: float = 1.0,
        command_timeout: float | None = None, sandbox_timeout: float | None = None, max_sandboxes: int = 4,
        rollouts: int = 1, network: NetworkChoice = "task", reward_key: str | None = None,
        output: str | None = None, docker_timeout: float = DEFAULT_DOCKER_TIMEOUT_S) -> int:
    """Run Harbor tasks in local Docker and grade them with their tests, without training.

    Args:
        task_dir: a task folder, a folder of them, or NAME@VERSION (a dataset in the cache or Harbor's registry)
        policy: oracle (the task's solution/solve.sh), nop (nothing), or model (the server's model as the agent)
        task_filter: only tasks whose names match these comma-separated globs
        limit: only the first N tasks (by name) after --task-filter
        model: with --policy model: the server's base model (default: ask the server)
        checkpoint: with --policy model: sample from this sampler checkpoint (tinker://...) instead
        base_url: server URL (default: TINKER_BASE_URL, else the managed server)
        renderer: chat renderer (default: from the model name, or the tokenizer of a local folder)
        max_turns: most assistant turns per task
        max_tokens: most sampled tokens per turn
        temperature: sampling temperature
        command_timeout: seconds one command may run before it is killed inside the container (default: 120
            for the model's commands; the oracle's solve.sh gets the agent's whole time)
        sandbox_timeout: seconds the agent phase may take (default: the task's [agent] timeout_sec)
        max_sandboxes: containers alive at once
        rollouts: rollouts per task (k of pass@k)
        network: task (each phase as task.toml says; Harbor's default is the public network) or none (no network
            for any task, in any phase)
        reward_key: the reward.json key that is the reward (default: "reward" if present, else the mean of the keys)
        output: folder for results.jsonl and trajectories (default: RLCLI_HOME/runs/harbor-run-<time>)
        docker_timeout: seconds to wait for a Docker daemon that stopped answering mid-run before stopping the run
            (the rollouts in flight fail with that reason either way)
    """
    from rlcli.harbor.agent import AgentSettings
    from rlcli.harbor.daemon import DockerGone
    from rlcli.harbor.sandbox import prepare_images, remove_mine
    if policy != "model" and (model or checkpoint):
        raise UsageError(f"--model and --checkpoint choose the agent of --policy model, not {policy}")
    trainer.check_numbers(max_turns=max_turns, max_tokens=max_tokens, temperature=temperature, limit=limit,
                  command_timeout=command_timeout, sandbox_timeout=sandbox_timeout, max_sandboxes=max_sandboxes,
                  rollouts=rollouts, docker_timeout=docker_timeout)
    skipped: list[tuple[str, str]] = []
    tasks = load_tasks(task_dir, task_filter, limit, "harbor run", network, skipped)
    folder = run_folder(output, False, kind="harbor-run")
    sampler = sampling_policy(model, checkpoint, base_url, renderer, max_tokens, temperature) \
        if policy == "model" else None
    settings = AgentSettings(max_turns, command_timeout or DEFAULT_COMMAND_TIMEOUT_S, sandbox_timeout,
                             solve_timeout_s=command_timeout, reward_key=reward_key)
    client, unbuilt = prepare_images(tasks)
    runnable = [t for t in tasks if t.name not in unbuilt]
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with trainer.sigterm_as_interrupt():
            records = asyncio.run(run_all(runnable, policy, client, settings, folder, max_sandboxes, sampler,
                                          rollouts, docker_timeout)) if runnable else []
    except DockerGone as e:  # the rollouts in flight wrote their records with the reason; the run stops
        raise RlcliError(f"{e}: start it again (containers of this run are removed by the daemon as it starts), "
                         f"then rerun; trajectories so far are in {folder}") from None
    finally:
        remove_mine(client)  # after Ctrl-C, whatever the rollouts could not remove themselves
    with open(folder / "results.jsonl", "w") as f:
        for n, record in enumerate(records):
            row = {k: v for k, v in asdict(record).items() if k not in ("turns", "instruction", "verifier_output")}
            stem = record.task.replace("/", "_") + (f"-{n % rollouts}" if rollouts > 1 else "")
            f.write(json.dumps({**row, "trajectory": str(folder / f"{stem}.md")}) + "\n")
    print(summary_table(tasks, records, unbuilt, skipped, rollouts), file=sys.stderr)
    failed = sum(1 for r in records if r.error) + len(unbuilt)
    print(f"results: {folder / 'results.jsonl'}", file=sys.stderr)
    return EXIT_FAILED if failed or not records else 0
