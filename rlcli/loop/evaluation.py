"""The loop's evaluation: which problems, slice by slice; what they can show before any training (power); champion
and candidate answering them in batched requests; their comparison per slice (rlcli.loop.gate).

The plan: the held-out problems of every iteration so far and the regression set, one per distinct prompt, each
in the slice the ledger recorded for it (rlcli.loop.slices), at most `eval_limit` per slice of each set, smallest
prompt hash first (a stable subset as the sets grow). A slice is new when any of its held-out problems arrived
after the champion's iteration: the champion was never trained on that kind of request, so a gain there can
promote. Every answer goes to iterations/N/eval.jsonl ({"kind": "answer", ...}), then one line per slice
({"kind": "slice", ...}: champion -> candidate, the gain, its interval, n).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlcli.loop import data, gate
from rlcli.loop.ledger import Champion, Ledger
from rlcli.loop.settings import LoopSettings
from rlcli.loop.stages import say
from rlcli.problems.traces import Problem, first_problems
from rlcli.slot_wait import NoFreeSlot

EVAL_FILE = "eval.jsonl"
SETS = ("heldout", "regression")


@dataclass(frozen=True)
class Planned:
    problem: Problem
    set: str  # heldout or regression
    slice: str


@dataclass(frozen=True)
class Plan:
    problems: list[Planned]
    new: frozenset[str]  # the slices whose held-out problems arrived after the champion was made

    def slices(self) -> dict[str, list[int]]:
        """{slice: the indices of its problems}."""
        found: dict[str, list[int]] = {}
        for i, p in enumerate(self.problems):
            found.setdefault(p.slice, []).append(i)
        return found


def plan(folder: Path, ledger: Ledger, n: int, s: LoopSettings, champion: Champion) -> Plan:
    """What champion and candidate answer in iteration n (deterministic: the power check and the evaluation
    compute the same plan)."""
    regression = data.read_jsonl(folder / data.REGRESSION)
    data.slices_before(folder, ledger, n)  # a loop folder made before slices: record them now
    data.record_regression(ledger, regression)
    rows = {"heldout": data.all_rows(folder, ledger, "heldout.jsonl", n), "regression": regression}
    chosen: list[Planned] = []
    new: set[str] = set()
    for name in SETS:
        recorded = ledger.problem_slices(name)
        groups: dict[str, list[Problem]] = {}
        for problem in first_problems(rows[name], len(rows[name]), name):  # by prompt hash
            where, arrived = recorded.get(problem.key, (name, 0))
            groups.setdefault(where, []).append(problem)
            if name == "heldout" and arrived > champion.iteration:
                new.add(where)
        chosen += [Planned(p, name, where) for where, probs in groups.items() for p in probs[:s.eval_limit]]
    return Plan(chosen, frozenset(new))


def champion_scores(folder: Path, ledger: Ledger, champion: Champion) -> dict[str, float]:
    """The champion's latest known score on each problem (by prompt hash), from earlier evaluations: as the
    candidate of its own iteration, or as the champion of a later one."""
    known: dict[str, float] = {}
    for it in reversed(ledger.iterations()):
        found = ledger.stage(it["n"], "evaluate") or {}
        who = "candidate" if it["n"] == champion.iteration else "champion"
        if not found or (who == "champion" and found.get("champion_iteration") != champion.iteration):
            continue
        for row in data.read_jsonl(data.iteration_dir(folder, it["n"]) / EVAL_FILE):
            if row.get("kind") == "answer" and row["model"] == who:
                known.setdefault(row["key"], row["score"])
    return known


def power(folder: Path, ledger: Ledger, n: int, s: LoopSettings, champion: Champion) -> dict[str, Any]:
    """What each slice of iteration n's evaluation can show, before training: the problems that must improve for
    its interval to clear 0, against the problems it has (and, where the champion's scores are known, the ones
    the champion does not already get right)."""
    found = plan(folder, ledger, n, s, champion)
    known = champion_scores(folder, ledger, champion)
    per = {name: (len(at), sum(known.get(found.problems[i].problem.key, 0.0) < 1 for i in at), name in found.new)
           for name, at in found.slices().items()}
    slices = gate.power(per, s.confidence, s.samples)
    each = gate.each_confidence(s.confidence, len(slices))
    return {"each": each, "needed": slices[0].needed if slices else 0,
            "slices": [{**asdict(x), "smallest_gain": x.smallest_gain, "blind": x.blind} for x in slices]}


def power_lines(found: dict[str, Any], s: LoopSettings) -> list[str]:
    """The power check in words: one line for the rule, one per new slice, one per slice that cannot show a drop,
    and the fix when a slice cannot show a gain."""
    slices = found["slices"]
    if not slices:
        return ["power: no held-out or regression problems to compare on"]
    lines = [f"power: {len(slices)} slice{'s' * (len(slices) != 1)} at {found['each']:.2%} each ({s.confidence:.0%} "
             f"together): a slice shows a gain (or a drop) only when at least {found['needed']} of its problems "
             "improve (or fall) and none move the other way"]
    for x in slices:
        where = f"slice {x['name']!r} ({'new, ' if x['new'] else ''}{x['n']} problems"
        where += f", {x['open']} not already right)" if x["open"] < x["n"] else ")"
        if x["new"] and x["blind"]:
            lines.append(f"{where}: cannot show a gain: it needs {x['needed']} problems to improve")
        elif x["new"]:
            lines.append(f"{where}: the smallest gain it can show is {x['smallest_gain']:+.2f}")
        elif x["n"] < x["needed"]:
            lines.append(f"{where}: cannot show a drop: a candidate could forget it unseen")
    if any(x["new"] and x["blind"] for x in slices):
        lines.append(f"fix: more held-out problems of those slices (heldout_share = {s.heldout_share:g} now, or more "
                     "traces of them), problems of them in the regression set, fewer slices or a lower confidence; "
                     "samples > 1 lets a problem count partly right, with as many problems needed")
    if not any(x["new"] and not x["blind"] for x in slices):
        lines.append("no slice new since the champion can show a gain: the auto gate cannot promote this iteration")
    return lines


def answers(model: Champion, problems: list[Problem], s: LoopSettings, url: str, one_at_a_time: bool = False,
            in_flight: int | None = None) -> list[Any]:
    """One model's graded answers (`samples` each, at `temperature`), all requests sent at once
    (rlcli.problems.score.answer; one_at_a_time: benchmarks/loop_scoring.py's baseline), rendered and parsed by the
    renderer the trainers use: a model is asked as it was trained."""
    from tinker_cookbook import renderers as cookbook
    from tinker_cookbook.completers import TinkerTokenCompleter
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from rlcli import sample
    from rlcli.problems import replay, score
    from rlcli.problems.traces import Spec
    from rlcli.slot_wait import BACKGROUND_WAIT_S
    from rlcli.train import run

    if not problems:
        return []
    smp = sample.open_sampler(model.sampler_path, None, url, None, s.max_tokens, s.temperature, s.seed,
                              slot_wait_s=BACKGROUND_WAIT_S)
    try:
        sample.complete(smp, problems[0].prompt)  # serves an unloaded checkpoint again if need be
        renderer = cookbook.get_renderer(run.prepare_model(smp.base_model, None), get_tokenizer(smp.base_model))
        graded = score.answer(replay.one_each(problems, renderer, Spec("", match=s.match), samples=s.samples),
                              TinkerTokenCompleter(smp.client, max_tokens=s.max_tokens, temperature=s.temperature),
                              one_at_a_time, in_flight or score.IN_FLIGHT)
        return score.per_problem(graded, renderer)
    finally:
        sample.close(smp)


def answers_of(models: dict[str, Champion], problems: list[Problem], s: LoopSettings, url: str) -> dict[str, list]:
    """Every model's graded answers, the models asking at the same time (a thread each, each with its own sampler
    and its share of the requests in flight), so that the server samples their pending requests in the same
    batches."""
    from concurrent.futures import ThreadPoolExecutor

    # transformers' lazy module cannot be first imported from two threads at once (`cannot import name
    # 'AutoTokenizer'`): a `loop run` resumed at its evaluation has trained nothing that imported it first.
    from transformers import AutoTokenizer  # noqa: F401

    from rlcli.problems.score import IN_FLIGHT

    with ThreadPoolExecutor(len(models)) as pool:
        share = max(IN_FLIGHT // len(models), 1)
        asked = {who: pool.submit(answers, model, problems, s, url, in_flight=share) for who, model in models.items()}
        return {who: future.result() for who, future in asked.items()}


def evaluate(folder: Path, ledger: Ledger, n: int, s: LoopSettings, champion: Champion, candidate: Champion,
             url: str) -> dict[str, Any]:
    """Both models answer iteration n's plan; the ledger records the pooled comparison of each set (the pooled
    gate's), each slice's comparison (the auto gate's) and their scores, in one transaction."""
    found = plan(folder, ledger, n, s, champion)
    problems = [p.problem for p in found.problems]
    count = {name: sum(p.set == name for p in found.problems) for name in SETS}
    say(f"iteration {n}: evaluating {champion.label()} and the candidate on {count['heldout']} held-out and "
        f"{count['regression']} regression problems in {len(found.slices())} slices, {s.samples} answer"
        f"{'s' * (s.samples > 1)} each, both models' requests at once")
    from rlcli import watchdog

    try:
        with watchdog.watch(url, s.server_timeout, _gone(folder, n, url)):  # a dead server: one line, not a hang
            graded = answers_of({"champion": champion, "candidate": candidate}, problems, s, url)
    except NoFreeSlot as e:  # nothing of this stage is recorded yet: the next run starts it again
        raise NoFreeSlot(f"{e}; then `rlcli loop run {folder}` resumes iteration {n} at its evaluation") from None
    result: dict[str, Any] = {"champion_iteration": champion.iteration, "samples": s.samples}
    for name in SETS:
        at = [i for i, p in enumerate(found.problems) if p.set == name]
        result[name] = asdict(gate.paired_bootstrap(_scores(graded["champion"], at), _scores(graded["candidate"], at),
                                                    s.confidence, s.bootstrap, s.seed))
    pairs = {name: (_scores(graded["champion"], at), _scores(graded["candidate"], at))
             for name, at in found.slices().items()}
    slices = gate.compare_slices(pairs, set(found.new), s.confidence, s.samples)
    result["slices"] = [asdict(x) for x in slices]
    _write(data.iteration_dir(folder, n) / EVAL_FILE, found, graded, slices)
    with ledger.transaction() as db:
        rows = [(name, result[name]) for name in SETS] + [(f"slice:{x.name}", asdict(x)) for x in slices]
        for problems_name, cmp in rows:
            for who in ("champion", "candidate"):
                db.execute("INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?)",
                           (n, who, problems_name, cmp[who], cmp["n"]))
        ledger.done(db, n, "evaluate", result)
    return result


def _gone(folder: Path, n: int, url: str):
    """The line a `loop run` ends with (exit 75) when its server stops answering during the evaluation: tinker's
    requests to a server that is gone wait on, retrying, so without the watch the command hung (the random-kill
    harness, seed 0: kill -9 of the server while both models answered, then nothing for 10 minutes)."""
    def message(silent_s: float, cause: str | None = None) -> str:
        what = cause or f"stopped answering (no answer for {silent_s:.0f} s)"
        return (f"the server at {url} {what} during iteration {n}'s evaluation: restart it (`rlcli serve restart`), "
                f"then `rlcli loop run {folder}` resumes iteration {n} at its evaluation")
    return message


def _scores(graded: list[Any], at: list[int]) -> list[float]:
    return [graded[i].correct for i in at]


def _write(path: Path, found: Plan, graded: dict[str, list[Any]], slices: list[gate.Slice]) -> None:
    lines = [{"kind": "answer", "set": p.set, "slice": p.slice, "model": who, "key": p.problem.key,
              "source": p.problem.source, "prompt": p.problem.last_user(), "logged": p.problem.text,
              "reply": g.reply, "score": g.correct}
             for who, got in graded.items() for p, g in zip(found.problems, got, strict=True)]
    lines += [{"kind": "slice", **asdict(x)} for x in slices]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines))


def recorded(ledger: Ledger, n: int) -> tuple[gate.Comparison, gate.Comparison, list[gate.Slice]]:
    """Iteration n's recorded comparisons: held-out and regression pooled, and each slice (none in a ledger
    written before slices)."""
    found = ledger.stage(n, "evaluate") or {}
    return (gate.Comparison(**found["heldout"]), gate.Comparison(**found["regression"]),
            [gate.Slice(**x) for x in found.get("slices", [])])
