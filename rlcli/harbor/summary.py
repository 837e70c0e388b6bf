"""`harbor run`'s closing table: one row per task, readable at a glance (results.jsonl keeps every rollout).

    task          network     image   reward  pass@4     time  note
    hello-file    public      ok      0.750   1 (3/4)    2.1s
    multi-key     no-network  ok      0.000   0 (0/4)    1.9s  grading error: ...
    broken-build  no-network  FAILED  -       -          -     ...returned a non-zero code: 1
    allowlist     -           -       -       -          -     skipped: network_mode = "allowlist" ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

NOTE_WIDTH = 160


def _note(records: list[Any]) -> str:
    for r in records:
        if r.error:
            return f"error: {r.error}"
    for r in records:
        if r.grading_error:
            return f"grading error: {r.grading_error}"
    notes = [r.aborted for r in records if r.aborted] + [f"not applied: {'; '.join(r.notes)}"
                                                          for r in records[:1] if r.notes]
    return notes[0] if notes else ""


def task_rows(tasks: list[Any], records: list[Any], unbuilt: dict[str, str], rollouts: int) -> list[list[str]]:
    rows = []
    for task in tasks:
        if task.name in unbuilt:
            why = unbuilt[task.name].removeprefix(f"building the image of task {task.name} failed: ")
            rows.append([task.name, task.describe_network(), "FAILED", "-", "-", "-",
                         why if len(why) <= NOTE_WIDTH else "..." + why[-NOTE_WIDTH + 3:]])
            continue
        mine = [r for r in records if r.task == task.name]
        if not mine:
            continue
        mean = sum(r.reward for r in mine) / len(mine)
        passed = sum(1 for r in mine if r.reward >= 1.0 and not r.error)
        seconds = sum(r.seconds for r in mine) / len(mine)
        rows.append([task.name, mine[0].network, "ok", f"{mean:.3f}", f"{int(passed > 0)} ({passed}/{len(mine)})",
                     f"{seconds:.1f}s", _note(mine)])
    if rollouts == 1:
        for row in rows:
            del row[4]
    return rows


def summary_table(tasks: list[Any], records: list[Any], unbuilt: dict[str, str], skipped: list[tuple[str, str]],
                  rollouts: int) -> str:
    header = ["task", "network", "image", "reward", f"pass@{rollouts}", "time", "note"]
    if rollouts == 1:
        del header[4]
    rows = task_rows(tasks, records, unbuilt, rollouts)
    blank = ["-"] * (len(header) - 2)
    rows += [[Path(folder).name, *blank, "skipped: " + why.removeprefix(f"{folder}: ")] for folder, why in skipped]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1][:NOTE_WIDTH]
             for r in [header, *rows]]
    graded = [r for r in records if not r.error]
    passed = sum(1 for r in graded if r.reward >= 1.0)
    mean = sum(r.reward for r in records) / len(records) if records else 0.0
    errors = sum(1 for r in records if r.grading_error)
    lines.append(f"{passed}/{len(records)} rollouts passed, mean reward {mean:.3f}, {errors} grading error"
                 f"{'s' * (errors != 1)}, {len(records) - len(graded)} failed rollouts, {len(unbuilt)} tasks whose "
                 f"image could not be made, {len(skipped)} folders skipped")
    return "\n".join(lines)
