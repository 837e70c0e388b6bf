"""The README's map is the tree: every module, script and benchmark is findable from it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def map_block() -> str:
    """README.md's annotated file tree: the code block that starts at the Makefile."""
    return re.search(r"```\n(Makefile .*?)```", (REPO / "README.md").read_text(), re.S).group(1)


def test_every_module_and_script_is_on_the_map():
    tree = map_block()
    files = [*(REPO / "rlcli").rglob("*.py"), *(REPO / "scripts").glob("*"), *(REPO / "benchmarks").rglob("*.py")]
    missing = sorted(str(p.relative_to(REPO)) for p in files
                     if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts
                     and not re.search(rf"\b{re.escape(p.name)}\b", tree))
    assert missing == [], f"README.md's map lacks {missing}"


def test_every_package_is_on_the_map():
    tree = map_block()
    packages = sorted(p.parent.name for p in (REPO / "rlcli").rglob("__init__.py") if p.parent.name != "rlcli")
    assert [name for name in packages if f"{name}/" not in tree] == []
