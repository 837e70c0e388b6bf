"""A continual-learning benchmark of `rlcli loop`: skills arriving one trace batch at a time, a deliberately bad
candidate every few iterations, the standard measures, the gate's decisions against the truth, and strategies
compared in one run.

    .venv/bin/python -m benchmarks.continual [--quick] [--strategies default,new,distill,joint] [--label L]

One private server on the embedded model (CPU). The skills (rlcli.loop.skills): facts, a reply format, a tool-call
pattern, an arithmetic variant, in that order of arrival, one batch of `chats` logged chats each; after every
`bad_every` skills comes a batch of mixed traffic of the skills seen so far that the loop trains on shuffled answers
(`shuffle_answers`): a candidate the gate must reject. Each loop strategy is a loop folder of its own driven through
`rlcli loop`'s library functions as `loop run --once` would (ingest, split, power, train, evaluate, gate, promote):
- default: the loop's default settings (LoopSettings: SFT from the champion with replay of earlier data);
- new: SFT on the new batch only (train_on = "new");
- distill: SFT on the new batch, then distill from the champion on the earlier prompts (sft,distill);
- joint: no loop; after each skill, SFT from the base model on every training conversation the default loop had
  seen so far, for steps x skills seen: the upper bound.
After every iteration the champion and the candidate answer every skill's FIXED test set (rlcli.loop.skills.test_set,
never trained on, separate from the loop's held-out set): the accuracy matrices R (rows: after each skill) from which
rlcli.loop.measures computes average accuracy over the skills seen, backward and forward transfer; and each
candidate's truth (learned its skill, kept the others) against the gate's decision. The receipt
(benchmarks/receipts/continual-<date>.json) holds every figure, and the targets of issue 46 met or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from rlcli.loop import measures, skills
from rlcli.loop.ledger import Champion
from rlcli.loop.settings import LoopSettings

STRATEGIES = {"default": {}, "new": {"train": "sft", "train_on": "new"},
              "distill": {"train": "sft,distill", "train_on": "new"}, "joint": None}


@dataclass(frozen=True)
class Size:
    skills: int = 5
    chats: int = 64  # per skill batch
    tests: int = 16  # fixed test problems per skill
    bad_every: int = 2  # a bad candidate after every this many skills
    distill_steps: int = 8  # the distill strategy's distill stage (sampling is its cost on CPU)
    steps: int | None = None  # SFT steps of every strategy (None: the loop's default)


FULL, QUICK = Size(), Size(skills=3, chats=64, tests=8, bad_every=2, distill_steps=4, steps=64)


def say(line: str) -> None:
    print(f"continual: {line}", file=sys.__stderr__, flush=True)


# --- the sequence ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One arrival: a skill's batch (skill = its index) or a bad candidate's mixed batch (skill None)."""

    file: str
    skill: int | None
    seen: int  # skills arrived so far, this one included

    @property
    def bad(self) -> bool:
        return self.skill is None


