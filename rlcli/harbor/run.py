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
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from rlcli.config import ensure_api_key, private_dir, resolve_base_url
from rlcli.errors import EXIT_FAILED, RlcliError
from rlcli.harbor.daemon import DEFAULT_DOCKER_TIMEOUT_S
from rlcli.harbor.options import COMMAND_TIMEOUT_S, HarborOptions
from rlcli.harbor.summary import summary_table
from rlcli.harbor.tasks import Task, load_tasks
from rlcli.options import BASE_URL, CHECKPOINT, MAX_TOKENS, MODEL, RENDERER, TEMPERATURE, option
from rlcli.train import run as trainer
from rlcli.train.folder import run_folder

Policy = Literal["oracle", "nop", "model"]


@dataclass(frozen=True, kw_only=True)
class HarborRunOptions(HarborOptions):
    """`rlcli harbor run`'s options."""

    task_dir: str = option(help="a task folder, a folder of them, or NAME@VERSION (a dataset in the cache or "
                                "Harbor's registry)", positional=True)
    policy: Policy = option("oracle", "oracle (the task's solution/solve.sh), nop (nothing), or model (the server's "
                                      "model, or --checkpoint, as the agent)")
    model: str | None = MODEL(None)
    checkpoint: str | None = CHECKPOINT(None)
    base_url: str | None = BASE_URL(None)
    renderer: str | None = RENDERER(None)
    max_tokens: int = MAX_TOKENS(1024)
    temperature: float = TEMPERATURE(1.0)
    rollouts: int = option(1, "rollouts per task (k of pass@k)", low=1)
    output: str | None = option(None, "folder for results.jsonl and trajectories (default: "
                                      "RLCLI_HOME/runs/harbor-run-<time>)", short="-o")

    def problems(self) -> Iterator[str]:
        if self.policy != "model" and (self.model or self.checkpoint):
            yield f"--model and --checkpoint choose the agent of --policy model, not {self.policy}"


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
              else service.create_sampling_client(base_model=model)).result()
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


def run(o: HarborRunOptions) -> int:
    """Run Harbor tasks in local Docker and grade them with their tests, without training."""
    from rlcli.harbor.agent import AgentSettings
    from rlcli.harbor.daemon import DockerGone
    from rlcli.harbor.sandbox import prepare_images, remove_mine

    skipped: list[tuple[str, str]] = []
    tasks = load_tasks(o.task_dir, o.task_filter, o.limit, "harbor run", o.network, skipped)
    folder = run_folder(o.output, False, kind="harbor-run")
    sampler = sampling_policy(o.model, o.checkpoint, o.base_url, o.renderer, o.max_tokens, o.temperature) \
        if o.policy == "model" else None
    settings = AgentSettings(o.max_turns, o.command_timeout or COMMAND_TIMEOUT_S, o.sandbox_timeout,
                             solve_timeout_s=o.command_timeout, reward_key=o.reward_key)
    client, unbuilt = prepare_images(tasks)
    runnable = [t for t in tasks if t.name not in unbuilt]
    private_dir(folder)  # the trajectories: the model's answers and the tasks' output
    try:
        with trainer.sigterm_as_interrupt():
            records = asyncio.run(run_all(runnable, o.policy, client, settings, folder, o.max_sandboxes, sampler,
                                          o.rollouts, o.docker_timeout)) if runnable else []
    except DockerGone as e:  # the rollouts in flight wrote their records with the reason; the run stops
        raise RlcliError(f"{e}: start it again (containers of this run are removed by the daemon as it starts), "
                         f"then rerun; trajectories so far are in {folder}") from None
    finally:
        remove_mine(client)  # after Ctrl-C, whatever the rollouts could not remove themselves
    with open(folder / "results.jsonl", "w") as f:
        for n, record in enumerate(records):
            row = {k: v for k, v in asdict(record).items() if k not in ("turns", "instruction", "verifier_output")}
            stem = record.task.replace("/", "_") + (f"-{n % o.rollouts}" if o.rollouts > 1 else "")
            f.write(json.dumps({**row, "trajectory": str(folder / f"{stem}.md")}) + "\n")
    print(summary_table(tasks, records, unbuilt, skipped, o.rollouts), file=sys.stderr)
    failed = sum(1 for r in records if r.error) + len(unbuilt)
    print(f"results: {folder / 'results.jsonl'}", file=sys.stderr)
    return EXIT_FAILED if failed or not records else 0
