"""The loop's model stages: train the candidate from the champion, promote (export, alias, hook). Evaluating
both models is rlcli.loop.evaluation; the gate's arithmetic rlcli.loop.gate.

Each trainer is called as a library function (rlcli.train.sl/rl/distill/dpo) on a record of its options that
`stage_options` makes from loop.toml's settings, in this process, with a run folder of its own under
iterations/N/; it returns the weights it made. A killed `loop run` finds that folder's rlcli-run.json and
calls the trainer again with resume=True (the trainer's own --resume). A stage is recorded in the ledger only
once it is whole.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlcli.errors import RlcliError
from rlcli.loop import champion, data
from rlcli.loop.ledger import Champion, Ledger
from rlcli.loop.settings import LoopSettings, stages
from rlcli.options import Record
from rlcli.train import folder as runs
from rlcli.train.run import Weights

CHAMPION_DIR, CHAMPION_FILE = champion.CHAMPION_DIR, champion.CHAMPION_FILE
PAIRS = data.PAIRS  # an iteration's preference pairs (rlcli.train.dpo's shape), written by its ingest


def say(message: str) -> None:
    print(f"rlcli loop: {message}", file=sys.stderr, flush=True)


def _run_folder(path: Path) -> bool:
    """Whether the trainer should resume (it recorded its run) or start afresh (nothing of it survived)."""
    if (path / runs.RUN_INFO).is_file():
        return True
    if path.exists():
        shutil.rmtree(path)  # the lock file, or nothing: a kill before the run was recorded
    return False


def stage(kind: str, folder: Path, dataset: Path, start: str | None, teacher: Champion, s: LoopSettings, url: str,
          resume: bool) -> tuple[Callable[[Any], Weights | None], Record]:
    """A stage's trainer and its options, from `start` (a training state; None: a fresh LoRA on the base model)."""
    from rlcli.train.options import RL_LR

    common = dict(base_url=url, log_path=str(folder), resume=resume, seed=s.seed, save_every=s.save_every,
                  max_steps=s.steps, lora_rank=s.lora_rank, eval_every=0, load_checkpoint=start,
                  server_timeout=s.server_timeout)
    if kind == "sft":
        from rlcli.train.sl import SlOptions, train_sl

        n = len(data.read_jsonl(dataset))
        batch = min(s.batch_size, n)
        return train_sl, SlOptions(dataset=str(dataset), batch_size=batch, lr=s.lr or None,
                                   epochs=math.ceil(s.steps / max(n // batch, 1)), **common)
    if kind == "rl":
        from rlcli.train.rl import RlOptions, train_rl

        return train_rl, RlOptions(env="replay", dataset=str(dataset), match=s.match, reward=s.reward,
                                   batch_size=s.batch_size,
                                   group_size=s.group_size, max_tokens=s.max_tokens, lr=s.lr or RL_LR, **common)
    if kind == "dpo":
        from rlcli.train.dpo import LR_SHARE, DpoOptions, train_dpo

        n = len(data.read_jsonl(dataset))
        batch = min(s.batch_size, n)
        return train_dpo, DpoOptions(dataset=str(dataset), batch_size=batch, beta=s.dpo_beta,
                                     lr=s.dpo_lr or s.lr * LR_SHARE or None,
                                     epochs=math.ceil(s.steps / max(n // batch, 1)), **common)
    from rlcli.train.distill import DistillOptions, train_distill

    return train_distill, DistillOptions(prompts=str(dataset), teacher=teacher.state_path or "base",
                                         batch_size=s.batch_size, group_size=s.group_size, max_tokens=s.max_tokens,
                                         lr=s.distill_lr or s.lr or RL_LR,
                                         **common | {"max_steps": s.distill_steps or s.steps})


def train(folder: Path, ledger: Ledger, n: int, s: LoopSettings, champion: Champion, url: str) -> None:
    """Each configured stage in turn, the next starting from the last one's state; sft and rl learn this
    iteration's train data (with train_on all, the earlier iterations' too: a replay against forgetting),
    distill recovers the champion's behaviour on earlier iterations' data, dpo learns the preference pairs."""
    where = data.iteration_dir(folder, n)
    new = where / "train.jsonl"
    if s.train_on == "all" or s.shuffle_answers:
        rows = data.read_jsonl(new)
        if s.train_on == "all":
            rows = data.replay_mix(rows, data.all_rows(folder, ledger, "train.jsonl", n - 1), s.replay, s.seed + n)
        new = where / ("train.shuffled.jsonl" if s.shuffle_answers else "train-all.jsonl")
        data.write_jsonl(new, data.shuffled_answers(rows, s.seed) if s.shuffle_answers else rows)
    start = champion.state_path
    for i, kind in enumerate(stages(s)):
        name = f"train:{i}:{kind}"
        if (done := ledger.stage(n, name)) is not None:
            start = done.get("state_path") or start
            continue
        dataset = new
        if kind == "sft" and (bad := sum(map(data.rated_bad, rows := data.read_jsonl(new)))):
            dataset = where / "sft-rows.jsonl"
            data.write_jsonl(dataset, [r for r in rows if not data.rated_bad(r)])
            say(f"iteration {n}: sft leaves out {bad} conversations rated bad (the rl stage's verdict uses them)")
        if kind == "dpo":
            dataset, found = where / "dpo-pairs.jsonl", pairs(folder, ledger, n, s)
            if not found:
                skip(ledger, n, name, f"dpo skipped (no preference pairs in {where / PAIRS}): the weights pass "
                                      "through unchanged")
                continue
            data.write_jsonl(dataset, found)
        if kind == "distill":
            dataset = where / "distill-prompts.jsonl"
            earlier = data.all_rows(folder, ledger, "train.jsonl", n - 1)
            if not earlier:
                skip(ledger, n, name, f"{kind} skipped (no earlier data to recover)")
                continue
            data.write_jsonl(dataset, earlier)
        run_dir = where / f"run-{i}-{kind}"
        say(f"iteration {n}: {kind} from {champion.label() if i == 0 else 'the previous stage'} -> {run_dir}")
        trainer, options = stage(kind, run_dir, dataset, start, champion, s, url, _run_folder(run_dir))
        made = trainer(options)
        if made is None or not made.state_path or not made.sampler_path:
            raise RlcliError(f"{run_dir} finished without final weights: rerun `rlcli loop run` to retry it")
        start = made.state_path
        with ledger.transaction() as db:
            db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?)",
                       (n, i, kind, str(run_dir), made.state_path, made.sampler_path))
            ledger.done(db, n, name, {"state_path": made.state_path, "sampler_path": made.sampler_path})


def skip(ledger: Ledger, n: int, name: str, why: str) -> None:
    """A stage with nothing to train on: recorded as done, with why, and said in one line."""
    with ledger.transaction() as db:
        ledger.done(db, n, name, {"skipped": why})
    say(f"iteration {n}: {why}")


def pairs(folder: Path, ledger: Ledger, n: int, s: LoopSettings) -> list[dict[str, Any]]:
    """The dpo stage's preference pairs: this iteration's PAIRS (with train_on all, every earlier iteration's too,
    oldest first), each file checked by the trainer's reader (a line that is no pair stops the stage with one line
    naming its file and line; the trainer drops pairs repeated across files)."""
    from rlcli.train.dpo import read_pairs

    upto = [it["n"] for it in ledger.iterations() if it["n"] <= n and ledger.stage(it["n"], "split") is not None]
    files = [data.iteration_dir(folder, i) / PAIRS for i in (upto if s.train_on == "all" else [n])]
    return [pair for path in files if path.is_file() for pair in read_pairs(str(path), required=False).records]


def candidate(ledger: Ledger, n: int, unchanged: Champion | None = None) -> Champion | None:
    """The last trained stage's weights, once every train stage is done; where every stage was skipped, the weights
    it started from (`unchanged`, the champion: the gate then sees no change)."""
    trained = ledger.runs(n)
    if trained:
        return Champion(n, trained[-1]["sampler_path"], trained[-1]["state_path"])
    return None if unchanged is None else Champion(n, unchanged.sampler_path, unchanged.state_path)


def move_to(folder: Path, ledger: Ledger, champ: Champion, s: LoopSettings, url: str, reason: str,
            n: int | None = None) -> None:
    """Export first (a folder of its own), then move the alias (and record the promote stage) in one transaction,
    then switch DIR/champion to the export in one rename, then the hook: a kill before the transaction leaves the
    old champion everywhere; after it, the next loop command finishes the switch and the hook (champion.sync)."""
    say(f"exporting {champ.label()} to {folder / CHAMPION_DIR}")
    target = champion.export(folder, champ, s, url)
    say(f"moving the champion alias to {champ.label()} ({target.relative_to(folder)} is whole)")
    with ledger.transaction() as db:
        ledger.move_alias(db, champ, reason)
        if n is not None and ledger.stage(n, "promote") is None:
            ledger.done(db, n, "promote", {"sampler_path": champ.sampler_path})
    champion.point(folder, target)
    say(f"champion -> {champ.label()} (exported to {folder / CHAMPION_DIR})")
    champion.hook(folder, ledger, s, champ)
