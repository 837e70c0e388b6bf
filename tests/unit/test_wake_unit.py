"""The doorbell of runtime/rlcli_wake.py: two processes' datagram sockets, exercised for real (no SkyRL)."""

from __future__ import annotations

import importlib.util
import io
import logging
import secrets
import types

import pytest

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


def test_the_engines_bell_numbers_its_rings_and_owes_one_the_api_could_not_take():
    """rlcli_engine.RlcliEngine's doorbell: results ride a numbered ring; a ring that did not fit in the API's
    socket is owed until one goes."""
    wake = _wake_module()
    wake_id = secrets.token_hex(8)
    engine = wake.EngineBell(wake_id)
    engine.look_ring()  # no API yet: refused, so owed
    assert engine.owed
    api = wake.Doorbell(wake_id, own="api", peer="engine")
    assert engine.results([_row(7, "completed", '{"x": 1}')]) and not engine.owed
    engine.look_ring()
    api.wait(5.0)
    rings = api.drain()
    assert wake.read_results(rings[0]) == (2, [(7, "completed", '{"x": 1}')]) and rings[1] == wake.plain_message(3)
    big = [_row(8, "completed", "x" * (wake.RING_RESULTS_MAX + 1))]
    assert not engine.results(big) and not engine.owed  # too big: the caller rings "look" after its commit


def _results_side(wake):
    """rlcli_wake.Results over stand-ins for the two SkyRL enums it reads."""
    import enum

    class RequestType(enum.StrEnum):
        FORWARD = "forward"
        OPTIM_STEP = "optim_step"
        EXTERNAL = "external"

    class RequestStatus(enum.StrEnum):
        COMPLETED = "completed"
        FAILED = "failed"

    api = types.SimpleNamespace(types=types.SimpleNamespace(RequestType=RequestType), RequestStatus=RequestStatus)
    results = wake.Results(api)
    results.heard(wake.ENGINE_HELLO, {})
    results.need_db = False
    return results, RequestType, RequestStatus


def _row(request_id, status, text):
    return {"request_id": request_id, "status": types.SimpleNamespace(value=status), "result_data": text}


def test_a_results_ring_reads_back_as_the_rows_and_big_results_stay_in_the_database():
    wake = _wake_module()
    rows = [_row(5, "completed", '{"loss": 1.0, "name": "é"}'), _row(9, "failed", '{"error": "no"}'),
            _row(11, "completed", "")]
    message = wake.results_message(3, rows)
    assert wake.read_results(message) == (3, [(5, "completed", '{"loss": 1.0, "name": "é"}'),
                                              (9, "failed", '{"error": "no"}'), (11, "completed", "")])
    assert wake.results_message(4, [_row(1, "completed", "x" * (wake.RING_RESULTS_MAX + 1))]) is None
    with pytest.raises(ValueError):
        wake.read_results(message[:-1])  # a body shorter than its header says: never handed on


def test_a_filed_future_is_resolved_by_its_ring_with_or_without_a_waiter():
    import asyncio

    wake = _wake_module()
    results, kind, status = _results_side(wake)
    loop = asyncio.new_event_loop()
    try:
        results.file(1, kind.FORWARD)
        results.file(2, kind.OPTIM_STEP)
        waiter, late = loop.create_future(), loop.create_future()
        late.cancel()  # a waiter that gave up is skipped, the live one gets the result
        waiters = {1: {waiter, late}}
        results.heard(wake.results_message(1, [_row(1, "completed", '{"a": 1}'), _row(2, "failed", '{"e": 2}')]),
                      waiters)
        assert waiter.result() == (status.COMPLETED, kind.FORWARD, '{"a": 1}') and waiters == {}
        assert results.need_db is False and results.filed == {} and results.by_ring == 2
        # Nobody waited for 2 yet: kept until its retrieve_future comes, once.
        assert results.ready.pop(2) == (status.FAILED, kind.OPTIM_STEP, '{"e": 2}') and results.ready == {}
    finally:
        loop.close()


def test_anything_a_ring_cannot_settle_sends_the_poller_to_the_database():
    wake = _wake_module()
    results, kind, _ = _results_side(wake)
    results.heard(wake.results_message(1, [_row(40, "completed", "{}")]), {})  # not filed here
    assert results.need_db and results.ready == {}
    results.need_db = False
    results.heard(wake.plain_message(2), {})  # too big for a ring, or rung after a full socket
    assert results.need_db
    results.need_db = False
    results.file(41, kind.FORWARD)
    results.heard(wake.results_message(4, [_row(41, "completed", "{}")]), {})  # ring 3 never arrived
    assert results.need_db and 41 in results.ready and results.look_rings == 1
    results.need_db = False
    results.heard(b"R{not json", {})
    assert results.need_db
    results.file(42, kind.EXTERNAL)  # the API completes those itself: never waited for by ring
    assert 42 not in results.filed


def test_results_nobody_asks_for_are_kept_within_bounds(monkeypatch):
    wake = _wake_module()
    assert wake.READY_MAX * wake.RING_RESULTS_MAX <= 64 * 2**20  # each kept result fit in a ring
    monkeypatch.setattr(wake, "READY_MAX", 3)
    results, kind, _ = _results_side(wake)
    for request_id in range(1, 6):
        results.file(request_id, kind.FORWARD)
        results.heard(wake.results_message(request_id, [_row(request_id, "completed", "abc")]), {})
    assert list(results.ready) == [3, 4, 5]  # the oldest went first
    results.read_from_db({6: None})
    assert results.db_reads == 1
