"""rlcli.slot_wait's rule on a fake service: which failures mean "no free slot", how long it asks again, and the one
line it ends with. The real server's refusals: tests/integration/test_slots.py."""

from __future__ import annotations

import pytest

from rlcli.slot_wait import NoFreeSlot, load_state, slot_refused

FULL = ("Request failed: model s:train:3 could not be created: Maximum number of LoRA adapters (3) reached: all 2 "
        "LoRA slots of this server are in use; unload a model, or restart the server with more")
STOCK = "Request failed: Model s:train:3 not loaded (likely stale request from previous server)"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class Answers:
    def __init__(self, outcome):
        self.outcome = outcome

    def result(self):
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


class Scripted:
    def __init__(self, *outcomes):
        self.outcomes, self.asked = list(outcomes), 0

    def create_training_client_from_state(self, state: str) -> Answers:
        self.asked += 1
        return Answers(self.outcomes.pop(0) if self.outcomes else "trainer")


def test_a_full_server_and_a_stock_servers_not_loaded_are_refused_slots():
    assert slot_refused(RuntimeError(FULL)) and slot_refused(RuntimeError(STOCK))
    assert not slot_refused(RuntimeError("Checkpoint not found"))


def test_it_asks_again_until_a_slot_frees():
    clock, service = Clock(), Scripted(RuntimeError(FULL), RuntimeError(STOCK))
    assert load_state(service, "tinker://r/weights/a", "http://s", 60, 5, clock, clock.sleep) == "trainer"
    assert service.asked == 3 and clock.now == 10


def test_it_ends_with_one_line_naming_the_cause_and_the_fix_when_none_frees():
    clock, service = Clock(), Scripted(*[RuntimeError(FULL)] * 100)
    with pytest.raises(NoFreeSlot) as ended:
        load_state(service, "tinker://r/weights/a", "http://s", 30, 5, clock, clock.sleep)
    line = str(ended.value)
    assert "\n" not in line and "stale" not in line and "waited 30 s" in line, line
    assert "every LoRA slot of the server at http://s is in use" in line and "`rlcli serve start --slots N`" in line
    assert clock.now <= 30


def test_no_wait_asks_once_and_other_failures_pass_through():
    clock, service = Clock(), Scripted(RuntimeError(FULL))
    with pytest.raises(NoFreeSlot) as ended:
        load_state(service, "s", "http://s", 0, 5, clock, clock.sleep)
    assert service.asked == 1 and "waited" not in str(ended.value)
    with pytest.raises(RuntimeError, match="Checkpoint not found"):
        load_state(Scripted(RuntimeError("Checkpoint not found")), "s", "http://s", 60, 5, clock, clock.sleep)


def test_the_endpoint_answers_a_full_server_503_with_the_line():
    import json

    from rlcli.endpoint.app import _backend_error

    answer = _backend_error("openai", None, NoFreeSlot("every LoRA slot of the server at http://s is in use"))
    assert answer.status == 503
    assert "every LoRA slot" in json.loads(answer.text)["error"]["message"]


def test_a_full_server_leaves_the_loops_evaluation_to_be_run_again(monkeypatch, tmp_path, health_server):
    """Nothing of the stage is recorded (the ledger is not touched), and the line says how to resume. The server
    answers its health route (the evaluation's watchdog would otherwise call the failure a server gone)."""
    from rlcli.loop import evaluation
    from rlcli.loop.ledger import Champion
    from rlcli.loop.settings import LoopSettings

    def full(*_):
        raise NoFreeSlot("every LoRA slot of the server at http://s is in use")

    monkeypatch.setattr(evaluation, "plan", lambda *_: evaluation.Plan([], frozenset()))
    monkeypatch.setattr(evaluation, "answers_of", full)
    settings, candidate = LoopSettings(traces="t/*.jsonl"), Champion(2, "tinker://r/sampler_weights/a")
    with pytest.raises(NoFreeSlot) as ended:
        evaluation.evaluate(tmp_path, None, 2, settings, Champion(0), candidate, health_server)
    assert f"`rlcli loop run {tmp_path}` resumes iteration 2 at its evaluation" in str(ended.value)
