"""The loop's slices and its per-slice gate without a server: the exact sign-flip test and its interval, the error
rate across slices (Bonferroni), the power check, how slices are found, and whole iterations with the model's
answers faked (the real server's runs are tests/integration/test_loop*.py)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from rlcli import export
from rlcli.loop import batches, commands, data, evaluation, gate, settings, slices, stages
from rlcli.loop.ledger import opened
from rlcli.problems.score import Scored

# --- the exact test and its interval -------------------------------------------------------------


def brute_tail(mags: list[int], observed: int) -> float:
    signs = itertools.product((1, -1), repeat=len(mags))
    sums = [sum(s * m for s, m in zip(each, mags, strict=True)) for each in signs]
    return sum(x >= observed for x in sums) / len(sums)


def test_upper_tail_counts_every_sign_assignment():
    rng = random.Random(3)
    for _ in range(60):
        mags = [rng.randint(0, 9) * rng.choice((1, 3)) for _ in range(rng.randint(1, 10))]
        observed = rng.randint(-sum(mags) - 2, sum(mags) + 2)
        assert gate.upper_tail(mags, observed) == pytest.approx(brute_tail(mags, observed), abs=1e-12)


def test_upper_tail_beyond_the_exact_limit_is_close(monkeypatch):
    mags = [1] * 60 + [2] * 40
    exact = gate.upper_tail(mags, 20)
    monkeypatch.setattr(gate, "EXACT_LIMIT", 64)
    assert gate.upper_tail(mags, 20) == pytest.approx(exact, abs=0.01)


@pytest.mark.parametrize(("improved", "shows"), [(5, False), (6, True)])
def test_a_slice_needs_enough_improved_problems_to_show_a_gain(improved, shows):
    """2^-5 > 0.025 >= 2^-6: at 95% a gain shows from 6 problems that all improved, never from 5 (the bootstrap
    the gate used before called 3 of 3 certain)."""
    found = gate.sign_flip([0.0] * improved, [1.0] * improved, 0.95)
    assert (found.low > 0) == shows and found.gain == 1 and found.high == 1
    assert gate.needed(0.95) == 6


def test_the_interval_at_zero_is_mcnemars_exact_test():
    # 7 better, 1 worse, 8 unchanged: P(Bin(8, 1/2) >= 7) = 9/256 = 0.035
    champion, candidate = [0.0] * 7 + [1.0] + [1.0] * 8, [1.0] * 7 + [0.0] + [1.0] * 8
    assert gate.sign_flip(champion, candidate, 1 - 2 * 0.036).low > 0  # one tail 0.036 > 0.035: rejected
    assert gate.sign_flip(champion, candidate, 1 - 2 * 0.034).low <= 0
    same = gate.sign_flip([1, 0] * 4, [1, 0] * 4)
    assert (same.gain, same.low, same.high, same.n) == (0, 0, 0, 8)
    too_few = gate.sign_flip([1, 0], [1, 0])  # 2 problems can show nothing either way
    assert (too_few.low, too_few.high) == (-1, 1)
    mixed = gate.sign_flip([0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0])
    assert mixed.low < 0 < mixed.high
    assert gate.sign_flip([], []).n == 0
    with pytest.raises(ValueError):
        gate.sign_flip([1], [1, 0])


def test_shares_of_k_answers_are_compared_on_their_grid():
    champion = [0.0, 0.25, 0.5, 0.0, 0.25, 0.0, 0.5, 0.25]
    candidate = [0.5, 0.75, 1.0, 0.25, 0.75, 0.5, 0.75, 0.5]
    found = gate.sign_flip(champion, candidate, 0.95, k=4)
    assert found.gain == pytest.approx(3.25 / 8) and 0 < found.low <= found.gain <= found.high <= 1


def test_interval_ends_cross_once():
    """The bisection's premise: along the grid, the test rejects every shift below the low end and none above it
    (and the mirror for the high end)."""
    rng = random.Random(5)
    for _ in range(80):
        k = rng.choice((1, 2, 4))
        diffs = [rng.randint(-k, k) for _ in range(rng.randint(1, 10))]
        above = [gate._rejects_above(diffs, j, 0.05) for j in range(-k * gate.GRID, k * gate.GRID + 1)]
        below = [gate._rejects_below(diffs, j, 0.05) for j in range(-k * gate.GRID, k * gate.GRID + 1)]
        assert above == sorted(above, reverse=True) and below == sorted(below), diffs


# --- slices, the decision and the error rate -----------------------------------------------------


def test_each_slice_is_compared_at_the_bonferroni_confidence():
    found = gate.compare_slices({"a": ([0.0] * 8, [1.0] * 8), "b": ([1.0] * 8, [1.0] * 8)}, {"a"}, 0.95)
    assert [(x.name, x.new) for x in found] == [("a", True), ("b", False)]
    assert all(x.confidence == pytest.approx(0.975) for x in found)
    assert gate.needed(gate.each_confidence(0.95, 2)) == 7 and found[0].gained()


def test_per_slice_decisions_name_every_failed_rule():
    def cut(name, new, a, b):
        return gate.compare_slices({name: (a, b)}, {name} if new else set(), 0.95)[0]

    learned = cut("door", True, [0.0] * 10, [1.0] * 10)
    kept = cut("sums", False, [1.0] * 10, [1.0] * 9 + [0.0])
    forgot = cut("sums", False, [1.0] * 10, [0.0] * 10)
    flat = cut("chest", True, [0.0] * 10, [0.0] * 9 + [1.0])
    ok, why = gate.decide_slices([learned, kept], 0.05)
    assert ok and why.startswith("gained: 'door'") and "no slice fell" in why
    ok, why = gate.decide_slices([learned, forgot], 0.05)
    assert not ok and "slice 'sums' fell beyond the margin 0.05" in why and "gained" not in why
    ok, why = gate.decide_slices([flat, forgot], 0.05)  # both rules failed: both named
    assert not ok and why.startswith("no new slice gained beyond its interval ('chest'") and "'sums' fell" in why
    assert not gate.decide_slices([kept], 0.05)[0] and "no slice is new" in gate.decide_slices([kept], 0.05)[1]
    assert gate.decide_slices([learned, forgot], 1.0)[0]  # a drop within the margin passes
    assert gate.decide_slices([], 0.05) == (False, "no problems to compare on")


def test_the_gate_errs_at_most_one_minus_confidence_across_slices():
    """Simulated: both models equally good on 6 slices (each problem's pair drawn alike); the per-slice gate
    credits a gain or blames a drop in at most 5% of 400 evaluations."""
    rng = random.Random(11)
    wrong = 0
    for _ in range(400):
        scores = {}
        for name in "abcdef":
            p = rng.random()
            scores[name] = ([float(rng.random() < p) for _ in range(12)], [float(rng.random() < p) for _ in range(12)])
        found = gate.compare_slices(scores, {"a", "b", "c"}, 0.95)
        wrong += any(x.gained() or x.fell(0.0) for x in found)
    assert wrong / 400 <= 0.05


def test_power_says_which_slices_cannot_show_a_gain():
    found = {x.name: x for x in gate.power({"chest": (3, 3, True), "door": (23, 23, True), "door-known": (23, 2, True),
                                            "old": (4, 4, False)}, 0.95)}
    assert found["chest"].needed == 8 and found["chest"].blind  # 4 slices at 98.75%: 8 must improve
    assert not found["door"].blind and found["door"].smallest_gain == pytest.approx(8 / 23)
    assert found["door-known"].blind  # the champion already gets 21 of 23 right
    assert gate.power({"x": (10, 10, True)}, 0.95, k=4)[0].smallest_gain == pytest.approx(6 / 40)


def test_templates_mask_what_varies():
    def of(text):
        return slices.template({"messages": [{"role": "user", "content": text}]})

    assert of("Door 512: code please.") == of("Door 7: code please.") == "Door #: code please."
    assert of("Email bob@x.com about \"the report\" by 2024-05-01") == 'Email <email> about "…" by #'
    assert of("Order 7f3a9c2e11 status? see https://x.y/z") == "Order # status? see <url>"
    assert len(of("word " * 100)) == slices.LONGEST


def test_a_tag_wins_then_a_shared_template_then_the_file():
    def conv(text, tag=None):
        return {"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}],
                **({"slice": tag} if tag else {})}

    convs = [conv(f"Door {i}: code please.") for i in range(5)] + [conv(f"What is {i} + 1?") for i in range(4)]
    convs += [conv("Door 9: code please.", "billing"), conv("a one-off question")]
    names = slices.assign(convs, ["f@1"] * len(convs), set())
    assert names == ["Door #: code please."] * 5 + ["f@1"] * 4 + ["billing", "f@1"]
    assert slices.assign(convs[5:7], ["f@2"] * 2, {"What is # + #?"}) == ["What is # + #?"] * 2  # a slice already


def test_import_keeps_the_slice_a_log_tags():
    from collections import Counter

    from rlcli.data import importers, otel

    chat = {"request": {"messages": [{"role": "user", "content": "hi"}], "metadata": {"slice": "greeting"}},
            "response": {"choices": [{"message": {"role": "assistant", "content": "hello"}}]}}
    assert importers.from_openai(chat, Counter())["slice"] == "greeting"
    assert "slice" not in importers.from_openai({**chat, "request": {"messages": chat["request"]["messages"]}},
                                                Counter())
    shaped = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}], "slice": "s"}
    assert importers.from_messages(shaped, Counter())["slice"] == "s"
    responses = {"request": {"input": "hi", "metadata": {"slice": "r"}},
                 "response": {"object": "response", "status": "completed", "output": [
                     {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]}]}}
    assert importers.from_openai(responses, Counter())["slice"] == "r"
    run = {"run_type": "llm", "id": "1", "extra": {"metadata": {"slice": "ls"}},
           "inputs": {"messages": [{"role": "user", "content": "hi"}]},
           "outputs": {"generations": [{"text": "x"}]}}
    assert importers.from_langsmith(run, Counter())["slice"] == "ls"
    span = {"name": "chat", "attributes": [
        {"key": "gen_ai.input.messages", "value": {"stringValue": json.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}])}},
        {"key": "gen_ai.output.messages", "value": {"stringValue": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "x"}]}])}},
        {"key": "rlcli.slice", "value": {"stringValue": "otel"}}]}
    assert otel.from_span(span, Counter())["slice"] == "otel"


# --- the loop with the model's answers faked -----------------------------------------------------


@pytest.fixture
def loop(tmp_path, monkeypatch):
    """A loop folder guarding batch 1's door code (16 doors as its regression set), batch 1 in its inbox; training
    and export are faked, and each model's answers come from `knows` (model iteration -> skills it answers)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inbox").mkdir()
    batches.write_batch(tmp_path / "inbox" / "b1.jsonl", 1, 48)
    doors = batches.write_skill_regression(tmp_path / "doors.jsonl", 1, 16)
    folder = tmp_path / "loop"
    commands.init(commands.InitOptions(dir=str(folder), traces="inbox", regression=str(doors), match="number",
                                       heldout_share=0.2, base_url="http://127.0.0.1:9"))  # the split counted below
    knows: dict[int, set[str]] = {0: {"What"}}

    def train(folder, ledger, n, s, champ, url):
        with ledger.transaction() as db:
            db.execute("INSERT INTO runs VALUES (?, 0, 'sft', 'x', ?, ?)",
                       (n, f"tinker://r{n}/weights/final", f"tinker://r{n}/sampler_weights/final"))
            ledger.done(db, n, "train:0:sft", {})

    def answers(model, problems, s, url, **how):
        skills = knows[model.iteration]
        return [Scored(float(p.last_user().split()[0] in skills), 0.0, "") for p in problems]

    monkeypatch.setattr(stages, "train", train)
    monkeypatch.setattr(export, "export", lambda o: Path(o.output).mkdir(parents=True))  # no server to download from
    monkeypatch.setattr(evaluation, "answers", answers)
    return folder, tmp_path / "inbox", knows


def run_once(folder: Path, capsys) -> tuple[dict, str]:
    assert commands.run(commands.RunOptions(dir=str(folder), once=True)) == 0
    with opened(folder) as ledger:
        n = ledger.last_iteration()
        return ledger.iteration(n), capsys.readouterr().err


def test_an_iteration_that_learns_its_slice_is_promoted_and_one_that_forgets_is_rejected(loop, capsys):
    folder, inbox, knows = loop
    knows[1] = {"What", "Door"}
    it, err = run_once(folder, capsys)
    assert it["decision"] == "promoted", err
    assert "gained: 'Door #: code please.'" in it["why"]
    assert "power: 2 slices at 97.50% each (95% together)" in err and "at least 7 of its problems" in err
    assert "slice 'What is # + #?' (new, 4 problems): cannot show a gain" in err and "fix: more held-out" in err
    with opened(folder) as ledger:
        held = ledger.problem_slices("heldout")
        assert {name for name, _ in held.values()} == {"Door #: code please.", "What is # + #?"}
        assert {name for name, _ in ledger.problem_slices("regression").values()} == {"Door #: code please."}
        assert ledger.scores(1)[("candidate", "slice:Door #: code please.")] == (1.0, 26)
    rows = data.read_jsonl(data.iteration_dir(folder, 1) / "eval.jsonl")
    per_slice = {r["name"]: r for r in rows if r["kind"] == "slice"}
    assert per_slice["Door #: code please."]["n"] == 26 and per_slice["Door #: code please."]["low"] > 0
    assert all(r["slice"] and r["key"] for r in rows if r["kind"] == "answer")

    batches.write_batch(inbox / "b2.jsonl", 2, 48)
    knows[2] = {"What", "Chest"}  # learns the chest, forgets the door
    it, err = run_once(folder, capsys)
    assert it["decision"] == "rejected" and "slice 'Door #: code please.' fell beyond the margin 0.05" in it["why"]
    assert commands.history(commands.Folder(dir=str(folder))) == 0
    shown = capsys.readouterr().out
    assert "per slice:" in shown and "slices at 97.50% each" in shown
    door = next(line for line in shown.splitlines()[shown.splitlines().index("  iteration 2"):] if "Door" in line)
    assert "1.00->0.00" in door and "n=26" in door and door.rstrip().endswith("fell")
    assert commands.status(commands.Folder(dir=str(folder))) == 0
    assert "Chest #: how many coins?" in capsys.readouterr().out


def test_the_pooled_rule_stays_an_option(loop, capsys):
    folder, _, knows = loop
    knows[1] = {"What", "Door"}
    settings.write(folder, settings.read(folder).__class__(**{**vars(settings.read(folder)), "gate": "pooled"}))
    it, _ = run_once(folder, capsys)
    assert it["decision"] == "promoted" and it["why"].startswith("held-out gain")


def test_settings_accept_the_new_gate_and_samples():
    assert settings.loads('traces = "x"\ngate = "pooled"\nsamples = 4\ntemperature = 1').samples == 4
    with pytest.raises(Exception, match="needs --temperature above 0"):
        settings.loads('traces = "x"\nsamples = 4')


def test_the_notebook_records_each_slice(loop, capsys):
    from rlcli import lab

    folder, _, knows = loop
    knows[1] = {"What", "Door"}
    run_once(folder, capsys)
    result = lab.loop_result(lab.loop_rows(folder), {})
    door = next(x for x in result["slices"][0] if x["name"] == "Door #: code please.")
    assert door["new"] and (door["champion"], door["candidate"], door["n"]) == (0.0, 1.0, 26) and door["low"] > 0
