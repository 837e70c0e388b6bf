"""rlcli's structure, measured: import cycles, imports against the layers, flags declared more than once.

tests/unit/test_structure.py holds each figure at zero; run this file for the figures themselves, on this tree or
another checkout (the issue's before -> after):

    python tests/structure.py [ROOT]            # ROOT: a checkout of rlcli (default: this one)

Imports are read from the source (ast): top-level and inside functions, TYPE_CHECKING ones too, so a lazy import
hides nothing. The server's runtime (rlcli/server/runtime/) is left out: it runs in the server venv, loaded by
path, and imports no client module.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# rlcli's layers, lowest first: a module imports only from its own layer or lower ones. A module belongs to the
# layer of the longest prefix that names it ("rlcli" names the package's own __init__ only).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("rlcli.errors", "rlcli.config", "rlcli.files", "rlcli.lean_imports", "rlcli.options",
              "rlcli.locks")),
    ("data", ("rlcli.data",)),
    ("server", ("rlcli.client", "rlcli.slots", "rlcli.slot_wait", "rlcli.watchdog", "rlcli.server", "rlcli.tenants",
                "rlcli.passthrough", "rlcli.model", "rlcli.sample", "rlcli.export", "rlcli.endpoint.commands")),
    ("problems", ("rlcli.problems",)),
    ("train", ("rlcli.train", "rlcli.harbor", "rlcli.model.recipe", "rlcli.model.pretrain")),
    ("endpoint", ("rlcli.endpoint",)),  # its processes (endpoint.commands) are the server layer's: serve stop ends them
    ("loop", ("rlcli.loop",)),
    # The package itself: importing it sets the process up (rlcli/__init__.py), as the entry points do.
    ("commands", ("rlcli", "rlcli.__main__", "rlcli.cli", "rlcli.scripting", "rlcli.evaluate", "rlcli.demo",
                  "rlcli.doctor", "rlcli.lab")),
]
SKIPPED = ("rlcli.server.runtime",)


def modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted((root / "rlcli").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not name.startswith(SKIPPED):
            found[name] = path
    return found


def _target(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(root: Path) -> dict[str, set[str]]:
    """{module: the rlcli modules it imports}, wherever in the module the import statement is."""
    known = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {_target(a.name, known) for a in node.names if a.name.startswith("rlcli")}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                if base.startswith("rlcli"):
                    found |= {_target(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, known)
                              for a in node.names}
        graph[name] = {m for m in found if m and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan): each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                groups.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def cycle_count(graph: dict[str, set[str]]) -> int:
    """Elementary cycles (each counted once, from its smallest module)."""
    count = 0
    for start in sorted(graph):
        paths = [[start]]
        while paths:
            path = paths.pop()
            for nxt in graph[path[-1]]:
                if nxt == start:
                    count += 1
                elif nxt > start and nxt not in path:
                    paths.append([*path, nxt])
    return count


RANGE_WORDS = re.compile(r"--([a-z-]+|\{[^}]*\}).*(must be (at least|0|positive|between|in \[|\d|\{bound)"
                         r"|or more|whole number|give \S+ to \d|give a positive)")


def range_checks(root: Path) -> list[str]:
    """Functions that refuse a flag's number out of range themselves (not through the records' validator)."""
    found = []
    for name, path in modules(root).items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    isinstance(r, ast.Raise) and isinstance(r.exc, ast.Call) and r.exc.args
                    and RANGE_WORDS.search(ast.unparse(r.exc.args[0])) for r in ast.walk(fn)):
                found.append(f"{name}.{fn.name}")
    return sorted(set(found))


def layer(module: str) -> int:
    best, at = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or (module.startswith(prefix + ".") and prefix != "rlcli")) and len(prefix) > best:
                best, at = len(prefix), i
    return at


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a higher layer, and modules no layer names (each as (module, '?'))."""
    found = [(m, "?") for m in sorted(graph) if layer(m) < 0]
    return found + [(m, d) for m in sorted(graph) for d in sorted(graph[m]) if layer(d) > layer(m) >= 0]


def commands() -> Iterator[tuple[str, object]]:
    """Every `rlcli` command as (its words, its function)."""
    from rlcli import cli

    def walk(node: dict, path: list[str]) -> Iterator[tuple[str, object]]:
        for name, (_, target) in node.items():
            if isinstance(target, dict):
                yield from walk(target, [*path, name])
            else:
                module, _, attr = target.partition(":")
                yield " ".join([*path, name]), getattr(importlib.import_module(module), attr)

    yield from walk(cli.COMMANDS, [])


def declarations() -> dict[str, set[object]]:
    """{flag name: the declarations of it}: a record's option is one declaration however many commands take it
    (rlcli.options); a keyword parameter of a command function is a declaration of its own."""
    found: dict[str, set[object]] = {}
    for words, fn in commands():
        params = list(inspect.signature(fn).parameters.values())
        record = _record(fn, params)
        if record is not None:
            from rlcli import options

            for spec in options.specs(record):
                found.setdefault(spec.name, set()).add(spec.opt)
        else:
            for p in params:
                found.setdefault(p.name, set()).add(f"{words}:{p.name}")
    return found


def _record(fn: object, params: list[inspect.Parameter]) -> type | None:
    try:
        from rlcli.options import Record
    except ImportError:  # a tree from before the records
        return None
    import typing

    hint = typing.get_type_hints(fn).get(params[0].name) if params else None
    return hint if isinstance(hint, type) and issubclass(hint, Record) else None


def twice(homonyms: dict[str, str] | None = None) -> dict[str, int]:
    """{flag: its number of declarations} for each flag declared more than once, homonyms aside."""
    return {name: len(d) for name, d in sorted(declarations().items())
            if len(d) > 1 and name not in (homonyms or {})}


def figures(root: Path) -> dict[str, object]:
    graph = imports(root)
    groups = cycles(graph)
    sys.path.insert(0, str(root))
    try:
        from rlcli import options

        homonyms = getattr(options, "HOMONYMS", {})
    except ImportError:
        homonyms = {}
    return {"modules": len(graph), "cycle_groups": len(groups), "elementary_cycles": cycle_count(graph),
            "cycles": groups, "upward": upward(graph), "range_checks": range_checks(root),
            "flags_declared_more_than_once": twice(homonyms), "homonyms": sorted(homonyms)}


if __name__ == "__main__":
    result = figures(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else REPO)
    result["upward_count"] = len(result["upward"])
    result["flags_declared_more_than_once_count"] = len(result["flags_declared_more_than_once"])
    print(json.dumps(result, indent=1))
