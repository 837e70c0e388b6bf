"""What `loop status` and `loop history` print, read from the ledger (no server, no model): a row per iteration,
and under it each slice's champion -> candidate, gain, interval and n (new: a slice whose gain could promote;
gained / fell: what the auto gate read from it)."""

from __future__ import annotations

import json
from pathlib import Path

from rlcli.loop import data
from rlcli.loop.ledger import Ledger
from rlcli.loop.settings import LoopSettings

SLICE_COLUMNS = ("slice", "", "champ->cand", "gain [interval]", "n", "gate")
COLUMNS = ("iter", "files", "lines", "dropped", "seen", "train", "held", "runs", "held-out champ->cand [CI]",
           "regression champ->cand", "decision", "why")


def _scores(ledger: Ledger, n: int) -> tuple[str, str]:
    found = ledger.stage(n, "evaluate")
    if not found:
        return "-", "-"
    h, r = found["heldout"], found["regression"]
    held = f"{h['champion']:.2f}->{h['candidate']:.2f} [{h['low']:+.2f},{h['high']:+.2f}] n={h['n']}"
    reg = f"{r['champion']:.2f}->{r['candidate']:.2f} n={r['n']}" if r["n"] else "-"
    return held, reg


def history_rows(ledger: Ledger) -> list[tuple[str, ...]]:
    rows = []
    for it in ledger.iterations():
        n = it["n"]
        files = ledger.files(n)
        runs = "+".join(r["kind"] for r in ledger.runs(n)) or "-"
        held, reg = _scores(ledger, n)
        dropped = sum(sum(f["dropped"].values()) for f in files)
        rows.append((str(n), str(len(files)), str(sum(f["lines"] for f in files)), str(dropped),
                     str(sum(f["duplicate"] for f in files)), str(sum(f["train"] for f in files)),
                     str(sum(f["heldout"] for f in files)), runs, held, reg, it["decision"] or "running",
                     it["why"] or ""))
    return rows


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *(line(r) for r in rows)])


def slice_lines(ledger: Ledger, n: int, indent: str = "    ") -> list[str]:
    """Iteration n's slices, one line each (none before its evaluation, or in a ledger written before slices)."""
    from rlcli.loop.gate import Slice

    found = [Slice(**x) for x in (ledger.stage(n, "evaluate") or {}).get("slices", [])]
    if not found:
        return []
    margin = json.loads(ledger.iteration(n)["settings"])["regression_margin"]
    rows = [(x.name, "new" if x.new else "", f"{x.champion:.2f}->{x.candidate:.2f}",
             f"{x.gain:+.2f} [{x.low:+.2f},{x.high:+.2f}]", f"n={x.n}",
             "gained" if x.gained() else "fell" if x.fell(margin) else "")
            for x in found]
    header = f"{indent}slices at {found[0].confidence:.2%} each:"
    return [header, *(indent + "  " + line for line in table(SLICE_COLUMNS, rows).splitlines())]


def history_table(ledger: Ledger) -> str:
    rows = history_rows(ledger)
    text = table(COLUMNS, rows) if rows else "no iterations yet: `rlcli loop run DIR --once`"
    per_slice = [(r[0], slice_lines(ledger, int(r[0]))) for r in rows]
    if any(lines for _, lines in per_slice):
        text += "\n\nper slice:\n" + "\n".join(f"  iteration {n}\n" + "\n".join(lines)
                                                for n, lines in per_slice if lines)
    moves = ledger.aliases()
    if moves:
        text += "\n\nchampion alias:\n" + "\n".join(
            f"  {a['at']}  -> {'base model' if not a['iteration'] else 'iteration ' + str(a['iteration'])}  "
            f"({a['reason']})" for a in moves)
    return text


def status_text(folder: Path, ledger: Ledger, s: LoopSettings) -> str:
    champ = ledger.champion()
    lines = [f"loop {folder}", f"champion: {champ.label()}"]
    last = ledger.iterations()[-1:] or [None]
    if last[0]:
        it = last[0]
        lines.append(f"last iteration: {it['n']} ({it['decision'] or 'unfinished'}"
                     f"{': ' + it['why'] if it['why'] else ''})")
        lines += slice_lines(ledger, it["n"], indent="  ")
    else:
        lines.append("last iteration: none yet")
    if (n := ledger.open_iteration()) is not None:
        done = ledger.stages(n)
        lines.append(f"pending: iteration {n} stopped after {done[-1] if done else 'its start'}: "
                     "`rlcli loop run` resumes it")
    waiting = [it["n"] for it in ledger.iterations() if it["decision"] == "pending"]
    if waiting:
        lines.append(f"pending: candidates waiting for `rlcli loop promote`: iterations {waiting}")
    new = data.new_files(ledger, s)
    names = ", ".join(p.name for p, _ in new[:5])
    lines.append(f"new trace files waiting: {len(new)}" + (f" ({names})" if new else ""))
    lines.append(f"settings: train {s.train}, gate {s.gate}, match {s.match}, export {s.export_format}")
    return "\n".join(lines)
