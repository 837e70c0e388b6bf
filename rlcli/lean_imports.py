"""Client processes load tokenizers without transformers' text-generation code.

Why: transformers 5's `models/auto/auto_factory.py` imports `GenerationMixin` while it is itself imported,
whenever torch is installed, and `AutoTokenizer` imports that module. `GenerationMixin`'s module brings
`masking_utils`, which imports `torch._dynamo`, and accelerate's hooks with it. A `rlcli train` process
never generates text with transformers (the server samples), yet every one paid that import: the largest
single part of a `train sl` run's CPU on the embedded model (docs/decisions.md, "Client processes skip
transformers' generation import"). auto_factory uses the class in one function only,
`add_generation_mixin_to_remote_model`, which gives a remote-code model class generation.

`install()` puts a finder first on `sys.meta_path`. When `auto_factory` is first imported, the finder runs its
body while the real `transformers.generation` package (a lazy module) answers `GenerationMixin` with a
stand-in from its own dict, then wraps that one function so that it imports the real class when it is
called, and gives the module the real class on first attribute access. The rest of `transformers.generation`
imports as always (configuration_utils needs its `GenerationConfig`), and anything that imports
`GenerationMixin` itself (a model class, peft, `rlcli export`) gets the real class. Where auto_factory no
longer reads as it did when this was written (a transformers upgrade), the finder leaves it alone. The name it
changes is in rlcli's manifest (rlcli/server/runtime/manifest.py).
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import sys
import types
from typing import Any

TARGET = "transformers.models.auto.auto_factory"
GENERATION = "transformers.generation"
# The one function of auto_factory that uses GenerationMixin (applies() checks that it is the only one).
WRAPPED = "add_generation_mixin_to_remote_model"


def applies(source: str) -> bool:
    """Whether auto_factory's source reads as the stand-in needs: the one import of GenerationMixin from
    `...generation`, and every other use of the name inside WRAPPED, so nothing else can meet the stand-in."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and any(alias.name == "GenerationMixin" for alias in node.names)]
    if len(imports) != 1 or (imports[0].module, imports[0].level) != ("generation", 3):
        return False
    wrapped = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == WRAPPED]
    if len(wrapped) != 1:
        return False
    inside = {id(node) for node in ast.walk(wrapped[0])}
    return all(id(node) in inside for node in ast.walk(tree)
               if isinstance(node, ast.Name) and node.id == "GenerationMixin")


class _Finder:
    """A sys.meta_path finder (the protocol needs only find_spec) for auto_factory alone."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        uninstall()  # one module, once
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec
        try:
            source = spec.loader.get_data(spec.origin)  # type: ignore[arg-type]
        except OSError:
            return spec
        if not applies(source.decode("utf-8", errors="replace")):
            return spec
        # This spec's own loader (a new one per find), with the stand-in in place while the body runs.
        spec.loader.exec_module = _with_stand_in(spec.loader.exec_module)  # type: ignore[method-assign]
        return spec


class _NotImported:
    """What `GenerationMixin` names while auto_factory's body runs. Not a class: a class that tried to inherit
    from it would fail at once, loudly, rather than silently lack generation."""

    def __repr__(self) -> str:
        return "<GenerationMixin, not imported (rlcli.lean_imports)>"


_STAND_IN = _NotImported()


def _with_stand_in(exec_module: Any) -> Any:
    def run(module: types.ModuleType) -> None:
        # The real package (a lazy module: importing it loads none of its submodules) answers the one name from
        # its own dict while the body runs, so its __getattr__ does not import the class; its submodules
        # (configuration_utils' GenerationConfig) import as always.
        generation = importlib.import_module(GENERATION)
        if f"{GENERATION}.utils" in sys.modules or "GenerationMixin" in vars(generation):  # already paid for
            exec_module(module)
            return
        generation.GenerationMixin = _STAND_IN  # type: ignore[attr-defined]
        try:
            exec_module(module)
        finally:
            del generation.GenerationMixin  # type: ignore[attr-defined]
            _replace_stand_in(exclude=module)
        _defer(module)

    return run


def _replace_stand_in(exclude: types.ModuleType) -> None:
    """Any other module that took the name while auto_factory's body ran (none in the transformers this was
    written for) gets the real class, so no code outside auto_factory ever meets the stand-in."""
    for other in list(sys.modules.values()):
        if other is not exclude and getattr(other, "__dict__", {}).get("GenerationMixin") is _STAND_IN:
            other.GenerationMixin = _real_mixin()


def _real_mixin() -> type:
    from transformers.generation import GenerationMixin

    return GenerationMixin


def _defer(module: types.ModuleType) -> None:
    """The stand-in out of the module; the real class brought in by its one user, or on access."""
    vars(module).pop("GenerationMixin", None)
    original = getattr(module, WRAPPED)

    @functools.wraps(original)
    def add_generation_mixin_to_remote_model(model_class: Any) -> Any:
        module.GenerationMixin = _real_mixin()  # type: ignore[attr-defined]
        return original(model_class)

    setattr(module, WRAPPED, add_generation_mixin_to_remote_model)

    def __getattr__(name: str) -> Any:  # PEP 562: `auto_factory.GenerationMixin` from outside still works
        if name == "GenerationMixin":
            module.GenerationMixin = _real_mixin()  # type: ignore[attr-defined]
            return module.GenerationMixin  # type: ignore[attr-defined]
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]


_FINDER = _Finder()


def install() -> None:
    """Put the finder in place, unless transformers' auto module is already imported. Idempotent."""
    if TARGET in sys.modules or _FINDER in sys.meta_path:
        return
    sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
