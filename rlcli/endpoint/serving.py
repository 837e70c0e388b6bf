"""The endpoint process: the tokenizer and renderer of the base model, the capture store daemon (a child),
the cookbook's instrumented SDK and exporter, the app, the loopback bind."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from rlcli import config
from rlcli.endpoint.commands import EndpointOptions, capture_dir
from rlcli.errors import UsageError


class TenantKeys:
    """The tenants file's key hashes, read again when the file changes (a revoked key is refused next)."""

    def __init__(self) -> None:
        from rlcli.tenants import tenants_file

        self.path, self._stamp, self._hashes = tenants_file(), None, frozenset()

    def known(self, key: str) -> bool:
        from rlcli.tenants import key_hash, load

        try:
            stamp = self.path.stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self._hashes = frozenset(t["key_sha256"] for t in load().values())
            self._stamp = stamp
        return key_hash(key) in self._hashes


def _target(o: EndpointOptions) -> tuple[str, str, bool]:
    """(base URL, base model, whether the server checks tenant keys)."""
    if o.base_url:
        if not o.model:
            raise UsageError("--base-url names a server rlcli does not manage: give its base model too (--model)")
        return o.base_url.rstrip("/"), o.model, False
    from rlcli.server import process

    state = process.read_state(config.server_state_dir(o.name))
    if state is None:
        raise UsageError(f"no managed server {o.name!r}: `rlcli serve start` first, or give --base-url and "
                         "--model")
    host = config.DEFAULT_HOST if state.host in ("0.0.0.0", "::", "") else state.host
    return f"http://{host}:{state.port}", o.model or state.base_model, bool(state.settings.get("tenants"))


def _context(model: str) -> int | None:
    cfg = Path(model).expanduser() / "config.json"
    try:
        return int(json.loads(cfg.read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(folder: Path) -> tuple[subprocess.Popen, str]:
    """The capture store daemon for folder, started as this process's child; where one runs already (another
    endpoint's), the child finds the folder taken and ends, and that one's URL is used."""
    from tinker_cookbook.capture.store.client import ensure_daemon

    config.private_dir(folder)
    info = folder / "daemon.json"
    stale = info.stat().st_mtime_ns if info.is_file() else None
    with open(folder / "daemon.log", "ab") as log:
        child = subprocess.Popen([sys.executable, "-m", "tinker_cookbook.capture.store.daemon", "--data-dir",
                                  str(folder), "--port", "0"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    deadline = time.monotonic() + 60  # until the child serves: ensure_daemon would otherwise start a detached one
    while time.monotonic() < deadline and child.poll() is None:
        if info.is_file() and info.stat().st_mtime_ns != stale:
            break
        time.sleep(0.05)
    return child, ensure_daemon(folder, idle_shutdown_minutes=None)


def _pruning(folder: Path, keep_hours: float, max_hours: float) -> None:
    """The store's retention (rlcli/endpoint/retention.py), once a minute on a thread of its own."""
    from rlcli.endpoint import retention

    def body() -> None:
        while True:
            try:
                if gone := retention.prune(folder, keep_hours, max_hours):
                    logging.getLogger("rlcli.endpoint").info("capture store: deleted %d exchanges and feedback rows "
                                                             "(retention)", gone)
            except Exception as e:  # noqa: BLE001 - housekeeping: serving goes on, the next minute tries again
                logging.getLogger("rlcli.endpoint").warning("capture store retention: %s: %s", type(e).__name__, e)
            time.sleep(retention.EVERY_S)

    threading.Thread(target=body, name="capture-retention", daemon=True).start()


def run(o: EndpointOptions) -> int:
    """Serve in the foreground until Ctrl-C or SIGTERM."""
    import warnings

    from aiohttp import web

    from rlcli.train.hooks import COOKBOOK_MODULES

    warnings.filterwarnings("ignore", category=FutureWarning, module=COOKBOOK_MODULES)
    from rlcli import tenants as tenancy
    from rlcli.endpoint import app as endpoint_app
    from rlcli.endpoint import capture
    from rlcli.endpoint.models import Models, parse_pairs
    from rlcli.server.commands import _is_loopback
    from rlcli.train import renderers

    os.umask(0o077)
    base_url, base_model, tenants = _target(o)
    tenancy.check_exposure(o.host, tenants, o.insecure, _is_loopback(o.host))
    loops = [Path(p.strip()).expanduser().resolve() for p in (o.loops or "").split(",") if p.strip()]
    models = Models(base_model, parse_pairs(o.models, "--models"), loops)
    if renderers.is_local_model(base_model):
        renderers.go_offline()
        renderers.register_local_tokenizer(base_model)
    from tinker_cookbook.renderers import get_renderer
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    tokenizer = get_tokenizer(base_model)
    renderer = endpoint_app.StopStrings(get_renderer(renderers.choose_renderer(base_model), tokenizer,
                                                     model_name=base_model), tokenizer)
    sampler = endpoint_app.RoutingSampler(models, base_url, renderer, tokenizer, _context(base_model),
                                          config.PLACEHOLDER_API_KEY)
    child, exporter = None, None
    settings = endpoint_app.Settings(models, sampler, TenantKeys() if tenants else None, o.redact, None,
                                     o.max_tokens)
    if o.record:
        from tinker_cookbook.capture import CaptureExporter, instrument_tinker
        from tinker_cookbook.capture.store.client import StoreSink

        folder = capture_dir(o)
        child, url = _store(folder)
        exporter = CaptureExporter(StoreSink(url))
        instrument_tinker(exporter)
        settings.sink = exporter
        for row in capture.read_all(folder):  # feedback may name what this endpoint answered before a restart
            if row["kind"] == capture.EXCHANGE:
                settings.recent[row["payload"].get("exchange")] = None
        _pruning(folder, o.capture_keep_hours, o.capture_max_hours)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    application = endpoint_app.build(renderer, settings, base_model)

    async def drain(_: web.Application) -> None:
        await asyncio.to_thread(sampler.unload_all)
        if exporter is not None:
            exporter.force_flush(timeout=5)
            exporter.shutdown()

    application.on_cleanup.append(drain)
    print(f"rlcli: endpoint for {base_url} ({base_model}) on http://{o.host}:{o.port}"
          + (f", capture {capture_dir(o)}" if o.record else ", capturing nothing"), flush=True)
    try:
        web.run_app(application, host=o.host, port=o.port, print=None, access_log=None)
    finally:
        if child is not None:
            child.terminate()
            child.wait(10)
    return 0
