"""benchmarks/retention.py: the tree keeps the newest receipt of each series and every cited one, nothing else."""

from __future__ import annotations

import json
import re

from benchmarks import report, retention
from tests.conftest import REPO


def test_the_tree_holds_only_the_receipts_the_rule_keeps():
    extra = [p.name for p in retention.surplus()]
    assert extra == [], f"{extra}: run `python -m benchmarks.retention --prune` (history stays in git)"


def test_every_receipt_a_document_cites_is_in_the_tree():
    cited = retention.Citations(retention.documents())
    present = {p.name for p in report.RECEIPTS.glob("*.json")} | {
        p.name for p in (REPO / "notebooks" / "results").glob("*.json")}
    stamped = sorted(n for n in cited.names if re.search(r"\d{8}T\d{6}Z\.json$", n))
    assert [n for n in stamped if n not in present] == []
    assert [t for t in cited.tails if not any(n.endswith(t) for n in present)] == []


def receipt(stamp: str, label: str = "", fms: str = "", size: str = "tiny") -> dict:
    hardware = {"cpu": "AMD EPYC", "cpu_count": 2}
    if fms:
        hardware["cpu_detail"] = {"family_model_stepping": fms, "vector": []}
    name = f"request-path-{label}" if label else "request-path"
    return {"benchmark": name, "label": label, "created_utc": stamp, "hardware": hardware, "config": {"size": size}}


def tree(tmp_path, receipts: dict[str, dict], doc: str = "") -> tuple:
    folder = tmp_path / "benchmarks" / "receipts"
    folder.mkdir(parents=True)
    for name, body in receipts.items():
        (folder / name).write_text(json.dumps(body))
    (folder / "half-written-20261201T000000Z.json").write_text('{"benchmark": ')
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "decisions.md").write_text(doc)
    return folder, tmp_path


def test_the_rule_keeps_the_newest_per_model_and_machine_whatever_the_label_and_what_is_cited(tmp_path):
    folder, root = tree(tmp_path, {
        "a-old.json": receipt("20261201T000000Z", "a", "25/17/1"),
        "a-new.json": receipt("20261202T000000Z", "a", "25/17/1"),
        "a-other-cpu.json": receipt("20261201T000000Z", "a", "26/2/1"),
        "a-large.json": receipt("20261201T000000Z", "a", "25/17/1", size="large"),
        "b.json": receipt("20261130T000000Z", "b", "25/17/1"),
        "a-unnamed-cpu.json": receipt("20261130T000000Z", "a"),
        "c-unnamed-cpu.json": receipt("20261130T000000Z", "c"),
        "c-cited-old-20261129T101010Z.json": receipt("20261129T101010Z", "c"),
        "c-broken-20261129T111111Z.json": receipt("20261129T111111Z", "c"),
        "c-tail-20261129T121212Z.json": receipt("20261129T121212Z", "c"),
    }, doc="Measured (`c-cited-old-20261129T101010Z.json`, `c-broken-\n  20261129T111111Z.json`, `...-tail-"
           "20261129T121212Z.json`).")
    # b is the same benchmark, model and machine as a-new under another label: a-new, the newer, supersedes it
    assert sorted(p.name for p in retention.surplus(folder, root)) == ["a-old.json", "a-unnamed-cpu.json", "b.json",
                                                                      "c-unnamed-cpu.json"]


def test_prune_deletes_what_the_rule_does_not_keep_and_says_so(tmp_path, capsys):
    folder, root = tree(tmp_path, {"old.json": receipt("20261201T000000Z", "a"),
                                   "new.json": receipt("20261202T000000Z", "a")})
    assert retention.main(["--receipts", str(folder)]) == 1  # only lists
    assert (folder / "old.json").exists() and "not kept: old.json" in capsys.readouterr().out
    assert retention.main(["--receipts", str(folder), "--prune"]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["half-written-20261201T000000Z.json", "new.json"]
    assert retention.main(["--receipts", str(folder)]) == 0
