"""`rlcli loop init|run|status|history|promote|rollback`: the continual-learning loop over one folder.

Launch:  rlcli loop init DIR --traces 'logs/*.jsonl' -f openai --train sft,distill --regression regression.jsonl
         rlcli loop run DIR --once                     (one iteration if new traces arrived; else says so)
         rlcli loop run DIR --watch --every 1h         (look for new traces every hour)
         rlcli loop status DIR | rlcli loop history DIR
         rlcli loop promote DIR ITER | rlcli loop rollback DIR [ITER]

One iteration: ingest -> split -> power -> train -> evaluate -> gate -> promote -> record (rlcli.loop.data,
rlcli.loop.evaluation and rlcli.loop.stages). The folder's lock lets one command at a time change it; the ledger
says what is done, so a killed `loop run` resumes the iteration it left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rlcli.config import private_dir
from rlcli.endpoint import capture
from rlcli.errors import UsageError
from rlcli.loop import champion, data, evaluation, gate, sessions, settings, stages
from rlcli.loop.ledger import Champion, Ledger, now, opened
from rlcli.loop.settings import LoopSettings
from rlcli.loop.stages import say
from rlcli.options import Opt, Record, option

LOCK = ".loop.lock"
DIR = Opt("the loop folder (`loop init` makes it: a new or empty one)")
ITERATION = Opt("an iteration: promote's candidate; rollback's earlier champion (0: the base model; default: the "
                "one before the current champion)", low=0)


@dataclass(frozen=True, kw_only=True)
class Folder(Record):
    """A loop command's one argument: its folder."""

    dir: str = DIR(positional=True)


@dataclass(frozen=True, kw_only=True)
class InitOptions(LoopSettings):
    """`rlcli loop init`'s options: loop.toml's settings, the folder and the regression set."""

    dir: str = DIR(positional=True)
    regression: str | None = option(None, "conversations (JSONL, as `rlcli import` writes) copied now and never "
                                          "changed: the regression set every candidate is checked on")


@dataclass(frozen=True, kw_only=True)
class RunOptions(Folder):
    once: bool = option(False, "at most one iteration, then exit (the default when --watch is not given)")
    watch: bool = option(False, "keep looking for new trace files, every --every")
    every: str = option("1h", "how often --watch looks: 90s, 15m, 1h, 1d")

    def problems(self) -> Iterator[str]:
        if self.once and self.watch:
            yield "--once and --watch exclude each other: pick one"


@dataclass(frozen=True, kw_only=True)
class PromoteOptions(Folder):
    iteration: int = ITERATION(positional=True)


@dataclass(frozen=True, kw_only=True)
class RollbackOptions(Folder):
    iteration: int | None = ITERATION(None, positional=True)


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[Ledger]:
    """The folder's lock for the whole command, then its ledger; a second command is refused in one line. Holding
    it, the server slots a killed command left are freed first, and the sessions this one opens are tagged."""
    settings.read(folder)
    with open(folder / LOCK, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UsageError(f"another `rlcli loop` command is using {folder} (pid {f.read().strip() or '?'}): "
                             "wait for it to finish, or stop it") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        url = _url(settings.read(folder))
        if freed := sessions.free(folder):  # the lock was free: whoever opened those sessions is gone
            say(f"freed {len(freed)} server LoRA slot{'s' * (len(freed) != 1)} a killed command left "
                f"({', '.join(freed)})")
        with sessions.tagged(folder, url), opened(folder) as ledger:
            yield ledger


def synced(folder: Path, ledger: Ledger) -> None:
    """DIR/champion and the hook caught up with the ledger's alias (a command killed mid-move left them behind)."""
    s = settings.read(folder)
    champion.sync(folder, ledger, s, _url(s))


def _folder(dir: str, must_exist: bool = True) -> Path:
    folder = Path(dir).expanduser().resolve()
    if must_exist:
        settings.read(folder)
    return folder


def init(o: InitOptions) -> int:
    """Make a loop folder: loop.toml (every setting; edit it later), the ledger, the frozen regression set."""
    folder = _folder(o.dir, must_exist=False)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder} exists and is not empty: pick a new loop folder")
    traces = str(o.traces)
    pattern = traces if Path(traces).is_absolute() else str(Path.cwd() / traces)
    given = {f.name: getattr(o, f.name) for f in fields(LoopSettings)} | {"traces": pattern}
    if traces.startswith(capture.CAPTURE_PREFIX):  # an endpoint's capture store: drained as rlcli's messages
        given |= {"traces": capture.CAPTURE_PREFIX + str(capture.store_dir(traces)), "format": "messages"}
    s = LoopSettings(**given)
    rows = data.check_regression(o.regression) if o.regression else []
    private_dir(folder)  # traces and answers: the user's data
    data.write_jsonl(folder / data.REGRESSION, rows)
    settings.write(folder, s)
    with opened(folder) as ledger:
        data.record_regression(ledger, rows)
        named = sorted({name for name, _ in ledger.problem_slices("regression").values()})
    kinds = f" (slices: {', '.join(repr(x) for x in named)})" if named else ""
    print(f"loop folder {folder}: settings in {folder / settings.FILE}; {len(rows)} regression conversations "
          f"frozen{kinds}; next: rlcli loop run {o.dir} --once")
    return 0


