"""Run by the server venv's Python after each install into it (stdlib only): every distribution gets a top_level.txt
holding the import names Python would otherwise work out from its file list at every start (transformers'
packages_distributions() stats every file of a distribution without one: 0.9-1.4 s of each engine start). `--check`
writes nothing and reports. docs/decisions.md, "The server venv's packages declare their import names".
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import sys
import time
from pathlib import Path


def inferred_names(dist: importlib.metadata.Distribution) -> list[str]:
    """The import names the standard library infers for a distribution that declares none."""
    names = set()
    for file in dist.files or ():  # on 3.12, only the files that exist (as the standard library lists them)
        parts = file.parts
        name = parts[0] if len(parts) > 1 else (inspect.getmodulename(str(file)) or str(file))
        if "." not in name:
            names.add(name)
    return sorted(names)


def _declares(dist: importlib.metadata.Distribution) -> bool:
    return bool((dist.read_text("top_level.txt") or "").split())


def write(site: Path) -> tuple[int, list[str]]:
    """Write the missing files under one site-packages folder: how many were written, and a line for each
    distribution that could not be given one (the others are written all the same)."""
    written, failed = 0, []
    for dist in importlib.metadata.distributions(path=[str(site)]):
        info = Path(str(dist._path)) if hasattr(dist, "_path") else None  # a dist-info folder on disk
        if info is None or info.suffix != ".dist-info":
            continue
        try:
            written += _write_one(dist, info)
        except (OSError, UnicodeDecodeError) as e:
            failed.append(f"{info.name}: {e}")
    return written, failed


def _write_one(dist: importlib.metadata.Distribution, info: Path) -> int:
    if _declares(dist):
        return 0
    names = inferred_names(dist)
    if not names:
        return 0
    # Names come from the RECORD, so there is one. Listed first: a file it does not name would outlive an uninstall.
    record, line = info / "RECORD", f"{info.name}/top_level.txt,,"
    text = record.read_text()
    if line not in text.splitlines():
        with record.open("a") as f:
            f.write(("" if text.endswith("\n") or not text else "\n") + line + "\n")
    tmp = info / f".top_level.txt.{os.getpid()}"
    tmp.write_text("".join(f"{n}\n" for n in names))
    os.replace(tmp, info / "top_level.txt")
    return 1


def main(argv: list[str]) -> int:
    check = argv[:1] == ["--check"]
    sites = [Path(p) for p in argv[1:] if p] if check else [Path(p) for p in argv if p]
    if not sites:
        print("usage: top_level_names.py [--check] SITE_PACKAGES...", file=sys.stderr)
        return 2
    if check:
        start = time.perf_counter()
        importlib.metadata.packages_distributions()
        took = time.perf_counter() - start
        missing = [d.metadata["Name"] for s in sites for d in importlib.metadata.distributions(path=[str(s)])
                   if not _declares(d) and inferred_names(d)]
        print(f"packages_distributions {took:.3f}s; without top_level.txt: {len(missing)} {sorted(missing)[:10]}")
        return 1 if missing else 0
    written, failed = 0, []
    for site in sites:
        count, errors = write(site)
        written, failed = written + count, failed + errors
    print(written)
    for line in failed:
        print(f"not written: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
