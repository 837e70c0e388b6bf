"""The loop's data stages: ingest (new trace files through `rlcli import`, each once, every line counted) and
split (new conversations into train and the growing held-out set, by a stable hash of the prompt).

Files of the loop folder: iterations/N/new.jsonl (what iteration N ingested, after dropping conversations an
earlier file already brought), iterations/N/train.jsonl and iterations/N/heldout.jsonl (its split), and
regression.jsonl (the frozen set `loop init` copied). The split also records each held-out problem's slice
(rlcli.loop.slices) in the ledger.
"""

from __future__ import annotations

import glob
import hashlib
import json
import random
from pathlib import Path
from typing import Any

from rlcli.errors import UsageError
from rlcli.loop.ledger import Ledger, now
from rlcli.loop.settings import LoopSettings

REGRESSION = "regression.jsonl"
PAIRS = "pairs.jsonl"  # iterations/N/pairs.jsonl: the preference pairs its files brought (the dpo stage's data)
PAIRS_SUFFIX = ".pairs.jsonl"  # a drained capture file's pairs, beside it


def iteration_dir(folder: Path, n: int) -> Path:
    return folder / "iterations" / f"{n:04d}"


CAPTURED = "captured"  # DIR/captured: what the loop drained from an endpoint's capture store (traces capture:DIR)


def trace_files(s: LoopSettings, folder: Path | None = None) -> list[Path]:
    """The files the traces setting names now: a folder's *.jsonl (and .jsonl.gz), or a glob's matches. With
    traces capture:STORE, the exchanges the store recorded since the last drain are first written to
    DIR/captured (given the loop's folder; without it, none are listed: `loop status` drains nothing)."""
    from rlcli.endpoint import capture

    if s.traces.startswith(capture.CAPTURE_PREFIX):
        if folder is None:
            return []
        out = folder / CAPTURED
        capture.drain(capture.store_dir(s.traces), out)
        return sorted(p for p in out.glob("capture-*.jsonl") if not p.name.endswith(PAIRS_SUFFIX))
    root = Path(s.traces).expanduser()
    if root.is_dir():
        found = [*root.glob("*.jsonl"), *root.glob("*.jsonl.gz")]
    else:
        found = [Path(p) for p in glob.glob(str(root))]
    return sorted(p for p in found if p.is_file())


def pairs_beside(path: Path) -> Path:
    """A drained capture file's preference pairs: capture-R.jsonl -> capture-R.pairs.jsonl."""
    return path.with_name(path.name.removesuffix(".jsonl") + PAIRS_SUFFIX)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def new_files(ledger: Ledger, s: LoopSettings, folder: Path | None = None) -> list[tuple[Path, str]]:
    """(path, content hash) of the files never ingested, each content once (a copy under another name is
    the same file)."""
    out, hashes = [], set()
    for path in trace_files(s, folder):
        digest = sha256_of(path)
        if digest not in hashes and not ledger.known_file(digest):
            hashes.add(digest)
            out.append((path, digest))
    return out


def conversation_hash(conv: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(conv, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()] \
        if path.is_file() else []


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    from rlcli.files import staged_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with staged_file(path, shared=False) as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())


