"""`rlcli train dpo`: Direct Preference Optimization on preference pairs, with tinker-cookbook's DPO recipe.

Launch:  rlcli train dpo --dataset pairs.jsonl                          (the managed server's model)
         rlcli train dpo --dataset pairs.jsonl --load-checkpoint runs/sl-1 --beta 0.1 --max-steps 20
         cat pairs.jsonl | rlcli train dpo --dataset - --dry-run          (check the pairs, print the plan)

Each line is one pair: {"messages": [the prompt: system/user/assistant turns, ending with a user turn],
"chosen": {"role": "assistant", "content": ...}, "rejected": {"role": "assistant", "content": ...}}. A line that is
no pair stops the run with one line naming it; a pair whose two answers are the same, or that repeats an earlier
one, is dropped and counted. The reference model is the starting weights (the base model, or --load-checkpoint's),
as in the cookbook. The recipe (tinker_cookbook.preference.train_dpo) writes config.json, metrics.jsonl (dpo_loss,
accuracy, margin, chosen_reward, rejected_reward per step) and checkpoints.jsonl into the run folder,
RLCLI_HOME/runs/dpo-<time> unless --log-path says otherwise. Its loss goes through tinker's
forward_backward_custom, on the route SkyRL's jax backend applies exactly (rlcli.train.custom_loss).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from rlcli.config import resolve_base_url
from rlcli.data.validate import messages_problem, numbered_json_lines
from rlcli.errors import UsageError
from rlcli.options import option
from rlcli.train import metrics, renderers, run
from rlcli.train.folder import last_checkpoint, private_copy, read_jsonl
from rlcli.train.options import BATCH, BATCH_SIZE, BETA, EPOCHS, LOAD_CHECKPOINT, LR, MAX_LENGTH, TrainOptions, kept

RECIPE_NAME = "rlcli_train_dpo"
RENDER_CHECK = 32  # pairs rendered before a real run; --dry-run renders all
RESUME_KEYS = ("model", "batch_size", "renderer", "seed", "load_checkpoint", "beta")
LR_SHARE = 0.1  # of train sl's default rate (run.default_lr): 5e-4 on the embedded model, measured (docs/train.md)
TINKER_BACKCOMPAT = r"tinker\.lib\.public_interfaces\.backcompat"  # where tinker warns of the future-as-client
SHAPE = '{"messages": [..., a user turn], "chosen": {"role": "assistant", ...}, "rejected": {...}}'


@dataclass(frozen=True, kw_only=True)
class DpoOptions(TrainOptions):
    """`rlcli train dpo`'s options."""

    dataset: str | None = option(None, "JSONL file of preference pairs " + SHAPE + ", or - for stdin")
    lr: float | None = LR(None)
    beta: float = BETA(0.1)
    batch_size: int = BATCH(BATCH_SIZE)
    epochs: int = EPOCHS(1)
    max_length: int = MAX_LENGTH(2048)
    load_checkpoint: str | None = LOAD_CHECKPOINT(None)

    def problems(self) -> Iterator[str]:
        if not self.dataset:
            yield "pass --dataset FILE (preference pairs, JSONL), or --dataset - to read stdin"


@dataclass(frozen=True)
class Pairs:
    source: str
    records: list[dict[str, Any]]  # {"messages", "chosen", "rejected"} only
    lines: list[int]  # each record's line number in the source
    read: int  # non-blank lines read
    dropped: dict[str, int]  # reason -> pairs dropped for it
    payload: bytes  # the records as the JSONL the builder reads
    sha256: str

    def count(self) -> str:
        why = ", ".join(f"{n} {reason}" for reason, n in self.dropped.items())
        return (f"{self.read} lines read, {len(self.records)} pairs kept, {sum(self.dropped.values())} dropped"
                + (f" ({why})" if why else ""))


