"""The doorbell of runtime/rlcli_wake.py: two processes' datagram sockets, exercised for real (no SkyRL)."""

from __future__ import annotations

import importlib.util
import secrets

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
