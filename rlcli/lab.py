"""What the notebooks do, so that a notebook holds only its parameters, calls into here, and plots.

Each step is an rlcli command run as a person would run it (`rlcli train rl ...`, `rlcli eval ...`),
and every figure comes from what those commands write: a run folder's metrics.jsonl, `rlcli eval`'s
JSON, a benchmark receipt. The fused-vs-2-pass notebook runs `python -m benchmarks.fused_vs_2pass` as `make bench`
does (notebooks run from a checkout) and plots its receipt. A notebook given no server starts a private
one (rlcli.server.private, the same as the tests' and the benchmarks').

Results: each notebook records its result as notebooks/results/<notebook>.json (`record`), and
`make notebooks` writes the executed copy, outputs and plots included, beside it.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlcli.config import portable
from rlcli.files import staged_file
from rlcli.server.private import private_server
from rlcli.train.metrics import CORRECT, REWARD, TEACHER_KL, TEST_CORRECT, TEST_TEACHER_KL, TRAIN_NLL

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "notebooks" / "results"


@contextlib.contextmanager
def server(base_url: str | None, model: str | None = None) -> Iterator[str]:
    """base_url as given; else a private server of our own for `model` (a folder or hub id; default the
    embedded model), stopped when the block ends."""
    if base_url:
        yield base_url
        return
    from rlcli.model import ensure_embedded_model

    # 3 LoRA slots (a table of 4): a notebook trains one model at a time, and memory stays low.
    with private_server(model or ensure_embedded_model(quiet=True), "--slots", "3") as srv:
        yield srv.url


def python(args: list[str], name: str, timeout: float = 3600, shown: int = 8) -> str:
    """Run `python ARGS` (named `name`); its output's last `shown` lines are shown; a failure raises with them."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-shown:])
    if proc.returncode != 0:
        raise RuntimeError(f"{name} exited {proc.returncode}:\n{tail}")
    print(tail)
    return proc.stdout


def rlcli(*args: str, timeout: float = 3600, shown: int = 8) -> str:
    """Run an rlcli command as a person would (`rlcli train rl ...`); its standard output."""
    return python(["-m", "rlcli.cli", *args], f"rlcli {' '.join(args)}", timeout, shown)


def flags(**options: Any) -> list[str]:
    """Options as command-line flags: batch_size=8 -> --batch-size 8; None values are left out."""
    return [word for name, value in options.items() if value is not None
            for word in ("--" + name.replace("_", "-"), str(value))]


def fused_vs_2pass(loss: str, base_url: str | None, receipt_dir: str | None = None, **config: Any) -> tuple[dict, Path]:
    """benchmarks/fused_vs_2pass.py for one loss, as `make bench` runs it (config: its flags, pairs=10 ->
    --pairs 10; no wait for a quiet machine); the receipt it wrote, and where."""
    out = python(["-m", "benchmarks.fused_vs_2pass", "--losses", loss, "--max-wait", "0",  # from ROOT: the package
                  *flags(base_url=base_url, receipt_dir=receipt_dir, **config)], "benchmarks.fused_vs_2pass")
    path = Path(out.strip().splitlines()[-1].removeprefix("receipt: "))
    return json.loads(path.read_text()), path


def dataset_flags(dataset: str, max_operand: int | None) -> list[str]:
    words = ["--dataset", dataset]
    if dataset == "arithmetic" and max_operand is not None:
        words += ["--max-operand", str(max_operand)]
    return words


def evaluate(url: str, dataset: str, checkpoint: str | None = None, max_operand: int | None = None,
             eval_size: int = 32, samples: int = 1, temperature: float = 0.0, max_tokens: int = 256) -> dict:
    """`rlcli eval` on train rl's held-out problems for these flags; its JSON result."""
    args = ["eval", *dataset_flags(dataset, max_operand), "--eval-size", str(eval_size), "--samples", str(samples),
            "--temperature", str(temperature), "--max-tokens", str(max_tokens), "--base-url", url]
    if checkpoint:
        args += ["--checkpoint", str(checkpoint)]
    return json.loads(rlcli(*args).strip().splitlines()[-1])


