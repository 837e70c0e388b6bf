"""rlcli server extension: SkyRL's API process imports torch only when something in it uses torch.

Runs INSIDE the server venv (Python 3.12): standard library only. The launcher imports it when
RLCLI_SERVER_EXTENSIONS names it (`rlcli serve start` does, first in the list, unless --no-extensions) and
calls `register("api")` before anything in the API process imports SkyRL.

Why: SkyRL 0.4.0's API imports `skyrl.tinker.extra.external_inference`, which imports
`skyrl.backends.renderer`, which imports torch at its top, for functions that only an external inference
engine or image inputs call. torch is most of the API's import time (about 1.2 s of 2 s on a quiet 2-core
machine, 3 s of 5 s on a loaded one), and the API imports while the preloaded engine imports jax, flax,
transformers and torch on the same cores: the API's torch import delays the engine, and so `serve start`.

How: a stand-in module for torch in the API process: `import torch` succeeds at once and the real import runs
on the first use of any of torch's attributes, so a route that needs torch still gets it. (importlib's
LazyLoader does not do here: Python 3.12's import statement reads the module's __spec__, which loads it.) The
engine process (which computes with torch's neighbours and imports peft, which needs torch) is not touched.

`python rlcli_lazy_torch.py` checks in this venv that SkyRL's API imports without loading torch under it,
that torch then loads on first use, and that renderer.py uses torch only inside functions.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

NAME = "rlcli_lazy_torch"
VERSION = "1.0"
# The SkyRL module whose top-level `import torch` this defers, and where the API reaches it from.
TARGET = ("skyrl.backends.renderer", "skyrl.tinker.extra.external_inference")

_state = {"mode": None, "loaded": False}


def log(message: str) -> None:
    print(f"[{NAME} {VERSION}] {message}", file=sys.stderr, flush=True)


class _Deferred(types.ModuleType):
    """Stands in for a module until the first attribute it does not hold is asked for; then imports the real
    module, takes its attributes (so later lookups are direct) and answers. The import system's own looks
    (__spec__, __name__) find real values here and load nothing."""

    def __getattr__(self, attr):
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        _state["loaded"] = True
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def defer(name: str = "torch") -> bool:
    """Put a deferred module for `name` in sys.modules; False where it is already imported or not installed."""
    if name in sys.modules:
        return False
    spec = importlib.util.find_spec(name)
    if spec is None:
        return False
    module = _Deferred(name)
    module.__spec__ = spec
    module.__loader__ = spec.loader
    module.__file__ = spec.origin  # inspect.getmodule asks every module for __file__: that must not load it
    sys.modules[name] = module
    return True


def loaded(name: str = "torch") -> bool:
    """Has the deferred module run its real import yet (or was it imported normally)?"""
    module = sys.modules.get(name)
    return module is not None and (not isinstance(module, _Deferred) or _state["loaded"])


def describe() -> dict:
    if _state["mode"] is None:
        return {"torch_in_api": "imported at start (stock)"}
    return {"torch_in_api": _state["mode"], "loaded_since": loaded()}


def register(role: str) -> None:
    if role != "api":
        return
    if defer():
        _state["mode"] = "on first use"
        log("the API imports torch on first use, not at start")
    else:
        log("torch already imported or absent: nothing deferred")


def _self_check() -> None:
    import ast
    from pathlib import Path

    assert defer(), "torch was imported before this check, or is not installed"
    import skyrl.tinker.api  # noqa: F401  (what the API process imports)

    assert TARGET[0] in sys.modules and TARGET[1] in sys.modules, "SkyRL's API no longer imports the renderer"
    assert not loaded(), "importing SkyRL's API used torch at import time; the lazy import gains nothing"
    # The renderer's torch uses are inside functions only (module level would load torch at the API's start).
    tree = ast.parse(Path(sys.modules[TARGET[0]].__file__).read_text())
    top = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    uses = [n for stmt in top for n in ast.walk(stmt) if isinstance(n, ast.Name) and n.id == "torch"]
    assert not uses, f"renderer.py uses torch at module level (line {uses[0].lineno})"
    import torch

    assert torch.zeros(2).sum().item() == 0.0 and loaded(), "torch did not load on first use"


if __name__ == "__main__":
    _self_check()
    print(f"{NAME} {VERSION}: SkyRL's API imports without loading torch; torch loads on first use")