def _url(s: LoopSettings) -> str:
    from rlcli.config import resolve_base_url

    return resolve_base_url(s.base_url or None)


def _begin(ledger: Ledger, s: LoopSettings) -> int:
    n = ledger.last_iteration() + 1
    champ = ledger.champion()
    with ledger.transaction() as db:
        db.execute("INSERT INTO iterations (n, started, settings) VALUES (?, ?, ?)",
                   (n, now(), json.dumps({**asdict(s), "champion": asdict(champ)})))
    return n


def _recorded(ledger: Ledger, n: int) -> tuple[LoopSettings, Champion]:
    saved = json.loads(ledger.iteration(n)["settings"])
    champ = Champion(**saved.pop("champion"))
    return LoopSettings(**saved), champ


def run_once(folder: Path, ledger: Ledger) -> bool:
    """One iteration, or the rest of an unfinished one; False when there was nothing to do."""
    s = settings.read(folder)
    n = ledger.open_iteration()
    if n is None:
        files = data.new_files(ledger, s, folder)
        if not files:
            say(f"nothing new: no trace file under {s.traces} that was not ingested before "
                f"({len(ledger.files())} ingested); champion: {ledger.champion().label()}")
            return False
        n = _begin(ledger, s)
        say(f"iteration {n}: {len(files)} new trace file{'s' * (len(files) != 1)}")
    else:
        done = ledger.stages(n)
        say(f"iteration {n}: resuming after {done[-1] if done else 'its start'}")
    s, champ = _recorded(ledger, n)
    if ledger.stage(n, "ingest") is None:
        info = data.ingest(folder, ledger, n, s, data.new_files(ledger, s, folder))
        pairs = f", {info['pairs']} preference pairs" if info.get("pairs") else ""
        say(f"iteration {n}: ingested {info['lines']} lines of {info['files']} files -> {info['conversations']} "
            f"new conversations{pairs}")
    if ledger.stage(n, "split") is None:
        info = data.split(folder, ledger, n, s)
        say(f"iteration {n}: {info['train']} to train, {info['heldout']} held out")
    _advance(folder, ledger, n, s, champ)
    return True


def _advance(folder: Path, ledger: Ledger, n: int, s: LoopSettings, champ: Champion) -> None:
    split = ledger.stage(n, "split") or {}
    if not split.get("train"):
        with ledger.transaction() as db:
            ledger.finish(db, n, "skipped", "no new conversations to train on")
        say(f"iteration {n}: no new conversations to train on; nothing trained")
        return
    if ledger.stage(n, "power") is None:  # before any compute: what this evaluation can show at all
        found = evaluation.power(folder, ledger, n, s, champ)
        for line in evaluation.power_lines(found, s):
            say(f"iteration {n}: {line}")
        with ledger.transaction() as db:
            ledger.done(db, n, "power", found)
    url = _url(s)
    stages.train(folder, ledger, n, s, champ, url)
    if ledger.stage(n, "evaluate") is None:
        cand = stages.candidate(ledger, n, champ)
        assert cand is not None
        evaluation.evaluate(folder, ledger, n, s, champ, cand, url)
    heldout, regression, slices = evaluation.recorded(ledger, n)
    say(f"iteration {n}: held-out {heldout.describe()}; regression {regression.describe()}")
    for x in slices:
        say(f"iteration {n}: {'new ' if x.new else ''}slice {x.describe()}")
    if ledger.stage(n, "gate") is None:
        promote, why = _decide(s, heldout, regression, slices)
        if s.gate == "manual":
            promote, why = False, f"waiting for `rlcli loop promote` (the auto gate would say: {why})"
        with ledger.transaction() as db:
            ledger.done(db, n, "gate", {"promote": promote, "why": why, "manual": s.gate == "manual"})
    verdict = ledger.stage(n, "gate") or {}
    if verdict["promote"]:
        cand = stages.candidate(ledger, n, champ)
        assert cand is not None
        if ledger.stage(n, "promote") is None:  # a kill after it: the command's start finished the move (synced)
            stages.move_to(folder, ledger, cand, s, url, f"iteration {n} passed the gate", n)
    decision = "promoted" if verdict["promote"] else "pending" if verdict.get("manual") else "rejected"
    with ledger.transaction() as db:
        ledger.finish(db, n, decision, verdict["why"])
    say(f"iteration {n}: {decision}: {verdict['why']}")


