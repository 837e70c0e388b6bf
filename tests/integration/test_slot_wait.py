"""A model made from a saved state on a server whose LoRA slots are all taken (the soak's loop failure): the
server says why, a caller that can wait gets a slot when one frees, one that cannot says so in one line."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager

import pytest

from rlcli.client import NO_FREE_SLOT, unload_model
from rlcli.slot_wait import NoFreeSlot, load_state
from tests.conftest import run_rlcli
from tests.faults.conftest import wait_for

pytestmark = pytest.mark.server
STALE = "likely stale request"


def _service(url: str):
    import tinker

    return tinker.ServiceClient(base_url=url, api_key="tml-test")


def _finished_run(url: str, model: str, name: str) -> tuple[str, str]:
    """(state path, sampler path) of a run that saved both under one name and ended (its slot freed)."""
    trainer = _service(url).create_lora_training_client(base_model=model, rank=1, seed=0).result()
    try:
        state = trainer.save_state(name=name).result().path
        return state, trainer.save_weights_for_sampler(name=name).result().path
    finally:
        unload_model(url, trainer.model_id)


@contextmanager
def _full(url: str, model: str) -> Iterator[list[str]]:
    """Every free slot taken by a training client (as by trainers running beside); all unloaded at the end."""
    service, taken = _service(url), []
    try:
        with pytest.raises(Exception, match=NO_FREE_SLOT):  # noqa: PT012 - the slot count is the server's
            for _ in range(9):
                taken.append(service.create_lora_training_client(base_model=model, rank=1).result().model_id)
        yield taken
    finally:
        for model_id in taken:
            unload_model(url, model_id)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_a_load_into_a_full_server_names_the_slots_not_a_stale_request(server):
    state, _ = _finished_run(server.url, server.model, "full-load")
    with _full(server.url, server.model), pytest.raises(Exception) as refused:  # noqa: PT011 - tinker's classes
        _service(server.url).create_training_client_from_state(state).result()
    message = str(refused.value)
    assert NO_FREE_SLOT in message and "rlcli serve start --slots N" in message, message
    assert STALE not in message, message
    # The refused model holds no slot, and its row says so (a tenant's --max-models counts the others).
    refused_id = re.search(r"model (\S+) could not be created", message).group(1)
    with sqlite3.connect(server.home / "servers" / "default" / "tinker.db") as db:
        assert db.execute("SELECT status FROM models WHERE model_id = ?", (refused_id,)).fetchall() == [("unloaded",)]


def test_a_stock_server_says_stale_request_and_rlcli_still_says_slots(stock_server, embedded_model):
    """SkyRL alone answers the load of a model it could not create as a stale request: the soak's message."""
    url, _ = stock_server
    state, _ = _finished_run(url, embedded_model, "full-stock")
    with _full(url, embedded_model):
        with pytest.raises(Exception, match=STALE):
            _service(url).create_training_client_from_state(state).result()
        with pytest.raises(NoFreeSlot) as refused:
            load_state(_service(url), state, url, 0)
    assert STALE not in str(refused.value) and "--slots N" in str(refused.value)


def test_the_loops_evaluation_waits_for_a_slot_to_free(server):
    """What the loop's evaluation does (rlcli.loop.evaluation.answers): sample a finished run's checkpoint, which
    loads its state into a new model; with every slot taken it waits until a trainer ends."""
    from rlcli import sample

    _, path = _finished_run(server.url, server.model, "full-wait")
    answered: list[object] = []
    with _full(server.url, server.model) as taken:
        smp = sample.open_sampler(path, None, server.url, None, 4, 0.0, 0, slot_wait_s=300)
        asker = threading.Thread(target=lambda: answered.append(_answer(sample, smp)))
        refused_before = _refused(server)
        asker.start()
        wait_for(lambda: _refused(server) >= refused_before + 2, 120, what="two refusals (POLL_S apart)")
        assert asker.is_alive() and not answered  # waiting, not failed
        unload_model(server.url, taken.pop())  # a trainer ends
        asker.join(240)
    try:
        assert answered and isinstance(answered[0], list), answered
        assert smp.reloaded_model_id  # served from its training state, in the freed slot
    finally:
        sample.close(smp)


def _refused(server) -> int:
    """The models the server marked unloaded: while every slot stays taken, only refused creations add to them."""
    with closing(sqlite3.connect(server.home / "servers" / "default" / "tinker.db")) as db:
        return db.execute("SELECT count(*) FROM models WHERE status = 'unloaded'").fetchone()[0]


def _answer(sample, smp) -> object:
    try:
        return sample.complete(smp, [{"role": "user", "content": "hi"}])
    except Exception as e:  # the test asserts on it
        return e


def test_rlcli_sample_on_a_full_server_says_so_in_one_line(server):
    """A person waiting at `rlcli sample` is told at once, with the cause and the fix."""
    _, path = _finished_run(server.url, server.model, "full-now")
    with _full(server.url, server.model):
        proc = run_rlcli("sample", "--checkpoint", path, "--prompt", "hi", "--max-tokens", "4", env=server.env,
                         timeout=240)
    line = _one_line(proc.stderr)
    assert proc.returncode == 1 and "every LoRA slot" in line and "`rlcli serve start --slots N`" in line, line
    assert STALE not in line


def test_the_endpoints_reload_waits_its_bound_then_gives_up(server):
    """The endpoint's reload (RoutingSampler._load_state): a slot freed within its wait serves; none freed is
    NoFreeSlot, which the endpoint answers 503 (tests/unit/test_slot_wait_unit.py)."""
    from rlcli.endpoint.app import RoutingSampler
    from rlcli.endpoint.models import Answerer

    state, path = _finished_run(server.url, server.model, "full-endpoint")
    sampler = RoutingSampler(None, server.url, None, None, None, "tml-test")
    sampler.slot_wait_s = 6
    answerer = Answerer("m", path, 1, state)
    with _full(server.url, server.model) as taken:
        with pytest.raises(NoFreeSlot):
            sampler._load_state(answerer, "tml-test")
        unload_model(server.url, taken.pop())
        _, model_id = sampler._load_state(answerer, "tml-test")
    unload_model(server.url, model_id)
