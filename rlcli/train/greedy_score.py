"""`train rl --greedy-score`: the run's held-out problems answered greedily by its start weights before the first
step and by its final weights after the last, printed as one line of the final report.

The same problems, graded the same way as `rlcli eval --temperature 0` does (rlcli.problems.score), but inside the
run: the final weights are still loaded, and no second process imports the training stack. `make demo` shows what
its RL stage changed this way (docs/decisions.md, "make demo's RL").
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rlcli.errors import UsageError
from rlcli.train.folder import last_checkpoint

RESULT = "greedy_scores.json"  # in the run folder: {"start", "final", "problems"}, correct shares


def start_weights(load_checkpoint: str | None) -> str | None:
    """The sampler path of the weights a run starts from: None for a fresh LoRA (the base model answers), else the
    sampler weights saved beside a run folder's newest state."""
    if not load_checkpoint:
        return None
    folder = Path(load_checkpoint).expanduser()
    row = last_checkpoint(folder, "state_path") if not load_checkpoint.startswith("tinker://") else None
    if not row or not row.get("sampler_path"):
        raise UsageError(f"--greedy-score with --load-checkpoint {load_checkpoint}: the start weights are scored from "
                         "the sampler weights a run folder saved with its newest state; pass that run folder")
    return row["sampler_path"]


def correct_share(url: str, source: str | None, model: str, renderer: str, data: Any, max_tokens: int) -> float:
    """The share of `data`'s held-out problems that `source` (a sampler path; None: the base model) answers right,
    greedily."""
    import asyncio

    from tinker_cookbook.completers import TinkerTokenCompleter

    from rlcli import sample
    from rlcli.problems import envs, score
    from rlcli.train.metrics import TEST_CORRECT

    s = sample.open_sampler(source, None if source else model, url, None, max_tokens, 0.0, 0)  # weights know theirs
    try:
        _, test = asyncio.run(envs.dataset_builder(data, model, renderer, 1, 1)())
        problems = score.problems_of(test)
        policy = TinkerTokenCompleter(s.client, max_tokens=max_tokens, temperature=0.0)
        return score.means(problems, score.answer(problems, policy)).get(TEST_CORRECT, 0.0)
    finally:
        sample.close(s)


@contextlib.contextmanager
def scoring(recipe: AbstractContextManager[Callable[[], Any]], folder: Path, url: str, start: str | None, model: str,
            renderer: str, data: Any, max_tokens: int) -> Iterator[Callable[[], Any]]:
    """The recipe's run between a greedy score of the start weights and one of the final weights (while they are
    still loaded), both recorded in the run folder."""
    with recipe as train:
        def run() -> Any:
            before = correct_share(url, start, model, renderer, data, max_tokens)
            result = train()
            final = last_checkpoint(folder, "sampler_path")
            after = correct_share(url, final["sampler_path"], model, renderer, data, max_tokens) if final else None
            (folder / RESULT).write_text(json.dumps({"start": before, "final": after, "problems": data.held_out})
                                         + "\n")
            return result
        yield run


def report_line(folder: Path) -> str | None:
    """'held-out greedy 5/18 -> 8/18 ...' when the run scored itself, else None."""
    path = folder / RESULT
    if not path.exists():
        return None
    found = json.loads(path.read_text())
    n = found["problems"]

    def share(value: float | None) -> str:
        return "-" if value is None else f"{round(value * n)}/{n}"

    return (f"held-out greedy {share(found['start'])} -> {share(found['final'])} (start -> final weights, "
            f"temperature 0, {n} problems never trained on)")
