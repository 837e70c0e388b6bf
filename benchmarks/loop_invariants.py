"""What a loop folder must show after any kill (and after the resume that follows it): the ledger's invariants.

`at_kill` is what a reader may see right after a kill, before anything resumes: a sound ledger, a champion folder
that is a whole export of some champion the alias has named, and the endpoint serving the ledger's champion.
`after_resume` adds what a completed resume owes: every trace line accounted for exactly once, no file ingested
twice, no iteration left open, and the champion folder, the served champion and the hook's last word all equal to
the ledger's. Each returns {check: problem} for the checks that failed ({} when all hold). Used by
benchmarks/kill_loop.py and tests/faults/test_loop_killed.py.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from rlcli.endpoint.models import CHAMPION, Models
from rlcli.export import ADAPTER_FILES
from rlcli.loop import data, stages
from rlcli.loop.ledger import Champion, opened


def at_kill(folder: Path) -> dict[str, str]:
    problems: dict[str, str] = {}
    db = sqlite3.connect(f"file:{folder / 'ledger.sqlite'}?mode=rw", uri=True, timeout=30)
    try:
        db.execute("PRAGMA query_only = ON")  # as the endpoint reads it (a killed writer's journal rolled back)
        if (ok := db.execute("PRAGMA integrity_check").fetchone()[0]) != "ok":
            problems["ledger_sound"] = ok
    finally:
        db.close()
    with opened(folder) as ledger:
        champ = ledger.champion()
        named = {a["sampler_path"] for a in ledger.aliases()} | {None}
    found = exported(folder)
    if isinstance(found, str):
        problems["champion_folder_whole"] = found
    elif found is not None and found.get("sampler_path") not in named:
        problems["champion_folder_whole"] = f"{stages.CHAMPION_DIR}/ holds {found} that the alias never named"
    if (served := served_champion(folder)) != champ:
        problems["served_is_ledger"] = f"the endpoint serves {served.label()}, the ledger says {champ.label()}"
    return problems


def after_resume(folder: Path, delivered: list[Path], hook_log: Path | None = None) -> dict[str, str]:
    problems = at_kill(folder)
    with opened(folder) as ledger:
        champ = ledger.champion()
        files = ledger.files()
        if (n := ledger.open_iteration()) is not None:
            problems["no_open_iteration"] = f"iteration {n} is still open"
        problems |= _lines_accounted(folder, ledger, files)
        for it in ledger.iterations():
            if it["decision"] == "promoted" and ledger.stage(it["n"], "promote") is None \
                    and not str(it["why"]).startswith("by hand"):
                problems["promotions_recorded"] = f"iteration {it['n']} promoted without its promote stage"
            if (ledger.stage(it["n"], "gate") or {}).get("promote") and it["decision"] != "promoted":
                problems["promotions_recorded"] = f"iteration {it['n']} passed the gate but is {it['decision']}"
        promoted = {it["n"] for it in ledger.iterations() if it["decision"] == "promoted"}
    problems |= _files_once(files, delivered)
    found = exported(folder)
    if not isinstance(found, str) and _named(found) != champ:
        problems["champion_folder_is_ledger"] = f"{stages.CHAMPION_DIR}/ holds {_named(found).label()}, " \
                                                f"the ledger says {champ.label()}"
    if champ.iteration and champ.iteration not in promoted:
        problems["champion_was_promoted"] = f"the champion, iteration {champ.iteration}, is not marked promoted"
    if hook_log is not None and champ.iteration and hook_log.is_file():
        last = hook_log.read_text().split()[-1:]
        if last != [str(champ.iteration)]:
            problems["hook_saw_champion"] = f"the hook's last run was for {last}, the champion is {champ.iteration}"
    return problems


def exported(folder: Path) -> dict[str, Any] | str | None:
    """The champion folder's rlcli-champion.json (None: no champion exported yet), or what makes it a half export."""
    out = folder / stages.CHAMPION_DIR
    if not out.exists() and not out.is_symlink():
        return None
    try:
        named = json.loads((out / stages.CHAMPION_FILE).read_text())
    except (OSError, ValueError) as e:
        return f"{stages.CHAMPION_DIR}/ has no readable {stages.CHAMPION_FILE} ({e.__class__.__name__})"
    if named.get("sampler_path") and named.get("format") == "peft":
        missing = [name for name in ADAPTER_FILES if not (out / name).is_file()]
        if missing:
            return f"{stages.CHAMPION_DIR}/ names iteration {named.get('iteration')} but lacks {', '.join(missing)}"
    return named


def _named(found: dict[str, Any] | None) -> Champion:
    if not found or not found.get("sampler_path"):
        return Champion(0)
    return Champion(found["iteration"], found["sampler_path"], found.get("state_path"))


def served_champion(folder: Path) -> Champion:
    """The loop's champion as `rlcli endpoint start --loops DIR` resolves its model `champion` for a request."""
    answer = Models("base", {}, [folder]).resolve(CHAMPION)
    if not answer.iteration or not answer.weights:
        return Champion(0)
    return Champion(answer.iteration, answer.weights, answer.state_path)


def _lines_accounted(folder: Path, ledger: Any, files: list[dict[str, Any]]) -> dict[str, str]:
    """Per file, lines = written + dropped and written = seen before + train + held-out; every kept conversation
    in exactly one iteration's new.jsonl and once in the ledger's conversations."""
    problems: dict[str, str] = {}
    for f in files:
        raw = [x for x in Path(f["path"]).read_text().splitlines() if x.strip()]
        if not f["lines"] == len(raw) == f["written"] + sum(f["dropped"].values()):
            problems["lines_accounted"] = f"{f['path']}: {len(raw)} lines, ledger {f['lines']} = {f['written']} " \
                                          f"written + {f['dropped']} dropped"
        elif f["written"] != f["duplicate"] + f["train"] + f["heldout"]:
            problems["lines_accounted"] = f"{f['path']}: written {f['written']} != {f['duplicate']} seen before + " \
                                          f"{f['train']} train + {f['heldout']} held out"
    hashes: list[str] = []
    for it in ledger.iterations():
        kept = data.read_jsonl(data.iteration_dir(folder, it["n"]) / "new.jsonl")
        hashes += [data.conversation_hash(c) for c in kept]
        mine = sum(f["written"] - f["duplicate"] for f in files if f["iteration"] == it["n"])
        split = len(data.read_jsonl(data.iteration_dir(folder, it["n"]) / "train.jsonl")) + \
            len(data.read_jsonl(data.iteration_dir(folder, it["n"]) / "heldout.jsonl"))
        if len(kept) != mine or split != mine:
            problems["lines_accounted"] = f"iteration {it['n']}: files say {mine} kept, new.jsonl {len(kept)}, " \
                                          f"train + held-out {split}"
    recorded = ledger.rows("SELECT COUNT(*) FROM conversations")[0][0]
    if len(hashes) != len(set(hashes)) or recorded != len(hashes):
        problems["conversations_once"] = f"{len(hashes)} kept conversations ({len(set(hashes))} distinct), " \
                                         f"{recorded} in the ledger"
    return problems


def _files_once(files: list[dict[str, Any]], delivered: list[Path]) -> dict[str, str]:
    digests = [hashlib.sha256(p.read_bytes()).hexdigest() for p in delivered]
    ingested = [f["sha256"] for f in files]
    if sorted(ingested) != sorted(set(digests)):
        return {"files_once": f"{len(delivered)} files delivered ({len(set(digests))} distinct), "
                              f"{len(ingested)} rows in the ledger ({len(set(ingested))} distinct)"}
    return {}