def schedule(size: Size, folder: Path, seed: int = 0) -> list[Event]:
    """The batches in arrival order, written under `folder`."""
    import random

    from rlcli.loop.batches import record

    events: list[Event] = []
    for k in range(size.skills):
        events.append(Event(f"{len(events) + 1:02d}-skill-{k + 1}.openai.jsonl", k, k + 1))
        if (k + 1) % size.bad_every == 0 and k + 1 < size.skills:
            events.append(Event(f"{len(events) + 1:02d}-bad.openai.jsonl", None, k + 1))
    folder.mkdir(parents=True, exist_ok=True)
    for i, e in enumerate(events):
        if e.bad:  # traffic of every skill seen, fresh numbers: shuffled, their replies land on other skills
            pairs = [p for s in skills.SKILLS[: e.seen] for p in s.pairs(size.chats // e.seen + 4, seed + 1 + i)]
            random.Random(seed + i).shuffle(pairs)
            rows = [record(j, q, a) for j, (q, a) in enumerate(pairs)]
        else:
            rows = skills.batch(skills.SKILLS[e.skill], size.chats, seed)
        (folder / e.file).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return events


# --- scoring on the fixed test sets ---------------------------------------------------------------


def fixed_tests(size: Size) -> list[list]:
    from rlcli.problems.traces import first_problems

    return [first_problems(skills.test_set(s, size.tests), size.tests, s.name) for s in skills.SKILLS[: size.skills]]


def accuracy(url: str, model: Champion, tests: list[list], s: LoopSettings) -> list[float]:
    """The model's accuracy on each skill's fixed test set (greedy, every request at once)."""
    from rlcli.loop.evaluation import answers

    got = answers(model, [p for ps in tests for p in ps], s, url)
    out, at = [], 0
    for ps in tests:
        out.append(sum(g.correct for g in got[at:at + len(ps)]) / len(ps))
        at += len(ps)
    return out


# --- one strategy -------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet(log: Path):
    """The trainers' and the loop's own lines go to a log file; the benchmark prints one progress line each."""
    with open(log, "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        yield


def loop_settings(url: str, changes: dict[str, Any], size: Size) -> LoopSettings:
    base = LoopSettings(traces="set below", match="normalized", base_url=url)
    if "distill" in changes.get("train", ""):
        base = replace(base, distill_steps=size.distill_steps)
    return replace(base, **changes)


def run_loop(url: str, root: Path, name: str, s: LoopSettings, events: list[Event], data: Path, tests: list[list],
             base: list[float]) -> dict[str, Any]:
    """One loop folder through every event; after each, the champion's and the candidate's test accuracies, the
    gate's decision and the new skill's slice."""
    from rlcli.loop import commands, slices, stages
    from rlcli.loop import settings as loop_settings

    folder, inbox = root / name / "loop", root / name / "inbox"
    inbox.mkdir(parents=True)
    opts = {f.name: getattr(s, f.name) for f in fields(LoopSettings)} | {"traces": str(inbox)}
    with quiet(root / name / "log.txt"):
        commands.init(commands.InitOptions(dir=str(folder), **opts))
    rows, champion_acc = [], base
    for i, e in enumerate(events, 1):
        start = time.monotonic()
        shutil.copy(data / e.file, inbox)
        loop_settings.write(folder, replace(loop_settings.read(folder), shuffle_answers=e.bad))
        with quiet(root / name / "log.txt"), commands.locked(folder) as ledger:
            commands.run_once(folder, ledger)
            it, cand, champ = ledger.iteration(i), stages.candidate(ledger, i), ledger.champion()
            found = ledger.stage(i, "evaluate") or {}
        with quiet(root / name / "log.txt"):
            candidate_acc = accuracy(url, cand, tests, s) if cand else champion_acc
            before, champion_acc = champion_acc, accuracy(url, champ, tests, s)
        slice_name = slices.template(skills.conversations(skills.SKILLS[e.skill].pairs(1, 0))[0]) if not e.bad else None
        new = next((x for x in found.get("slices", []) if x["name"] == slice_name), None)
        t = measures.truth(before, candidate_acc, e.skill, e.seen, e.bad)
        rows.append({"event": e.file, "skill": e.skill, "bad": e.bad, "decision": it["decision"], "why": it["why"],
                     "promoted": it["decision"] == "promoted", "truth": asdict(t) | {"good": t.good},
                     "champion_before": before, "candidate": candidate_acc, "champion": champion_acc,
                     "skill_slice": new, "seconds": round(time.monotonic() - start, 1)})
        say(progress(name, i, len(events), e, rows[-1]))
    return {"events": rows, **matrices(events, rows)}


def progress(name: str, i: int, total: int, e: Event, row: dict) -> str:
    what = "bad candidate" if e.bad else f"skill {e.skill + 1} {skills.SKILLS[e.skill].name!r}"
    gate = ""
    if row["skill_slice"]:
        x = row["skill_slice"]
        gate = f" (its slice {x['gain']:+.2f} [{x['low']:+.2f}, {x['high']:+.2f}] n={x['n']})"
    acc = " ".join(f"{a:.2f}" for a in row["champion"][: e.seen])
    truth = "good" if row["truth"]["good"] else "bad"
    return (f"[{name}] {i}/{total} {what}: {row['decision']}{gate}; candidate was {truth}; champion on the seen "
            f"skills [{acc}]; {row['seconds']:.0f} s")


def matrices(events: list[Event], rows: list[dict]) -> dict[str, Any]:
    """R of the champion and of the candidate: one row after each skill's own iteration."""
    at = [i for i, e in enumerate(events) if not e.bad]
    return {"R_champion": [rows[i]["champion"] for i in at], "R_candidate": [rows[i]["candidate"] for i in at]}


def run_joint(url: str, root: Path, events: list[Event], s: LoopSettings, default_loop: Path, tests: list[list],
              base: list[float]) -> dict[str, Any]:
    """After each skill: SFT from the base model on every training conversation the default loop had by then
    (the same data the loops saw, the bad batches' correct answers included), steps x skills seen."""
    from rlcli.loop import data, stages
    from rlcli.loop.ledger import opened

    rows = []
    (root / "joint").mkdir()
    for i, e in enumerate(events, 1):
        if e.bad:
            continue
        start = time.monotonic()
        with opened(default_loop) as ledger:
            seen = data.all_rows(default_loop, ledger, "train.jsonl", i)
        dataset = root / "joint" / f"train-{i}.jsonl"
        data.write_jsonl(dataset, seen)
        joint = replace(s, steps=s.steps * e.seen)
        with quiet(root / "joint" / "log.txt"):
            trainer, options = stages.stage("sft", root / "joint" / f"run-{i}", dataset, None, Champion(0), joint,
                                            url, False)
            made = trainer(options)
            acc = accuracy(url, Champion(i, made.sampler_path, made.state_path), tests, s)
        rows.append({"event": e.file, "skill": e.skill, "examples": len(seen), "steps": joint.steps, "accuracy": acc,
                     "seconds": round(time.monotonic() - start, 1)})
        say(f"[joint] after skill {e.skill + 1}: {len(seen)} conversations, {joint.steps} steps from the base "
            f"model; accuracy on the seen skills [{' '.join(f'{a:.2f}' for a in acc[: e.seen])}]; "
            f"{rows[-1]['seconds']:.0f} s")
    return {"runs": rows, "R": [r["accuracy"] for r in rows]}


# --- targets and the receipt --------------------------------------------------------------------------


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 46's targets on the default strategy, each met or not, with the figures it rests on."""
    rows = result["default"]["events"]
    taught = [r for r in rows if not r["bad"] and r["truth"]["learned"] and r["truth"]["kept"]]
    missed = [r["event"] for r in taught if not (r["promoted"] and r["skill_slice"] and r["skill_slice"]["low"] > 0)]
    bad = [r for r in rows if r["bad"]]
    summary = result["default"]["summary"]
    out = [{"target": "every iteration that teaches its skill (and keeps the others) is promoted, its slice's "
                      "interval above 0", "met": bool(taught) and not missed,
            "figures": {"taught": len(taught), "skill_iterations": sum(not r["bad"] for r in rows), "missed": missed}},
           {"target": "every bad candidate is rejected", "met": all(not r["promoted"] for r in bad),
            "figures": {"bad": len(bad), "promoted": [r["event"] for r in bad if r["promoted"]]}},
           {"target": "backward transfer of the default strategy >= -0.05", "met": summary["bwt"] >= -0.05,
            "figures": {"bwt": summary["bwt"]}}]
    if "joint" in result:
        gap = result["joint"]["summary"]["acc"] - summary["acc"]
        out.append({"target": "the default strategy's final average accuracy within 0.10 of joint training",
                    "met": gap <= 0.10, "figures": {"default_acc": summary["acc"],
                                                    "joint_acc": result["joint"]["summary"]["acc"], "gap": gap}})
    return out


def main(quick: bool = False, strategies: str | tuple = "default,new,distill,joint", label: str = "",
         out: str | None = None, keep: str | None = None, **settings: Any) -> dict[str, Any]:
    """Run the benchmark; `settings`: loop settings for every loop strategy (--steps 32 --lr 0.01 ...), over the
    defaults. keep: a folder to keep the loop folders in (default: a temporary one, removed)."""
    import tempfile

    from benchmarks.common import stop_servers_on_sigterm
    from rlcli.model import ensure_embedded_model
    from rlcli.server.private import private_server

    stop_servers_on_sigterm()
    os.environ.setdefault("TINKER_API_KEY", "tml-bench")
    listed = strategies.split(",") if isinstance(strategies, str) else strategies  # fire reads a,b as a tuple
    size, names = QUICK if quick else FULL, [str(x).strip() for x in listed if str(x).strip()]
    if unknown := [x for x in names if x not in STRATEGIES]:
        raise SystemExit(f"--strategies: unknown {unknown[0]!r}: choose from {', '.join(STRATEGIES)}")
    names = ["default", *(x for x in names if x != "default")]  # joint reads the default loop's data
    root = Path(keep or tempfile.mkdtemp(prefix="rlcli-continual-")).expanduser()
    started, load = time.monotonic(), os.getloadavg()
    try:
        with private_server(str(ensure_embedded_model())) as server:
            result = run_all(server.url, root, size, names, settings)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return finish(result, size, label, out, time.monotonic() - started, load)


def finish(result: dict[str, Any], size: Size, label: str, out: str | Path | None, seconds: float,
           load: tuple[float, ...] | None = None) -> dict[str, Any]:
    """The targets, the receipt (with the load average before and after: a shared machine's), the summary lines."""
    from benchmarks.common import versions, write_receipt
    from benchmarks.models import server_versions

    names = [x for x in STRATEGIES if x in result]
    result["targets"] = targets(result)
    body = {"label": label, "versions": {**versions("tinker", "tinker-cookbook"), "server": server_versions()},
            "config": {"sequence": asdict(size), "strategies": names, "settings": result.pop("settings"),
                       "skills": [{"name": s.name, "kind": s.kind, "example": s.pairs(1, 0)[0]}
                                  for s in skills.SKILLS[: size.skills]],
                       "truth": {"learned": measures.LEARNED, "kept": measures.KEPT},
                       "model": "rlcli-tiny-qwen3-v1", "device": "cpu"},
            "minutes": round(seconds / 60, 2),
            "load_average_1_5_15": {"before": load or os.getloadavg(), "after": os.getloadavg()}, **result}
    receipt = write_receipt("continual", body, Path(out) if out else None)
    for name in names:
        x = result[name]["summary"]
        say(f"{name}: ACC {x['acc']:.3f}, BWT {x['bwt']:+.3f}, FWT {x['fwt']:+.3f}"
            + (f"; gate {result[name]['decisions']}" if "decisions" in result[name] else ""))
    for t in result["targets"]:
        say(f"target {'met' if t['met'] else 'UNMET'}: {t['target']} {json.dumps(t['figures'])}")
    say(f"receipt: {receipt}")
    return {"receipt": str(receipt), **body}


def run_all(url: str, root: Path, size: Size, names: list[str], overrides: dict[str, Any]) -> dict[str, Any]:
    data, tests = root / "batches", fixed_tests(size)
    overrides = {"steps": size.steps, **overrides} if size.steps else overrides
    events = schedule(size, data)
    default = loop_settings(url, overrides, size)
    base = accuracy(url, Champion(0), tests, default)
    say(f"{len(events)} iterations ({size.skills} skills, {sum(e.bad for e in events)} bad candidates) x "
        f"{len(names)} strategies; base model on the skills [{' '.join(f'{a:.2f}' for a in base)}]")
    result: dict[str, Any] = {"base": base, "settings": {}}
    for name in names:
        if STRATEGIES[name] is None:
            got = run_joint(url, root, events, default, root / "default" / "loop", tests, base)
        else:
            s = loop_settings(url, {**overrides, **STRATEGIES[name]}, size)
            result["settings"][name] = {k: v for k, v in asdict(s).items() if k not in ("traces", "base_url")}
            got = run_loop(url, root, name, s, events, data, tests, base)
            truths = [(measures.Truth(**{k: v for k, v in r["truth"].items() if k != "good"}), r["promoted"])
                      for r in got["events"]]
            got["decisions"] = measures.decisions_table(truths)
        got["summary"] = measures.summary(got.get("R_champion", got.get("R")), base)
        if "R_candidate" in got:
            got["summary_candidate"] = measures.summary(got["R_candidate"], base)
        result[name] = got
    return result


if __name__ == "__main__":
    import fire

    fire.Fire(lambda **kw: main(**kw) and None)
