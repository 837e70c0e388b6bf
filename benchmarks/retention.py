"""Which receipts the tree keeps; the rest is history, and git holds it.

    .venv/bin/python -m benchmarks.retention            # what the rule would delete (exit 1 when anything)
    .venv/bin/python -m benchmarks.retention --prune    # delete it (`make bench` does, after the table)

The rule: keep
1. the newest receipt of each series (benchmarks/report.py's Series without its --label: the benchmark, the
   model size or log format, a notebook's apart, the machine; one that names no machine only while no newer
   receipt of its series names one): a label names a run, not a series, and a labelled run that a decision rests
   on (an A/B, a before and after) is kept by the citation below, and
2. every receipt a document cites: README.md, the markdown under docs/, benchmarks/ and notebooks/, and the
   notebooks. A citation may shorten a name to its tail after "..." (`...-ab2-20261203T070818Z.json`).
Delete the rest. Every receipt ever committed stays in git: `git log --stat -- benchmarks/receipts/`
(benchmarks/README.md names the last commit that held them all).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks.report import RECEIPTS, ROOT, load_receipts, newest


def documents(root: Path = ROOT) -> str:
    """The text of every document that may cite a receipt."""
    paths = [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "benchmarks").rglob("*.md"),
             *(root / "notebooks").rglob("*.md"), *(root / "notebooks").rglob("*.ipynb")]
    return "\n".join(p.read_text(errors="replace") for p in paths if p.is_file())


class Citations:
    """The receipt names a text cites: whole (`server-start-20261202T134156Z.json`) or as a tail after "..."
    (`...-ab2-20261202T202524Z.json`, `...T033422Z.json`), a name broken after a hyphen at a line's end too."""

    def __init__(self, text: str):
        joined = re.sub(r"-\n\s*", "-", text)
        self.names = set(re.findall(r"(?<![\w.-])[\w-][\w.-]*\.json", joined))
        self.tails = re.findall(r"\.\.\.([\w-][\w.-]*\d{6}Z\.json)", joined)

    def __contains__(self, name: object) -> bool:
        return name in self.names or any(str(name).endswith(tail) for tail in self.tails)


def kept(receipts: list[dict], text: str) -> set[str]:
    """The file names of the receipts the rule keeps (receipts as report.load_receipts reads them)."""
    cited = Citations(text)
    kept = {r["_file"] for r in newest(receipts, by_label=False)}
    return kept | {r["_file"] for r in receipts if r["_file"] in cited}


def surplus(folder: Path = RECEIPTS, root: Path = ROOT) -> list[Path]:
    """The receipts in folder that the rule deletes (a file that does not parse is no receipt: left alone)."""
    receipts = load_receipts(folder)
    keep = kept(receipts, documents(root))
    return sorted(folder / r["_file"] for r in receipts if r["_file"] not in keep)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prune", action="store_true", help="delete the receipts the rule does not keep")
    parser.add_argument("--receipts", default=str(RECEIPTS),
                        help="a checkout's benchmarks/receipts folder; its documents are that checkout's")
    args = parser.parse_args(argv)
    folder = Path(args.receipts)
    extra = surplus(folder, folder.parent.parent)  # cited by the documents beside them, not this checkout's
    for path in extra:
        if args.prune:
            path.unlink()
        print(f"{'deleted' if args.prune else 'not kept'}: {path.name}")
    left = sorted(Path(args.receipts).glob("*.json"))
    print(f"{len(left)} receipts, {sum(p.stat().st_size for p in left):,} bytes")
    return 1 if extra and not args.prune else 0


if __name__ == "__main__":
    sys.exit(main())