def train_rl(url: str, folder: Path, dataset: str, loss: str, steps: int, max_operand: int | None = None,
             **options: Any) -> list[dict]:
    """`rlcli train rl` into `folder`; flags are its options (batch_size=8 -> --batch-size 8). Its metrics rows."""
    rlcli("train", "rl", "--loss", loss, *dataset_flags(dataset, max_operand), "--max-steps", str(steps),
          "--base-url", url, "--log-path", str(folder), *flags(**options))
    return read_metrics(folder)


# The new skill SFT teaches: "Door N: code please." -> 42 (rlcli.loop.batches, batch 1's skill), on prompts of its
# own, so that distilling the old skill's prompts toward the base model has no reason to undo it. The base model
# never answers 42 to them.
def door_chats(folder: Path, train: int = 64, test: int = 32, seed: int = 0) -> tuple[Path, Path]:
    """(train, test) conversation files of the door skill, at folder/doors-train.jsonl and doors-test.jsonl: distinct
    door numbers, none in both."""
    import random

    from rlcli.loop.batches import SKILLS

    question, answer = SKILLS[1]
    doors = random.Random(seed).sample(range(100, 1000), train + test)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "doors-train.jsonl", folder / "doors-test.jsonl"
    for path, numbers in zip(paths, (doors[:train], doors[train:]), strict=True):
        path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": question.format(n=n)},
                                                         {"role": "assistant", "content": answer}]}) + "\n"
                                for n in numbers))
    return paths


def evaluate_replay(url: str, chats: Path, checkpoint: str | Path | None = None, eval_size: int = 16,
                    samples: int = 1, temperature: float = 0.0, max_tokens: int = 16) -> dict:
    """`rlcli eval --env replay --match number` on held-out prompts of a conversation file: the share of replies
    whose number is the logged one."""
    args = ["eval", "--env", "replay", "--dataset", str(chats), "--match", "number", "--eval-size", str(eval_size),
            "--samples", str(samples), "--temperature", str(temperature), "--max-tokens", str(max_tokens),
            "--base-url", url]
    if checkpoint:
        args += ["--checkpoint", str(checkpoint)]
    return json.loads(rlcli(*args).strip().splitlines()[-1])


def difference(after: dict, before: dict, z: float = 1.96) -> dict:
    """after - before in correct share, with a ~95% interval from each evaluation's rounds (`rlcli eval
    --samples K`: K independent answers to every problem): the sampling noise of the two scores on these problems."""
    def spread(score: dict) -> float:
        rounds = score["correct_per_round"]
        mean = sum(rounds) / len(rounds)
        return sum((r - mean) ** 2 for r in rounds) / max(1, len(rounds) - 1) / len(rounds)

    gain = after["correct"] - before["correct"]
    half = z * math.sqrt(spread(after) + spread(before))
    return {"gain": gain, "low": gain - half, "high": gain + half}


def recover_result(rows: list[dict], sums: dict[str, dict], greedy: dict[str, dict], new: dict[str, dict],
                   new_greedy: dict[str, dict], params: dict) -> dict:
    """What the recover demonstration records: the teacher KL's ends, each model's old skill (held-out sums) and new
    skill (held-out doors), sampled with rounds and greedy, and distilled - SFT on each with its interval."""
    return {**distill_result(rows, sums, params),
            **{f"heldout_greedy_{name}": score["correct"] for name, score in greedy.items()},
            **{f"new_skill_{name}": score["correct"] for name, score in new.items()},
            **{f"new_skill_greedy_{name}": score["correct"] for name, score in new_greedy.items()},
            "new_skill_prompts": next(iter(new.values()))["problems"],
            "eval_samples": next(iter(sums.values()))["samples"],
            "retained_gain": difference(sums["distilled"], sums["sft"]),
            "new_skill_change": difference(new["distilled"], new["sft"])}


def train_distill(url: str, folder: Path, teacher: str, steps: int, max_operand: int | None = None,
                  **options: Any) -> list[dict]:
    """`rlcli train distill --prompts arithmetic --teacher TEACHER` into `folder`; flags as for train_rl."""
    rlcli("train", "distill", "--prompts", "arithmetic", "--teacher", teacher, "--max-steps", str(steps),
          "--base-url", url, "--log-path", str(folder), *flags(max_operand=max_operand, **options))
    return read_metrics(folder)