def ingest(folder: Path, ledger: Ledger, n: int, s: LoopSettings, files: list[tuple[Path, str]]) -> dict[str, Any]:
    """Import each file (redaction and dedupe as set), drop conversations already ingested, record it all in
    one transaction: the files' rows, the conversations' hashes, the stage."""
    from rlcli.data.import_cmd import Run, convert
    from rlcli.data.messages import Options

    kept: list[dict[str, Any]] = []
    rows, hashes = [], set()
    tmp = iteration_dir(folder, n) / "import.part.jsonl"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    for path, digest in files:
        run = Run(Options(False, False, s.redact, s.dedupe), skip_bad=True)  # unattended: count, never stop
        stats = convert(run, str(path), s.format, str(tmp))
        convs = read_jsonl(tmp)
        fresh = [c for c in convs if conversation_hash(c) not in hashes]
        hashes |= {conversation_hash(c) for c in convs}
        before = ledger.seen([conversation_hash(c) for c in fresh])
        fresh = [c for c in fresh if conversation_hash(c) not in before]
        kept += fresh
        rows.append((digest, str(path), n, stats.read, stats.written, json.dumps(dict(stats.dropped)),
                     stats.written - len(fresh)))
    tmp.unlink(missing_ok=True)
    write_jsonl(iteration_dir(folder, n) / "new.jsonl", kept)
    pairs = [p for path, _ in files for p in read_jsonl(pairs_beside(path))]
    if pairs:  # beside pairs put there otherwise; a resumed ingest adds none twice
        target = iteration_dir(folder, n) / PAIRS
        had = read_jsonl(target)
        seen = {json.dumps(p, sort_keys=True) for p in had}
        write_jsonl(target, had + [p for p in pairs if json.dumps(p, sort_keys=True) not in seen])
    info = {"files": len(files), "lines": sum(r[3] for r in rows), "conversations": len(kept), "pairs": len(pairs)}
    with ledger.transaction() as db:
        for r in rows:
            db.execute("INSERT INTO files (sha256, path, iteration, lines, written, dropped, duplicate, at) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (*r, now()))
        db.executemany("INSERT OR IGNORE INTO conversations VALUES (?, ?)", [(conversation_hash(c), n) for c in kept])
        ledger.done(db, n, "ingest", info)
    return info


def prompt_of(conv: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation before its last assistant turn: what the held-out split hashes."""
    messages = conv["messages"]
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
    return messages[:last]


def rated_bad(conv: dict[str, Any]) -> bool:
    """A conversation whose reply was judged bad (an endpoint's rating, a log's feedback score): never a held-out
    problem's reference, never imitated by sft; rl's verdict reward learns from it."""
    from rlcli.problems.rewards import GOOD_SCORE

    score = conv.get("score")
    return isinstance(score, int | float) and score < GOOD_SCORE


def held_out(conv: dict[str, Any], share: float) -> bool:
    """Stable: the first 8 bytes of the prompt's SHA-256 as a fraction below share."""
    from rlcli.problems.traces import prompt_key

    return int(prompt_key(prompt_of(conv))[:16], 16) / 16**16 < share


def split(folder: Path, ledger: Ledger, n: int, s: LoopSettings) -> dict[str, Any]:
    """New conversations into train and held-out; a prompt held out before stays held out (same hash). Each
    held-out problem's slice is recorded with it."""
    convs = read_jsonl(iteration_dir(folder, n) / "new.jsonl")
    flags = [held_out(c, s.heldout_share) and not rated_bad(c) for c in convs]
    test = [c for c, held in zip(convs, flags, strict=True) if held]
    train = [c for c, held in zip(convs, flags, strict=True) if not held]
    write_jsonl(iteration_dir(folder, n) / "train.jsonl", train)
    write_jsonl(iteration_dir(folder, n) / "heldout.jsonl", test)
    info = {"train": len(train), "heldout": len(test)}
    owners = _owners(ledger, n)
    counts: dict[str, list[int]] = {}  # per file: its share of train and held-out (files in ingest order)
    for path, held in zip(owners, flags, strict=True):
        counts.setdefault(path, [0, 0])[held] += 1
    with ledger.transaction() as db:
        for path, (tr, he) in counts.items():
            db.execute("UPDATE files SET train = ?, heldout = ? WHERE iteration = ? AND path = ?", (tr, he, n, path))
        record_slices(ledger, db, n, convs, owners, flags)
        ledger.done(db, n, "split", info)
    return info


def _owners(ledger: Ledger, n: int) -> list[str]:
    """The file each of iteration n's kept conversations came from: they are kept in file order, so a file's
    count of kept conversations (written - duplicate) says which ones are its."""
    return [f["path"] for f in ledger.files(n) for _ in range(f["written"] - f["duplicate"])]


def record_slices(ledger: Ledger, db: Any, n: int, convs: list[dict[str, Any]], owners: list[str],
                  flags: list[bool]) -> None:
    """Record the slice of each held-out conversation of iteration n (rlcli.loop.slices: its tag, its template,
    or its file at iteration n); templates are counted over all of the iteration's new conversations."""
    from rlcli.loop import slices
    from rlcli.problems.traces import prompt_key

    known = {name for name, _ in ledger.problem_slices("heldout").values()}
    known |= {name for name, _ in ledger.problem_slices("regression").values()}
    names = slices.assign(convs, [slices.file_slice(path, n) for path in owners], known)
    ledger.record_problems(db, "heldout", [(prompt_key(prompt_of(c)), name, n)
                                           for c, name, held in zip(convs, names, flags, strict=True) if held])


def slices_before(folder: Path, ledger: Ledger, upto: int) -> None:
    """Record the slices of split iterations up to `upto` that have none (a loop folder made before slices)."""
    recorded = {it for _, it in ledger.problem_slices("heldout").values()}
    for it in ledger.iterations():
        m = it["n"]
        if m <= upto and m not in recorded and ledger.stage(m, "split") is not None:
            convs = read_jsonl(iteration_dir(folder, m) / "new.jsonl")
            share = ledger_share(ledger, m)
            with ledger.transaction() as db:
                record_slices(ledger, db, m, convs, _owners(ledger, m), [held_out(c, share) for c in convs])


def record_regression(ledger: Ledger, rows: list[dict[str, Any]]) -> None:
    """Record the regression set's slices (its tags or templates, else "regression"), once."""
    from rlcli.loop import slices
    from rlcli.problems.traces import prompt_key

    if ledger.problem_slices("regression") or not rows:
        return
    names = slices.assign(rows, [slices.REGRESSION] * len(rows), set())
    with ledger.transaction() as db:
        ledger.record_problems(db, "regression", [(prompt_key(prompt_of(r)), name, 0)
                                                  for r, name in zip(rows, names, strict=True)])


def ledger_share(ledger: Ledger, n: int) -> float:
    return json.loads(ledger.iteration(n)["settings"])["heldout_share"]


def all_rows(folder: Path, ledger: Ledger, name: str, upto: int) -> list[dict[str, Any]]:
    """train.jsonl or heldout.jsonl of every split iteration up to `upto`, in order."""
    rows = []
    for it in ledger.iterations():
        if it["n"] <= upto and ledger.stage(it["n"], "split") is not None:
            rows += read_jsonl(iteration_dir(folder, it["n"]) / name)
    return rows


def replay_mix(new: list[dict[str, Any]], earlier: list[dict[str, Any]], share: float,
               seed: int) -> list[dict[str, Any]]:
    """This iteration's rows and earlier ones drawn so that `share` of the result is earlier data (each earlier row
    at most once while there are enough, cycled beyond), shuffled: a fixed replay ratio, so that a new skill keeps
    its part of the steps however many iterations came before (in proportion, its part shrinks as 1/iterations)."""
    if not new or not earlier or share <= 0:
        return [*earlier, *new]
    count = round(len(new) * share / (1 - share))
    rng = random.Random(seed)
    pool = earlier[:]
    rng.shuffle(pool)
    mixed = [*new, *(pool[i % len(pool)] for i in range(count))]
    rng.shuffle(mixed)
    return mixed


def shuffled_answers(rows: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The same chats with their last replies moved to other chats (a deliberately bad training set)."""
    rows = [r for r in rows if prompt_reply(r)[1]]
    if len(rows) < 2:
        return rows
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    out = []
    for i, j in enumerate(order):
        donor = rows[order[(i + 1) % len(order)]]  # the next chat in the shuffled order gives its reply
        out.append({**rows[j], "messages": [*prompt_of(rows[j]), prompt_reply(donor)[1]]})
    return out


def prompt_reply(conv: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    messages = conv["messages"]
    return prompt_of(conv), messages[len(prompt_of(conv))] if len(prompt_of(conv)) < len(messages) else {}


def check_regression(source: str) -> list[dict[str, Any]]:
    path = Path(source).expanduser()
    if not path.is_file():
        raise UsageError(f"--regression {source}: no such file: pass a JSONL file of conversations")
    try:
        rows = read_jsonl(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise UsageError(f"--regression {source}: not JSONL ({e}): pass conversations as `rlcli import` "
                         "writes them") from None
    if not rows or any(not isinstance(r, dict) or not isinstance(r.get("messages"), list) for r in rows):
        raise UsageError(f"--regression {source}: every line must be {{\"messages\": [...]}}, as `rlcli import` "
                         "writes (and at least one line)")
    return rows