def pair_problem(obj: Any) -> str | None:
    """What keeps one decoded line from being a preference pair, or None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("messages"), list) or not {"chosen", "rejected"} <= set(obj):
        return f"expected {SHAPE}"
    prompt = obj["messages"]
    if problem := messages_problem(prompt, "the prompt (messages) is empty"):
        return problem
    if prompt[-1]["role"] != "user":
        return f"the prompt's last turn is {prompt[-1]['role']!r}; it must end with the user turn both answers reply to"
    for key in ("chosen", "rejected"):
        answer = obj[key]
        if not isinstance(answer, dict) or answer.get("role") != "assistant" or not isinstance(answer.get("content"),
                                                                                                 str):
            return f'{key} must be {{"role": "assistant", "content": "..."}}'
    return None


def parse_pairs(lines: Iterator[str], source: str, required: bool = True) -> Pairs:
    """The pairs of `lines`; a line that is no pair is an error naming it, and so (if required) is no pair at all."""
    records, numbers, seen, dropped, read = [], [], set(), Counter[str](), 0
    for number, obj in numbered_json_lines(lines, source):
        read += 1
        if problem := pair_problem(obj):
            raise UsageError(f"{source} line {number}: {problem}; fix it (one pair per line: {SHAPE})")
        record = {k: obj[k] for k in ("messages", "chosen", "rejected")}
        key = json.dumps(record, sort_keys=True, ensure_ascii=False)
        if record["chosen"]["content"] == record["rejected"]["content"]:
            dropped["chosen same as rejected"] += 1
        elif key in seen:
            dropped["repeated"] += 1
        else:
            seen.add(key)
            records.append(record)
            numbers.append(number)
    if not records and required:
        what = f"no usable pair ({read} lines read, {sum(dropped.values())} dropped)" if read else "empty"
        raise UsageError(f"{source} is {what}: give one preference pair per line, {SHAPE}")
    payload = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    return Pairs(source, records, numbers, read, dict(dropped), payload, hashlib.sha256(payload).hexdigest())


def read_pairs(dataset: str, stdin: TextIO | None = None, required: bool = True) -> Pairs:
    if dataset == "-":
        return parse_pairs(iter(stdin or sys.stdin), "stdin", required)
    try:
        with open(Path(dataset).expanduser(), encoding="utf-8") as f:
            return parse_pairs(iter(f), dataset, required)
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"no pairs file at {dataset}: pass a JSONL file, or - to read stdin") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{dataset} is not UTF-8 text ({e.reason}): convert it to UTF-8 JSONL") from None


def default_lr(model: str) -> tuple[float, str]:
    rate, source = run.default_lr(model)
    return rate * LR_SHARE, f"a tenth of train sl's rate, {source}"


def conversations(pairs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pair as its two conversations (chosen, rejected), as the recipe renders them."""
    return [{"messages": [*p["messages"], p[k]]} for p in pairs for k in ("chosen", "rejected")]


def describe(plan: Any, data: Pairs, s: DpoOptions, lr_source: str, lengths: list[tuple[int, int]],
             all_rendered: bool) -> str:
    tokens = sum(n for n, _ in lengths)
    truncated = sum(1 for n, _ in lengths if n >= s.max_length)
    scope = "all" if all_rendered else f"first {len(lengths) // 2}"
    return "\n".join([
        f"data: {data.source}: {data.count()}, sha256 {data.sha256[:12]}",
        f"plan: {plan.batch_size} pairs x {plan.batches_per_epoch} steps per epoch x {plan.epochs} epochs -> "
        f"{plan.steps} steps ({plan.train_examples % plan.batch_size} pairs left out per epoch)",
        f"model: {s.model}  renderer: {s.renderer}  lr: {s.lr:g} ({lr_source})  beta: {s.beta:g}  "
        f"start and reference: {s.load_checkpoint or 'the base model (a fresh LoRA rank ' + str(s.lora_rank) + ')'}",
        f"tokens ({scope} pairs rendered): {tokens:,}, mean {tokens / max(len(lengths), 1):.0f} per answer's "
        f"conversation, {truncated} cut at --max-length {s.max_length}",
    ])


def final_report(folder: Path, base_url: str | None) -> str:
    rows = [m for m in read_jsonl(folder / "metrics.jsonl") if metrics.DPO_LOSS in m]
    lines = []
    if rows:
        first, last = rows[0], rows[-1]
        lines.append(f"dpo_loss {first[metrics.DPO_LOSS]:.4f} -> {last[metrics.DPO_LOSS]:.4f}, accuracy "
                     f"{first[metrics.ACCURACY]:.2f} -> {last[metrics.ACCURACY]:.2f}, margin "
                     f"{first[metrics.MARGIN]:.3f} -> {last[metrics.MARGIN]:.3f} over {len(rows)} steps")
    lines += [f"metrics: {folder / 'metrics.jsonl'}", f"checkpoints: {folder / 'checkpoints.jsonl'}"]
    if final := last_checkpoint(folder, "sampler_path"):
        url_flag = f" --base-url {base_url}" if base_url else ""
        lines += [f"final weights: {final['sampler_path']} (state: {final.get('state_path')})",
                  f"sample: rlcli sample --checkpoint {final['sampler_path']}{url_flag} --prompt 'Hello'"]
    return "\n".join(lines)


