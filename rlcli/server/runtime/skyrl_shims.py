"""Every adjustment rlcli makes to SkyRL at run time, in one place.

Runs INSIDE the server venv (Python 3.12): standard library and skyrl only.
No SkyRL file is edited or copied; each shim replaces one named function of an
imported SkyRL module and checks first that the function it replaces exists,
so a SkyRL upgrade that moves it fails loudly at start instead of silently.

Shims:
- engine_command: SkyRL's API starts its engine with `uv run ...`, rebuilt from
  the API's parent command line. That fails outside a uv project (a pip venv).
  rlcli starts the engine with the venv's own interpreter, through rlcli's
  launcher, so the engine process can load rlcli's extensions too.
"""

from __future__ import annotations

import sys
from pathlib import Path

LAUNCHER = Path(__file__).with_name("launcher.py")

# (module, attribute) pairs this file replaces; tests check they still exist in the pinned SkyRL.
PATCHED = [("skyrl.tinker.api", "_build_uv_run_cmd_engine")]


def engine_command(engine_config) -> list[str]:
    """The engine's command line: this interpreter, rlcli's launcher, SkyRL's own config flags."""
    from skyrl.tinker.config import config_to_argv

    return [sys.executable, str(LAUNCHER), "engine", *config_to_argv(engine_config)]


def apply_api_shims() -> None:
    import skyrl.tinker.api as api

    if not callable(getattr(api, "_build_uv_run_cmd_engine", None)):
        raise RuntimeError(
            "rlcli shim: skyrl.tinker.api._build_uv_run_cmd_engine is gone; this SkyRL version "
            "is not the one rlcli pins (rlcli/server/env/server-*.lock)"
        )

    def _engine_cmd(parent_cmd: list[str], engine_config) -> list[str]:
        # parent_cmd is SkyRL's view of how the API was started; it is not needed here.
        return engine_command(engine_config)

    api._build_uv_run_cmd_engine = _engine_cmd
