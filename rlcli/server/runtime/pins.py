"""The one check every rlcli server extension makes before it touches SkyRL: are its targets where it expects?

Runs INSIDE the server venv (Python 3.12): standard library only. Each extension names the SkyRL pieces it
wraps or replaces; a SkyRL upgrade that moves one must stop the server at start, loudly, not run it half-patched.
"""

from __future__ import annotations


def require(extension: str, targets: dict[str, object]) -> None:
    """Raise unless every target is there: a name -> the object found under it (None when absent), which must be
    callable, or -> True/False for a fact checked by the caller (e.g. a function that looks a global up by name)."""
    missing = [name for name, found in targets.items() if not (found is True or callable(found))]
    if missing:
        raise RuntimeError(f"{extension}: this SkyRL lacks {', '.join(missing)}; it is not the version rlcli pins")