def train_dpo(o: DpoOptions) -> run.Weights | None:
    """Train a LoRA on preference pairs with tinker-cookbook's DPO recipe, on the server.

    Returns the final weights (None for a dry run)."""
    from rlcli.train.rl import checkpoint_state
    from rlcli.train.sl import make_plan

    data = read_pairs(str(o.dataset))  # given: the record refuses none
    state = checkpoint_state(o.load_checkpoint)
    plan = make_plan(len(data.records), o.batch_size, o.epochs, o.max_steps, 0)
    t = run.target("dpo", o, resolve_base_url(o.base_url))
    lr, lr_source = (o.lr, "--lr") if o.lr else default_lr(t.model)
    o = replace(o, model=t.model, renderer=t.renderer, lr=lr, load_checkpoint=state)
    sample = data.records if o.dry_run else data.records[:RENDER_CHECK]
    numbers = [n for n in data.lines[:len(sample)] for _ in range(2)]  # each pair's line, for both its answers
    lengths = renderers.render_lengths(conversations(sample), t.model, t.renderer, o.max_length,
                                       "last_assistant_message", numbers)
    job = run.Job(settings=kept(o), summary=describe(plan, data, o, lr_source, lengths, len(sample) == plan.examples),
                  digest=("dataset_sha256", data.sha256), same_input="the same dataset", resume_keys=RESUME_KEYS,
                  info={"pairs": plan.examples, "lines_read": data.read, "dropped": data.dropped},
                  resume_step=lambda row: int(row.get("epoch", 0)) * plan.batches_per_epoch + int(row.get("batch", 0)),
                  recipe=lambda folder, url: recipe(folder, url, data, o),
                  progress=DpoProgress(plan.steps), report=lambda folder: final_report(folder, o.base_url))
    return run.execute(job, t, o.resume, o.dry_run)


@contextlib.contextmanager
def recipe(folder: Path, url: str, data: Pairs, s: DpoOptions) -> Iterator[Callable[[], Any]]:
    """The cookbook's DPO main over a private copy of the pairs (stdin has no path of its own). Its reference
    logprobs come in the shape it slices (hosted_prompt_logprobs) and its loss's gradient goes to the server on the
    route SkyRL applies exactly (exact_custom_losses): rlcli.train.hooks."""
    from tinker_cookbook.preference import train_dpo
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    from rlcli.train.dpo_data import pairs_builder
    from rlcli.train.hooks import exact_custom_losses, hosted_prompt_logprobs

    with (private_copy(data.payload) as data_path, hosted_prompt_logprobs(), exact_custom_losses(),
          warnings.catch_warnings()):
        # The recipe uses its training client as the future tinker 0.38 returns (deprecated, works): a warning per
        # call the user can do nothing about.
        warnings.filterwarnings("ignore", category=FutureWarning, module=TINKER_BACKCOMPAT)
        common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=s.model, renderer_name=s.renderer,
                                                max_length=s.max_length, batch_size=s.batch_size)
        config = train_dpo.Config(log_path=str(folder), model_name=s.model, recipe_name=RECIPE_NAME,
                                  renderer_name=s.renderer, dataset_builder=pairs_builder(common, data_path),
                                  load_checkpoint_path=s.load_checkpoint, learning_rate=s.lr, num_epochs=s.epochs,
                                  dpo_beta=s.beta, lora_rank=s.lora_rank, base_url=url, save_every=s.save_every,
                                  eval_every=0, infrequent_eval_every=0, max_steps=s.max_steps)
        yield lambda: train_dpo.main(config)


class DpoProgress(run.ProgressLine):
    """One line per DPO step: step, epoch, loss, accuracy and margin of chosen over rejected, lr, time."""

    step_key = metrics.DPO_LOSS

    def line(self, row: dict[str, Any], step: int, elapsed_s: float) -> str:
        return "  ".join([
            f"step {step + 1}/{self.total_steps}",
            f"epoch {row.get(metrics.EPOCH, 0)}",
            f"loss {row[metrics.DPO_LOSS]:.4f}",
            f"accuracy {row.get(metrics.ACCURACY, 0.0):.2f}",
            f"margin {row.get(metrics.MARGIN, 0.0):.3f}",
            f"lr {row.get(metrics.LR, 0.0):.2e}",
            f"{elapsed_s:.2f}s",
        ])
