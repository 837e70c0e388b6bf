"""The notebook tests' kernels run their rlcli commands in the test's zygote (tests/cli_zygote.py).

A notebook runs each step as a person would, `python -m rlcli.cli ...` through rlcli.lab, so a fresh process per
command spends seconds importing the training stack; the notebook tests run ~20 of them. `kernel_startup(folder,
zygote)` writes an IPython profile whose startup file (run by the papermill kernel before the notebook's first cell)
calls `install()`: rlcli.lab's subprocess.run then hands `python -m rlcli.cli <heavy command>` to the test's zygote,
with the kernel's environment, folder and timeout, and runs everything else (benchmark scripts, light commands, an
environment the zygote's imports would have read differently) as before. rlcli.lab's own code is unchanged and
runs as it does for a user: only the process a command runs in differs.

Handoff: the test sets IPYTHONDIR to the profile's folder and RLCLI_TEST_KERNEL_ZYGOTE to a private JSON file with
the zygote's socket and the environment it was started with.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HANDOFF = "RLCLI_TEST_KERNEL_ZYGOTE"
# What a Jupyter kernel adds to the environment it was started with (ipykernel, jupyter_client, matplotlib-inline),
# plus the profile's folder: no module the zygote imported reads them while it is imported.
KERNEL_VARS = frozenset({"IPYTHONDIR", "JPY_PARENT_PID", "JPY_SESSION_NAME", "MPLBACKEND", "CLICOLOR",
                         "CLICOLOR_FORCE", "FORCE_COLOR", "PAGER", "GIT_PAGER", "TERM",
                         "PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING", "PYDEVD_USE_FRAME_EVAL"})


def kernel_startup(folder: Path, zygote) -> dict[str, str]:
    """Write the profile and the handoff under `folder` (private); the variables to give the kernel."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    handoff = folder / "zygote.json"
    handoff.write_text(json.dumps({"socket": zygote.socket, "env": zygote.env}))
    handoff.chmod(0o600)
    startup = folder / "ipython" / "profile_default" / "startup"
    startup.mkdir(mode=0o700, parents=True)
    (startup / "00-rlcli-zygote.py").write_text(f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
                                                "import tests.notebook_kernel\ntests.notebook_kernel.install()\n")
    return {"IPYTHONDIR": str(folder / "ipython"), HANDOFF: str(handoff)}


@contextlib.contextmanager
def kernels_fork(folder: Path) -> Iterator[None]:
    """Within the block, the kernels papermill starts from this process run rlcli.lab's commands in this test
    worker's zygote (none: as before; RLCLI_TEST_FRESH_PROCESSES=1 keeps fresh processes)."""
    import pytest

    from tests import conftest

    zygote = conftest._zygote_for(("train",), dict(os.environ))
    if zygote is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        for name, value in kernel_startup(folder, zygote).items():
            patch.setenv(name, value)
        yield


class _Subprocess:
    """subprocess as rlcli.lab sees it: run() goes to the zygote where a fresh process would gain nothing else."""

    def __init__(self, zygote):
        self._zygote = zygote

    def __getattr__(self, name: str):
        return getattr(subprocess, name)

    def run(self, cmd, **kwargs):
        from tests import cli_zygote

        env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
        simple = set(kwargs) <= {"capture_output", "text", "cwd", "timeout", "env"} and kwargs.get("capture_output") \
            and kwargs.get("text")
        heavy = len(cmd) > 3 and list(cmd[1:3]) == ["-m", "rlcli.cli"] and cmd[3] in cli_zygote.HEAVY_COMMANDS
        differ = cli_zygote.differing(env, self._zygote.env) - KERNEL_VARS
        if log := os.environ.get("RLCLI_TEST_ZYGOTE_LOG"):
            with open(log, "a") as f:
                where = "fork" if simple and heavy and not differ else "fresh " + ",".join(sorted(differ))
                f.write(f"{os.getpid()} kernel {' '.join(map(str, cmd[1:5]))}: {where}\n")
        if simple and heavy and not differ and self._zygote.alive():
            return self._zygote.run([str(c) for c in cmd], env, str(kwargs.get("cwd") or os.getcwd()), None,
                                    kwargs.get("timeout"))
        return subprocess.run(cmd, **kwargs)


def install() -> None:
    """In the kernel: send rlcli.lab's commands to the zygote the handoff names (no handoff: nothing changes)."""
    path = os.environ.get(HANDOFF)
    if not path:
        return
    import rlcli.lab
    from tests import cli_zygote

    handoff = json.loads(Path(path).read_text())
    rlcli.lab.subprocess = _Subprocess(cli_zygote.Zygote.attach(handoff["socket"], handoff["env"]))
