"""tinker-cookbook's SandboxInterface on rlcli's Docker sandbox, so the cookbook's own Harbor recipe runs locally.

The cookbook (0.5.5 and later) ships `tinker_cookbook.sandbox.SandboxInterface` and a Harbor recipe
(`recipes/harbor_rl/harbor_env.py`) whose dataset builder takes a `sandbox_factory(env_dir, timeout)`;
its default makes Modal sandboxes. `docker_sandbox_factory()` makes rlcli's instead: the task's image
(built once, as `harbor run` builds it), its limits, entrypoint, workdir, env and its environment's
network (the cookbook has no phases: the whole rollout has the environment's policy; an allowlist is
refused, network="none" turns it off):

    from rlcli.harbor.cookbook_sandbox import docker_sandbox_factory, harbor_recipe
    recipe = harbor_recipe()   # the cookbook's harbor_env module, importable without Modal installed
    builder = recipe.HarborDatasetBuilder(tasks=..., ..., sandbox_factory=docker_sandbox_factory())

A command's stdout and stderr arrive together in `stdout` (rlcli's exec interleaves them, as a terminal
shows them); `stderr` is empty. Call `remove_all()` at the end (or rely on the next run's sweep).

The recipe module imports `tinker_cookbook.sandbox.modal_sandbox` at its top, which raises without the
`modal` package (a cloud client rlcli does not install). `harbor_recipe()` puts a stand-in for that one
module in sys.modules when `modal` is missing (its ModalSandbox refuses with a line saying to pass this
factory) and checks that the recipe still takes a sandbox_factory; no file or attribute of the cookbook
is changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import io
import posixpath
import shlex
import sys
import tarfile
import time
import types
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tinker_cookbook.sandbox.sandbox_interface import SandboxResult, SandboxTerminatedError

from rlcli.errors import RlcliError
from rlcli.harbor.images import ensure_image
from rlcli.harbor.sandbox import MAX_OUTPUT_BYTES, Sandbox, SandboxError, connect, remove_mine
from rlcli.harbor.tasks import load_task


class DockerSandbox:
    """One rlcli container behind the cookbook's SandboxInterface (checked: isinstance(..., SandboxInterface))."""

    def __init__(self, box: Sandbox):
        self.box = box

    @property
    def sandbox_id(self) -> str:
        return self.box.short_id

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except SandboxError as e:
            raise SandboxTerminatedError(str(e)) from None

    async def send_heartbeat(self, timeout: int = 30) -> None:
        await self._call(self.box.check_alive)  # a container needs no heartbeat; a dead one is reported

    async def run_command(self, command: str, workdir: str | None = None, timeout: int = 60,
                          max_output_bytes: int | None = None) -> SandboxResult:
        result = await self._call(self.box.exec, command, timeout, workdir, max_output_bytes or MAX_OUTPUT_BYTES)
        return SandboxResult(stdout=result.output, stderr="", exit_code=result.exit_code,
                             metrics={"seconds": result.seconds, "timed_out": result.timed_out})

    async def read_file(self, path: str, max_bytes: int | None = None, timeout: int = 60) -> SandboxResult:
        data = await self._call(self.box.read_file, path, max_bytes or 100_000_000)
        if data is None:
            return SandboxResult(stdout="", stderr=f"{path}: no such file", exit_code=1)
        return SandboxResult(stdout=data.decode(errors="replace"), stderr="", exit_code=0)

    async def write_file(self, path: str, content: str | bytes, executable: bool = False,
                         timeout: int = 60) -> SandboxResult:
        data = content.encode() if isinstance(content, str) else content
        folder, name = posixpath.split(path)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755 if executable else 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        made = await self._call(self.box.exec, f"mkdir -p {shlex.quote(folder or '/')}", timeout, "/")
        if made.exit_code != 0:
            return SandboxResult(stdout="", stderr=made.output, exit_code=made.exit_code)
        ok = await self._call(self.box.container.put_archive, folder or "/", buffer.getvalue())
        return SandboxResult(stdout="", stderr="" if ok else f"could not write {path}", exit_code=0 if ok else 1)

    async def cleanup(self) -> None:
        await asyncio.to_thread(self.box.remove)


class DockerSandboxFactory:
    """The recipe's `sandbox_factory(env_dir, timeout)`: one container of that task per call."""

    def __init__(self, network: str = "task"):
        self.network, self._client = network, None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = connect()
        return self._client

    async def __call__(self, env_dir: Path, timeout: int) -> DockerSandbox:
        task = load_task(Path(env_dir).parent, network=self.network)
        image, _ = await asyncio.to_thread(ensure_image, self.client, task)
        box = await asyncio.to_thread(Sandbox.start, self.client, image, task, timeout)
        return DockerSandbox(box)

    def remove_all(self) -> int:
        """Remove every container this process made (the recipe's cleanup removes each group's own)."""
        if self._client is None:
            return 0
        with contextlib.suppress(Exception):
            return remove_mine(self._client)
        return 0


def docker_sandbox_factory(network: str = "task") -> Callable[[Path, int], Awaitable[DockerSandbox]]:
    return DockerSandboxFactory(network)


RECIPE = "tinker_cookbook.recipes.harbor_rl.harbor_env"
MODAL_SANDBOX = "tinker_cookbook.sandbox.modal_sandbox"


class _NoModal:
    def __init__(self, *args: Any, **kwargs: Any):
        raise RlcliError("the cookbook's Modal sandbox needs the `modal` package: pass sandbox_factory="
                         "rlcli.harbor.cookbook_sandbox.docker_sandbox_factory() to run on local Docker")

    @classmethod
    async def create(cls, *args: Any, **kwargs: Any) -> Any:
        return cls()


def harbor_recipe() -> types.ModuleType:
    """The cookbook's Harbor recipe module, importable without `modal`, checked to take a sandbox factory."""
    if importlib.util.find_spec("modal") is None and MODAL_SANDBOX not in sys.modules:
        stand_in = types.ModuleType(MODAL_SANDBOX, "rlcli's stand-in: modal is not installed")
        stand_in.ModalSandbox = _NoModal  # type: ignore[attr-defined]
        sys.modules[MODAL_SANDBOX] = stand_in
    recipe = importlib.import_module(RECIPE)
    builder = getattr(recipe, "HarborEnvGroupBuilder", None)
    if builder is None or "sandbox_factory" not in inspect.signature(builder).parameters:
        raise RlcliError(f"{RECIPE} no longer takes a sandbox_factory (rlcli's Docker sandbox was written against "
                         "tinker-cookbook 0.5.5): install the pinned version (pip install -r env/client.lock)")
    return recipe