def _decide(s: LoopSettings, heldout: gate.Comparison, regression: gate.Comparison,
            slices: list[gate.Slice]) -> tuple[bool, str]:
    """The pooled rule when asked for (or for an iteration evaluated before slices), else the per-slice one."""
    if s.gate == "pooled" or not slices:
        return gate.decide(heldout, regression, s.regression_margin)
    return gate.decide_slices(slices, s.regression_margin, s.confidence)


def parse_every(every: str) -> float:
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", every)
    if not found or float(found.group(1)) <= 0:
        raise UsageError(f"--every {every!r}: give a duration like 90s, 15m, 1h or 1d")
    return float(found.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[found.group(2)]


def run(o: RunOptions) -> int:
    """Run the loop: the unfinished iteration first, then one iteration per arrival of new trace files."""
    wait = parse_every(o.every)
    folder = _folder(o.dir)
    with locked(folder) as ledger:
        synced(folder, ledger)
        while True:
            did = run_once(folder, ledger)
            if not o.watch:
                return 0
            if not did:
                time.sleep(wait)


def promote(o: PromoteOptions) -> int:
    """Make an iteration's candidate the champion by hand (a manual gate's pending one, or a rejected one)."""
    folder, iteration, dir = _folder(o.dir), o.iteration, o.dir
    with locked(folder) as ledger:
        it = ledger.iteration(iteration)
        if it is None:
            raise UsageError(f"no iteration {iteration} in {folder}: `rlcli loop history {dir}` lists them")
        if it["finished"] is None or ledger.stage(iteration, "evaluate") is None:
            raise UsageError(f"iteration {iteration} is not finished (its candidate is not evaluated): "
                             f"`rlcli loop run {dir}` first")
        cand = stages.candidate(ledger, iteration)
        if cand is None:
            raise UsageError(f"iteration {iteration} trained no candidate ({it['decision']}): nothing to promote")
        synced(folder, ledger)
        if ledger.champion() == cand:  # a promote killed after the move: its decision still to record
            if it["decision"] != "promoted":
                with ledger.transaction() as db:
                    ledger.finish(db, iteration, "promoted", f"by hand; the gate said: {it['why']}")
            print(f"iteration {iteration} is the champion already")
            return 0
        s = settings.read(folder)  # today's export format and hook
        stages.move_to(folder, ledger, cand, s, _url(s), f"promoted by hand (gate: {it['why']})", iteration)
        with ledger.transaction() as db:
            ledger.finish(db, iteration, "promoted", f"by hand; the gate said: {it['why']}")
    return 0


def rollback(o: RollbackOptions) -> int:
    """Move the champion alias back: to the champion before the current one, or to ITER (0: the base model);
    DIR/champion is exported again and the hook runs."""
    folder, iteration = _folder(o.dir), o.iteration
    with locked(folder) as ledger:
        synced(folder, ledger)
        history = ledger.aliases()
        current = ledger.champion()
        earlier = [Champion(a["iteration"] or 0, a["sampler_path"], a["state_path"]) for a in history]
        earlier = [Champion(0), *earlier]
        if iteration is None:
            back = next((c for c in reversed(earlier) if c.iteration != current.iteration), None)
            if back is None:
                raise UsageError(f"{folder} has had one champion only ({current.label()}): nothing to roll back to")
        else:
            back = next((c for c in reversed(earlier) if c.iteration == iteration), None)
            if back is None:
                raise UsageError(f"iteration {iteration} was never champion: roll back to one of "
                                 f"{sorted({c.iteration for c in earlier})} (0: the base model)")
        if back == current:
            print(f"{current.label()} is the champion already")
            return 0
        s = settings.read(folder)
        stages.move_to(folder, ledger, back, s, _url(s), f"rollback from iteration {current.iteration}")
    return 0


def status(o: Folder) -> int:
    """The champion, the last iteration, and what is pending (an unfinished iteration, new files, promotions)."""
    from rlcli.loop.report import status_text

    folder = _folder(o.dir)
    with opened(folder) as ledger:
        print(status_text(folder, ledger, settings.read(folder)))
    return 0


def history(o: Folder) -> int:
    """Every iteration as a table: data in, runs, scores (champion -> candidate, with intervals), decision, why."""
    from rlcli.loop.report import history_table

    folder = _folder(o.dir)
    with opened(folder) as ledger:
        print(history_table(ledger))
    return 0
