"""The doorbell of runtime/rlcli_wake.py: two processes' datagram sockets, exercised for real (no SkyRL)."""

from __future__ import annotations

import importlib.util
import io
import logging
import secrets
import sys
import types

from rlcli.server import commands


def _wake_module():
    spec = importlib.util.spec_from_file_location("rlcli_wake_under_test", commands.RUNTIME_DIR / "rlcli_wake.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_ring_wakes_the_peer_and_draining_empties_it():
    wake = _wake_module()
    wake_id = secrets.token_hex(8)
    api = wake.Doorbell(wake_id, own="api", peer="engine")
    engine = wake.Doorbell(wake_id, own="engine", peer="api")
    assert engine.drain() == []
    api.ring()
    api.ring()
    engine.wait(5.0)
    assert engine.drain() == [b"!", b"!"]
    assert engine.drain() == []
    engine.ring(wake.ENGINE_HELLO)
    api.wait(5.0)
    assert api.drain() == [wake.ENGINE_HELLO]


def test_ringing_a_peer_that_is_not_up_or_not_listening_never_fails():
    wake = _wake_module()
    wake_id = secrets.token_hex(8)
    api = wake.Doorbell(wake_id, own="api", peer="engine")
    api.ring()  # no engine socket yet: the engine looks at the queue when it starts anyway
    engine = wake.Doorbell(wake_id, own="engine", peer="api")
    for _ in range(10_000):  # far past the socket buffer: a full buffer already means "look"
        api.ring()
    rings = engine.drain()
    assert 0 < len(rings) < 10_000


def test_two_servers_do_not_hear_each_other():
    wake = _wake_module()
    a_api = wake.Doorbell(secrets.token_hex(8), own="api", peer="engine")
    b_engine = wake.Doorbell(secrets.token_hex(8), own="engine", peer="api")
    a_api.ring()
    assert b_engine.drain() == []


class RichHandler(logging.Handler):
    """Stands in for rich.logging.RichHandler (plain_log matches the class by name): a console with a file."""

    def __init__(self, stream):
        super().__init__()
        self.console = types.SimpleNamespace(file=stream)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_plain_log_swaps_rich_handlers_for_plain_ones_on_the_same_stream_and_format():
    wake = _wake_module()
    stream, other = io.StringIO(), io.StringIO()
    logger = logging.getLogger(f"rlcli-wake-test-{secrets.token_hex(4)}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    rich = RichHandler(stream)
    rich.setFormatter(logging.Formatter("%(levelname)s - %(name)s: %(message)s"))
    rich.setLevel(logging.INFO)
    kept = logging.StreamHandler(other)
    logger.addHandler(rich)
    logger.addHandler(kept)
    assert wake.plain_log(logger.name) == 1
    assert rich not in logger.handlers and kept in logger.handlers
    logger.debug("below the rich handler's level")
    logger.info("(timing) process_batch_requests(forward_backward, n=1) took 0.042s")
    assert rich.records == []
    assert stream.getvalue() == (f"INFO - {logger.name}: (timing) process_batch_requests(forward_backward, n=1) "
                                 "took 0.042s\n")
    assert other.getvalue().count("\n") == 2  # the other handler still gets everything, as before
    assert wake.plain_log(logger.name) == 0  # nothing rich left: a second call changes nothing


def test_rich_log_env_keeps_skyrls_rich_handler(monkeypatch):
    """RLCLI_RICH_LOG=1 (the benchmark's B arm) leaves SkyRL's handler alone; otherwise it is swapped."""
    for name in ("skyrl", "skyrl.utils", "skyrl.utils.log"):  # what the swap imports, as stand-ins
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    logger = logging.getLogger("skyrl")
    rich = RichHandler(io.StringIO())
    monkeypatch.setattr(logger, "handlers", [rich])
    wake = _wake_module()
    monkeypatch.setenv(wake.RICH_LOG_ENV, "1")
    wake._plain_log_unless_asked()
    assert logger.handlers == [rich] and wake._state["log"] == "rich (stock)"
    monkeypatch.delenv(wake.RICH_LOG_ENV)
    wake._plain_log_unless_asked()
    assert len(logger.handlers) == 1 and type(logger.handlers[0]) is logging.StreamHandler
    assert wake._state["log"] == "plain"
