"""A stand-in for torch that imports the real one on first use: SkyRL's API imports torch through its renderer for
functions it never calls (~1.2 of ~2 s of imports). importlib's LazyLoader does not do: Python 3.12's import
statement reads __spec__. Measured: docs/decisions.md, "SkyRL's API imports torch lazily".
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

_state = {"mode": None, "loaded": False}


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
    _state["mode"] = "on first use"
    return True


def loaded(name: str = "torch") -> bool:
    """Has the deferred module run its real import yet (or was it imported normally)?"""
    module = sys.modules.get(name)
    return module is not None and (not isinstance(module, _Deferred) or _state["loaded"])


def describe() -> dict:
    if _state["mode"] is None:
        return {"torch_in_api": "imported at start (stock)"}
    return {"torch_in_api": _state["mode"], "loaded_since": loaded()}