def distill_result(rows: list[dict], scores: dict[str, dict], params: dict) -> dict:
    """What the distillation notebook records: the teacher KL's ends (a mean of the first and last fifth of the
    steps), the held-out KL at the first and last evaluation, and `rlcli eval`'s score of each model."""
    _, kl = series(rows, TEACHER_KL)
    _, held_out = series(rows, TEST_TEACHER_KL)
    n = max(1, len(kl) // 5)
    return {"teacher_kl_first_fifth": sum(kl[:n]) / n, "teacher_kl_last_fifth": sum(kl[-n:]) / n,
            "heldout_kl_first": held_out[0], "heldout_kl_last": held_out[-1], "steps": len(kl),
            **{f"heldout_correct_{name}": score["correct"] for name, score in scores.items()},
            "heldout_problems": next(iter(scores.values()))["problems"], "params": params}


def read_metrics(run_folder: Path) -> list[dict]:
    """metrics.jsonl of a run folder: the contract every training command writes."""
    path = Path(run_folder) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric; a resumed run logs some steps twice: the last one wins."""
    by_step = {row["step"]: row[key] for row in rows if key in row}
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def finite(values: dict) -> bool:
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values.values())


def record(name: str, result: dict, results_dir: str | Path | None = None) -> Path:
    """Write a notebook's result as <results_dir>/<name>.json (default notebooks/results/), and print it."""
    folder = Path(results_dir) if results_dir else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    text = portable(json.dumps(result, indent=1), ROOT)  # committed: no paths of this machine
    with staged_file(path, shared=True) as f:  # a result is meant to be read (it holds figures, no user data)
        f.write((text + "\n").encode())
    print(json.dumps(json.loads(text)))
    return path


def make_portable(*paths: str) -> None:
    """Rewrite files (executed notebooks) with this machine's paths made portable (`make notebooks`)."""
    for path in map(Path, paths):
        text = path.read_text()
        if (new := portable(text, ROOT)) != text:
            path.write_text(new)


def rl_result(before: dict, after: dict, rows: list[dict], params: dict) -> dict:
    """What the RL notebook records: held-out scores before and after, the reward curve's ends, the settings."""
    _, reward = series(rows, REWARD)
    head, tail = reward[: max(1, len(reward) // 5)], reward[-max(1, len(reward) // 5):]
    return {
        "heldout_correct_before": before["correct"], "heldout_correct_after": after["correct"],
        "heldout_gain": after["correct"] - before["correct"], "heldout_problems": after["problems"],
        "eval_samples": after["samples"], "eval_temperature": after["temperature"],
        "reward_first_fifth": sum(head) / len(head), "reward_last_fifth": sum(tail) / len(tail),
        "steps": len(reward), "dataset": after["dataset"], "base_model": after["base_model"],
        "checkpoint": after["source"], "params": params,
    }


def plot_fused(run: dict, title: str):
    """Per-step times of both paths, pair by pair, and the fused/2-pass ratio with its median and floor."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (steps_ax, ratio_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    pairs = range(1, len(run["raw_s"]["fused"]) + 1)
    for path, label in (("fused", "fused (1 request)"), ("two_pass", "2-pass (2 requests)")):
        steps_ax.plot(pairs, run["raw_s"][path], "o-", label=label)
    steps_ax.set(xlabel="pair", ylabel="step seconds (forward_backward + optim_step)", title=title)
    steps_ax.legend()
    ratio = run["summary"]["ratio"]
    ratio_ax.plot(pairs, run["pair_ratio_fused_over_two_pass"], "o-", color="C2", label="fused / 2-pass")
    ratio_ax.axhline(ratio["median"], color="C2", linestyle="--", label=f"median {ratio['median']:.2f}")
    floor = run["floor"]["floor_fb_over_fwd_plus_fb"]
    ratio_ax.axhline(floor, color="grey", linestyle=":", label=f"compute floor fb/(fwd+fb) {floor:.2f}")
    ratio_ax.set(xlabel="pair", ylabel="ratio", title="fused / 2-pass, per pair")
    ratio_ax.legend()
    for ax in (steps_ax, ratio_ax):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def plot_learning(sl_rows: list[dict], rl_rows: list[dict]):
    """SFT loss (train_mean_nll) and RL reward/correct per step, from the two runs' metrics.jsonl."""
    import matplotlib.pyplot as plt

    fig, (sl_ax, rl_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    sl_ax.plot(*series(sl_rows, TRAIN_NLL), "o-")
    sl_ax.set(xlabel="step", ylabel=TRAIN_NLL, title="SFT: loss")
    for key in (REWARD, CORRECT):
        rl_ax.plot(*series(rl_rows, key), "o-", label=key)
    rl_ax.set(xlabel="step", ylabel="mean over the batch", title="RL (gspo): reward")
    rl_ax.legend()
    fig.tight_layout()
    return fig


def plot_rl(rows: list[dict], before: dict, after: dict, loss: str):
    """Training reward per step, held-out accuracy at each evaluation during the run, and before/after."""
    import matplotlib.pyplot as plt

    fig, (reward_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    steps, reward = series(rows, REWARD)
    reward_ax.plot(steps, reward, ".-", alpha=0.5, label="reward (batch mean)")
    window = max(1, len(reward) // 10)
    recent = [reward[max(0, i - window + 1): i + 1] for i in range(len(reward))]
    smooth = [sum(r) / len(r) for r in recent]
    reward_ax.plot(steps, smooth, "-", color="C3", label=f"moving mean of {window}")
    reward_ax.set(xlabel="step", ylabel="reward", title=f"training reward ({loss})")
    reward_ax.legend()
    eval_steps, during = series(rows, TEST_CORRECT)
    if during:
        acc_ax.plot(eval_steps, during, "o-", label="during the run (1 sample each, temperature of training)")
    last = steps[-1] + 1 if steps else 1
    label = f"rlcli eval ({after['samples']} x {after['problems']} answers, temperature {after['temperature']:g})"
    acc_ax.plot([0, last], [before["correct"], after["correct"]], "s--", color="C3", markersize=9, label=label)
    acc_ax.set(xlabel="step", ylabel="correct share", title="held-out accuracy", ylim=(0, 1.02))
    acc_ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_distill(rows: list[dict], scores: dict[str, dict], new: dict[str, dict] | None = None):
    """Teacher KL per step (training batch and held-out prompts) and each model's held-out accuracy: one bar per
    model, or with `new` (the new skill's scores) a pair per model, old skill and new."""
    import matplotlib.pyplot as plt

    fig, (kl_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    kl_ax.plot(*series(rows, TEACHER_KL), ".-", alpha=0.6, label="training batch")
    kl_ax.plot(*series(rows, TEST_TEACHER_KL), "o-", color="C3", label="held-out prompts")
    kl_ax.axhline(0, color="grey", linewidth=0.5)
    kl_ax.set(xlabel="step", ylabel="student - teacher logprob per token", title="teacher KL")
    kl_ax.legend()
    if new is None:
        acc_ax.bar(list(scores), [s["correct"] for s in scores.values()], color=["C0", "C1", "C2"][: len(scores)])
    else:
        at = range(len(scores))
        acc_ax.bar([x - 0.2 for x in at], [s["correct"] for s in scores.values()], 0.4, label="old skill (sums)")
        acc_ax.bar([x + 0.2 for x in at], [s["correct"] for s in new.values()], 0.4, label="new skill (doors)")
        acc_ax.set_xticks(list(at), list(scores))
        acc_ax.legend()
    acc_ax.set(ylabel="correct share", title="held-out accuracy (rlcli eval)", ylim=(0, 1))
    fig.tight_layout()
    return fig


def loop_iterations(url: str, folder: Path, chats: int, regression: str = "sums", **settings: Any) -> list[dict]:
    """`rlcli loop init`, then one trace batch (rlcli.loop.batches) delivered per iteration and `rlcli loop
    run --once` after each, as a person would; each iteration's row as the ledger records it. The regression
    set: sums, or doors (batch 1's skill asked again: what later iterations must not forget)."""
    import shutil
    from dataclasses import replace

    from rlcli.loop import batches
    from rlcli.loop import settings as loop_settings

    made = batches.write_all(str(folder / "batches"), n=chats)
    if regression == "doors":
        made[-1] = batches.write_skill_regression(folder / "batches" / "doors.jsonl", 1, 16)
    (folder / "inbox").mkdir(parents=True, exist_ok=True)
    loop = folder / "loop"
    rlcli("loop", "init", str(loop), "--traces", str(folder / "inbox"), "--regression", str(made[-1]),
          "--base-url", url)
    loop_settings.write(loop, replace(loop_settings.read(loop), **settings))
    for batch in made[:-1]:
        shutil.copy(batch, folder / "inbox")
        rlcli("loop", "run", str(loop), "--once")
    print(rlcli("loop", "history", str(loop)))
    return loop_rows(loop)


def loop_rows(loop: Path) -> list[dict]:
    from rlcli.loop.ledger import opened

    rows = []
    with opened(loop) as ledger:
        for it in ledger.iterations():
            found = ledger.stage(it["n"], "evaluate") or {}
            rows.append({"iteration": it["n"], "decision": it["decision"], "why": it["why"],
                         "heldout": found.get("heldout"), "regression": found.get("regression"),
                         "slices": found.get("slices", [])})
    return rows


def loop_result(rows: list[dict], params: dict) -> dict:
    """What the loop notebook records: each iteration's decision, paired scores, and per slice champion ->
    candidate with its interval and n."""
    keep = ("name", "new", "champion", "candidate", "low", "high", "n")
    return {"iterations": len(rows), "promoted": sum(r["decision"] == "promoted" for r in rows),
            "decisions": [r["decision"] for r in rows],
            **{f"{name}_{who}": [round(r[name][who], 4) if r[name] else None for r in rows]
               for name in ("heldout", "regression") for who in ("champion", "candidate")},
            "heldout_low": [round(r["heldout"]["low"], 4) if r["heldout"] else None for r in rows],
            "slices": [[{k: round(x[k], 4) if isinstance(x[k], float) else x[k] for k in keep} for x in r["slices"]]
                       for r in rows],
            "params": params}


def plot_loop(rows: list[dict]):
    """Held-out and regression scores per iteration, champion vs candidate (the held-out gain's interval as a bar)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    scored = [r for r in rows if r["heldout"]]
    x = [r["iteration"] for r in scored]
    for ax, name in zip(axes, ("heldout", "regression"), strict=True):
        ax.plot(x, [r[name]["champion"] for r in scored], "o-", label="champion")
        ax.plot(x, [r[name]["candidate"] for r in scored], "s--", label="candidate")
        if name == "heldout":
            ax.errorbar(x, [r[name]["candidate"] for r in scored], fmt="none", ecolor="C1", capsize=4,
                        yerr=[[r[name]["gain"] - r[name]["low"] for r in scored],
                              [r[name]["high"] - r[name]["gain"] for r in scored]], label="gain interval")
        for r in scored:
            ax.annotate(r["decision"], (r["iteration"], r[name]["candidate"]), textcoords="offset points",
                        xytext=(0, 8), ha="center", fontsize=8)
        ax.set(xlabel="iteration", ylabel="correct share", title=f"{name} problems", ylim=(-0.05, 1.1), xticks=x)
        ax.legend()
    fig.tight_layout()
    return fig


# --- the served loop: an application's traffic through the endpoint becomes the next champion -----------------


def served_loop(url: str, folder: Path, *init: str, regression: str = "sums", regression_size: int = 64,
                **settings: Any) -> tuple[Path, Path]:
    """`rlcli loop init FOLDER/loop --traces capture:FOLDER/capture INIT...` with a regression set of
    `regression_size` (rlcli.loop.batches: one-digit sums, or doors: batch 1's door code), then `settings` over
    loop.toml's; (loop, capture folder)."""
    from dataclasses import replace

    from rlcli.loop import batches
    from rlcli.loop import settings as loop_settings

    loop, store = folder / "loop", folder / "capture"
    folder.mkdir(parents=True, exist_ok=True)
    regression_file = folder / f"{regression}.jsonl"
    if regression == "doors":
        batches.write_skill_regression(regression_file, 1, regression_size)
    else:
        batches.write_regression(regression_file, regression_size)
    rlcli("loop", "init", str(loop), "--traces", f"capture:{store}", "--regression", str(regression_file),
          "--base-url", url, *init)
    if settings:
        loop_settings.write(loop, replace(loop_settings.read(loop), **settings))
    return loop, store


@contextlib.contextmanager
def endpoint(url: str, loop: Path, store: Path, model: str | None = None, max_tokens: int = 16) -> Iterator[str]:
    """`rlcli endpoint start --loops LOOP --capture STORE` over the server at `url` serving `model` (default: the
    embedded model, as `server`'s), on a free port, under a name of its own (a person's default endpoint is left
    alone); its URL, stopped when the block ends."""
    import os

    from rlcli.model import ensure_embedded_model
    from rlcli.server.private import free_port

    name = f"notebook-{os.getpid()}"
    model = model or str(ensure_embedded_model(quiet=True))
    served = rlcli("endpoint", "start", "--base-url", url, "--model", model, "--name", name, "--port", str(free_port()),
                   "--loops", str(loop), "--capture", str(store), "--max-tokens", str(max_tokens))
    try:
        yield served.strip().splitlines()[-1]
    finally:
        rlcli("endpoint", "stop", "--name", name)


def served_questions(batch: int, n: int, seed: int = 0) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(asked, held out): n (question, right answer) pairs of a trace batch's traffic (rlcli.loop.batches: a quarter
    one-digit sums, the rest its skill), and n more of the same kinds, none of them asked before."""
    from rlcli.loop import batches

    asked = batches.chats(batch, n, seed)
    seen = {q for q, _ in asked}
    later = [(q, a) for q, a in batches.chats(batch, 4 * n, seed + 1) if q not in seen]
    return asked, later[:n]


def wilson(right: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The ~95% Wilson interval of a share right/n: sound at 0 and at n, where the normal one collapses."""
    if n == 0:
        return 0.0, 1.0
    p = right / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))  # rounding


def served_accuracy(answers: list[dict]) -> dict:
    """The share of served answers that were right, with its Wilson interval and n; and per kind of question (its
    template, as the loop's slices name them)."""
    from rlcli.loop.slices import template

    def share(some: list[dict]) -> dict:
        right = sum(a["right"] for a in some)
        low, high = wilson(right, len(some))
        return {"accuracy": right / max(1, len(some)), "low": low, "high": high, "n": len(some)}

    kinds: dict[str, list[dict]] = {}
    for a in answers:
        kinds.setdefault(template({"messages": [{"role": "user", "content": a["question"]}]}), []).append(a)
    return {**share(answers), "by_kind": {kind: share(some) for kind, some in sorted(kinds.items())}}


def served_result(phases: dict[str, list[dict]], rows: list[dict], params: dict) -> dict:
    """What the served-loop notebook records: per phase of traffic its served accuracy and the weights that
    answered, and the loop's iteration (decision, per slice champion -> candidate)."""
    return {"phases": {name: {**served_accuracy(a), "weights": sorted({x["weights"] for x in a}),
                              "champion_iterations": sorted({x["iteration"] for x in a})}
                       for name, a in phases.items()},
            **{k: v for k, v in loop_result(rows, params).items() if k != "params"}, "params": params}


def plot_served(phases: dict[str, list[dict]]):
    """Left: each phase's served accuracy with its Wilson interval. Right: the champion iteration that answered each
    request, over time."""
    import matplotlib.pyplot as plt

    fig, (acc_ax, it_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    scores = {name: served_accuracy(a) for name, a in phases.items()}
    at = range(len(scores))
    acc_ax.bar(at, [s["accuracy"] for s in scores.values()], color=[f"C{i}" for i in at],
               yerr=[[s["accuracy"] - s["low"] for s in scores.values()],
                     [s["high"] - s["accuracy"] for s in scores.values()]], capsize=5)
    acc_ax.set_xticks(list(at), [f"{name}\n(n={s['n']})" for name, s in scores.items()], fontsize=8)
    acc_ax.set(ylabel="served answers right", title="accuracy of what the endpoint served (95% Wilson)", ylim=(0, 1.05))
    for i, (name, answers) in enumerate(phases.items()):
        it_ax.plot([a["at"] for a in answers], [a["iteration"] for a in answers], ".", color=f"C{i}", label=name)
    top = max(a["iteration"] for answers in phases.values() for a in answers)
    it_ax.set(xlabel="seconds since the start (the gap: the loop's iteration)", ylabel="champion iteration",
              yticks=range(top + 2), title="the champion that answered each request")
    it_ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def continual_receipt(run: str = "receipt", out: str | None = None) -> dict:
    """The continual-learning benchmark's receipt: the newest one in benchmarks/receipts (run "receipt"), or that of
    a fresh `python -m benchmarks.continual` ("quick" or "full"), written into `out` (default benchmarks/receipts)."""
    folder = Path(out) if out else ROOT / "benchmarks" / "receipts"
    if run != "receipt":
        python(["-m", "benchmarks.continual", *(["--quick"] * (run == "quick")), "--out", str(folder)],
               "benchmarks.continual", timeout=7200)
    found = sorted(folder.glob("continual-*.json"))
    if not found:
        raise FileNotFoundError(f"no continual-*.json in {folder}: run `python -m benchmarks.continual` first")
    return {**json.loads(found[-1].read_text()), "file": found[-1].name}


def continual_result(receipt: dict) -> dict:
    """What the notebook records of the benchmark: per strategy ACC, BWT, FWT and the average after each skill; the
    default strategy's gate against the truth; each target met or not."""
    names = receipt["config"]["strategies"]
    return {"receipt": receipt["file"], "skills": len(receipt["base"]),
            "strategies": {n: {k: receipt[n]["summary"][k] for k in ("acc", "bwt", "fwt", "average_seen")}
                           for n in names},
            "decisions": receipt["default"]["decisions"],
            "targets": {t["target"]: t["met"] for t in receipt["targets"]}}


def _seen_averages(events: list[dict]) -> list[float]:
    """The champion's mean accuracy over the skills arrived so far, after each iteration."""
    out, seen = [], 0
    for e in events:
        seen = max(seen, (e["skill"] + 1) if e["skill"] is not None else 0)
        out.append(sum(e["champion"][:seen]) / seen)
    return out


def plot_continual(receipt: dict):
    """Average accuracy over the skills seen after each iteration, per strategy (the champion a loop serves; joint
    training after each skill), and the accuracy matrices of the default strategy's champion and of joint."""
    import matplotlib.pyplot as plt

    names = receipt["config"]["strategies"]
    events = receipt["default"]["events"]
    labels = ["bad" if e["bad"] else f"s{e['skill'] + 1}" for e in events]
    skill_at = [i + 1 for i, e in enumerate(events) if not e["bad"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    for n in names:
        if n == "joint":
            axes[0].plot(skill_at, receipt[n]["summary"]["average_seen"], "k--", marker="s", label="joint (bound)")
        else:
            axes[0].plot(range(1, len(events) + 1), _seen_averages(receipt[n]["events"]), "o-", label=n)
    axes[0].set(xlabel="iteration (the batch it brought)", ylabel="accuracy, mean over skills seen", ylim=(-0.05, 1.05),
                title="average accuracy after each iteration", xticks=range(1, len(events) + 1), xticklabels=labels)
    axes[0].legend()
    for ax, (title, R) in zip(axes[1:], (("default: champion", receipt["default"]["R_champion"]),
                                         ("joint", receipt.get("joint", {}).get("R"))), strict=True):
        if R is None:
            ax.axis("off")
            continue
        ax.imshow(R, vmin=0, vmax=1, cmap="viridis")
        for i, row in enumerate(R):
            for j, a in enumerate(row):
                ax.text(j, i, f"{a:.2f}", ha="center", va="center", color="white" if a < 0.6 else "black", fontsize=8)
        ax.set(title=f"R[i][j], {title}", xlabel="skill j (test set)", ylabel="after skill i",
               xticks=range(len(R)), yticks=range(len(R)), xticklabels=range(1, len(R) + 1),
               yticklabels=range(1, len(R) + 1))
    fig.tight_layout()
    return fig


if __name__ == "__main__":  # python -m rlcli.lab portable FILE...
    if sys.argv[1:2] != ["portable"]:
        sys.exit("usage: python -m rlcli.lab portable FILE...")
    make_portable(*sys.argv[2:])
