"""`rlcli loop` without a server: loop.toml, the ledger, ingest accounting, the split, the gate's math, the lock,
the commands' one-line refusals, and a run with nothing new."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlcli import export
from rlcli.cli import main
from rlcli.errors import UsageError
from rlcli.loop import batches, commands, data, gate, settings
from rlcli.loop.ledger import Champion, opened
from rlcli.loop.settings import LoopSettings


def test_toml_round_trip_keeps_every_setting():
    s = LoopSettings(traces='logs/"odd" \\ name*.jsonl', train="sft,distill", hook="echo 'done'\tnow",
                     lr=0.01, distill_lr=0.002, distill_steps=3, shuffle_answers=True)
    assert settings.loads(settings.dumps(s)) == s


@pytest.mark.parametrize(("text", "words"), [
    ('traces = "x"\ntrain = "sft,dance"', "--train"),
    ('traces = "x"\ngate = "maybe"', "--gate"),
    ('traces = "x"\nsteps = "four"', "steps"),
    ('traces = "x"\ncolour = 1', "unknown setting 'colour'"),
    ('traces = "x"\nheldout_share = 1', "--heldout-share"),
    ('traces = "x"\nmatch = "regex:("', "--match"),
    ('traces = "x"\ndistill_lr = -0.001', "--distill-lr must be 0 or more"),
    ("train = sft", "not valid TOML"),
])
def test_bad_settings_are_one_line(text, words):
    with pytest.raises(UsageError, match=words.replace("-", r"\-").replace("(", r"\(")) as e:
        settings.loads(text)
    assert "\n" not in str(e.value)


def test_integer_where_a_float_goes_is_accepted():
    assert settings.loads('traces = "x"\nlr = 1').lr == 1.0


def test_paired_bootstrap_interval():
    same = gate.paired_bootstrap([1, 0, 1, 0], [1, 0, 1, 0])
    assert (same.gain, same.low, same.high) == (0, 0, 0)
    better = gate.paired_bootstrap([0.0] * 10, [1.0] * 8 + [0.0] * 2, seed=1)
    assert better.gain == pytest.approx(0.8) and 0 < better.low <= 0.8 <= better.high <= 1
    mixed = gate.paired_bootstrap([0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0])
    assert mixed.low < 0 < mixed.high
    assert gate.paired_bootstrap([], []).n == 0
    with pytest.raises(ValueError):
        gate.paired_bootstrap([1], [1, 0])


def test_gate_decisions():
    up = gate.Comparison(0.2, 0.8, 0.6, 0.3, 0.9, 10)
    flat = gate.Comparison(0.5, 0.6, 0.1, -0.2, 0.4, 10)
    kept = gate.Comparison(0.9, 0.88, -0.02, -0.1, 0.05, 8)
    dropped = gate.Comparison(0.9, 0.5, -0.4, -0.7, -0.1, 8)
    assert gate.decide(up, kept, 0.05)[0]
    assert not gate.decide(flat, kept, 0.05)[0]
    ok, why = gate.decide(up, dropped, 0.05)
    assert not ok and "regression score fell 0.400" in why
    assert gate.decide(up, dropped, 0.5)[0]
    ok, why = gate.decide(flat, dropped, 0.05)  # both rules failed: both named
    assert not ok and why.startswith("held-out gain +0.100 is not above 0") and "regression score fell 0.400" in why
    assert not gate.decide(gate.Comparison(0, 0, 0, 0, 0, 0), kept, 0.05)[0]


@pytest.fixture
def loop(tmp_path, monkeypatch):
    """A loop folder over a traces folder holding batch 1, its settings pointing at a dead server."""
    monkeypatch.chdir(tmp_path)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    batches.write_batch(inbox / "b1.jsonl", 1, 24)
    regression = batches.write_regression(tmp_path / "regression.jsonl")
    assert commands.init(commands.InitOptions(dir=str(tmp_path / "loop"), traces="inbox", regression=str(regression),
                                              base_url="http://127.0.0.1:9")) == 0
    return tmp_path / "loop", inbox


def _ingest(folder: Path) -> int:
    with commands.locked(folder) as ledger:
        s = settings.read(folder)
        n = commands._begin(ledger, s)
        data.ingest(folder, ledger, n, s, data.new_files(ledger, s))
        data.split(folder, ledger, n, s)
        return n


def test_every_line_is_accounted_for_across_files(loop):
    folder, inbox = loop
    n1 = _ingest(folder)
    shutil.copy(inbox / "b1.jsonl", inbox / "b1-copy.jsonl")  # the same content again: never ingested twice
    batches.write_batch(inbox / "b2.jsonl", 2, 24)
    b1 = (inbox / "b1.jsonl").read_text().splitlines()
    (inbox / "b3.jsonl").write_text("\n".join(b1[:6] + ["{not json"]) + "\n")  # repeats, and a bad line
    n2 = _ingest(folder)
    with opened(folder) as ledger:
        files = ledger.files()
        assert [f["iteration"] for f in files] == [n1, n2, n2]
        assert {Path(f["path"]).name for f in files} == {"b1.jsonl", "b2.jsonl", "b3.jsonl"}
        for f in files:
            assert f["lines"] == f["written"] + sum(f["dropped"].values())
            assert f["written"] == f["duplicate"] + f["train"] + f["heldout"]
        b3 = next(f for f in files if f["path"].endswith("b3.jsonl"))
        assert (b3["lines"], b3["dropped"], b3["written"], b3["duplicate"]) == (7, {"bad_json": 1}, 6, 6)
        for n in (n1, n2):
            kept = len(data.read_jsonl(data.iteration_dir(folder, n) / "new.jsonl"))
            assert kept == sum(f["written"] - f["duplicate"] for f in ledger.files(n))
            assert ledger.stage(n, "split") == {
                "train": len(data.read_jsonl(data.iteration_dir(folder, n) / "train.jsonl")),
                "heldout": len(data.read_jsonl(data.iteration_dir(folder, n) / "heldout.jsonl"))}


def test_split_is_stable_and_shared_prompts_stay_held_out():
    convs = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]}
             for i in range(400)]
    held = [data.held_out(c, 0.2) for c in convs]
    assert 40 < sum(held) < 120
    other_reply = [{"messages": [c["messages"][0], {"role": "assistant", "content": "b"}]} for c in convs]
    assert [data.held_out(c, 0.2) for c in other_reply] == held  # the prompt decides, never the reply


def test_shuffled_answers_keep_prompts_and_move_replies():
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(10)]
    bad = data.shuffled_answers(rows, 0)
    assert sorted(r["messages"][0]["content"] for r in bad) == sorted(f"q{i}" for i in range(10))
    assert all(r["messages"][0]["content"][1:] != r["messages"][1]["content"][1:] for r in bad)


def test_ledger_alias_history(tmp_path):
    with opened(tmp_path) as ledger:
        assert ledger.champion() == Champion(0) and ledger.champion().is_base
        with ledger.transaction() as db:
            ledger.move_alias(db, Champion(1, "tinker://a/sampler_weights/f", "tinker://a/weights/f"), "gate")
        assert ledger.champion().iteration == 1
        with pytest.raises(RuntimeError), ledger.transaction() as db:  # a failed stage leaves nothing behind
            ledger.move_alias(db, Champion(2, "s", "t"), "gate")
            raise RuntimeError
        assert ledger.champion().iteration == 1 and len(ledger.aliases()) == 1


def test_second_command_on_a_folder_is_refused(loop):
    folder, _ = loop
    with commands.locked(folder), pytest.raises(UsageError, match="another `rlcli loop` command is using"):
        with commands.locked(folder):
            pass


def test_run_with_nothing_new_does_nothing(loop, capsys):
    folder, inbox = loop
    for p in inbox.iterdir():
        p.unlink()
    assert commands.run(commands.RunOptions(dir=str(folder), once=True)) == 0
    assert "nothing new" in capsys.readouterr().err
    with opened(folder) as ledger:
        assert ledger.iterations() == []


def test_history_and_status_read_the_ledger(loop, capsys):
    folder, _ = loop
    _ingest(folder)
    assert commands.history(commands.Folder(dir=str(folder))) == 0
    assert commands.status(commands.Folder(dir=str(folder))) == 0
    out = capsys.readouterr().out
    assert "held-out champ->cand" in out and "running" in out
    assert "champion: base model" in out and "pending: iteration 1 stopped after split" in out


@pytest.mark.parametrize(("args", "words"), [
    (["loop", "init", "{tmp}/l"], "pass --traces"),
    (["loop", "init", "{tmp}/l", "--traces", "x", "--train", "sft,nap"], "--train 'sft,nap'"),
    (["loop", "init", "{tmp}/l", "--traces", "x", "--regression", "{tmp}/none.jsonl"], "no such file"),
    (["loop", "run", "{tmp}/nowhere"], "is not a loop folder"),
    (["loop", "promote", "{tmp}/nowhere", "1"], "is not a loop folder"),
])
def test_bad_input_is_one_line(tmp_path, capsys, args, words):
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


def test_parse_every():
    assert commands.parse_every("90s") == 90 and commands.parse_every("1h") == 3600
    assert commands.parse_every("2") == 2
    with pytest.raises(UsageError, match="--every"):
        commands.parse_every("soon")


def test_init_refuses_a_used_folder(loop):
    folder, _ = loop
    with pytest.raises(UsageError, match="not empty"):
        commands.init(commands.InitOptions(dir=str(folder), traces="inbox"))


def test_watch_sleeps_between_looks_and_once_excludes_it(loop, monkeypatch):
    folder, inbox = loop
    for p in inbox.iterdir():
        p.unlink()
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        if len(slept) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(commands.time, "sleep", sleep)
    with pytest.raises(KeyboardInterrupt):
        commands.run(commands.RunOptions(dir=str(folder), watch=True, every="15m"))
    assert slept == [900, 900]
    with pytest.raises(UsageError, match="--once and --watch"):
        commands.RunOptions(dir=str(folder), once=True, watch=True)


def test_a_hook_killed_before_it_ran_runs_on_the_next_loop_run(loop, monkeypatch):
    """The alias moved and `promote` was recorded, the hook not: the next run runs it once, then finishes."""
    folder, _ = loop
    n = _ingest(folder)
    ran = []
    monkeypatch.setattr(commands.champion, "run_hook", lambda folder, s, champ: ran.append(champ.iteration))
    monkeypatch.setattr(export, "export", lambda o: Path(o.output).mkdir(parents=True))  # no server to download from
    monkeypatch.setattr(commands.stages, "train", lambda *a: None)
    cand = Champion(n, "tinker://r/sampler_weights/final", "tinker://r/weights/final")
    with opened(folder) as ledger, ledger.transaction() as db:
        db.execute("INSERT INTO runs VALUES (?, 0, 'sft', 'x', ?, ?)", (n, cand.state_path, cand.sampler_path))
        ledger.done(db, n, "evaluate", {"heldout": gate.Comparison(0, 1, 1, 0.5, 1, 4).__dict__,
                                        "regression": gate.Comparison(1, 1, 0, 0, 0, 4).__dict__})
        ledger.done(db, n, "gate", {"promote": True, "why": "test", "manual": False})
        ledger.move_alias(db, cand, "gate")
        ledger.done(db, n, "promote", {})
    assert commands.run(commands.RunOptions(dir=str(folder), once=True)) == 0
    assert ran == [n]
    with opened(folder) as ledger:
        assert ledger.iteration(n)["decision"] == "promoted" and ledger.stage(n, "hook") is not None


def test_the_dpo_stage_takes_this_iterations_pairs_and_with_none_passes_the_weights_through(loop, capsys):
    from dataclasses import replace

    from rlcli.loop import stages

    folder, inbox = loop
    n1 = _ingest(folder)
    batches.write_batch(inbox / "b2.jsonl", 2, 24)
    n2 = _ingest(folder)
    pair = {"messages": [{"role": "user", "content": "2 + 2?"}], "chosen": {"role": "assistant", "content": "4"},
            "rejected": {"role": "assistant", "content": "5"}}
    data.write_jsonl(data.iteration_dir(folder, n1) / stages.PAIRS, [pair])
    champ = Champion(1, "tinker://m/sampler_weights/a", "tinker://m/weights/a")
    s = replace(settings.read(folder), train="dpo")
    with opened(folder) as ledger:
        assert stages.pairs(folder, ledger, n2, s) == [pair]  # train_on all: the earlier iteration's too
        assert stages.pairs(folder, ledger, n2, replace(s, train_on="new")) == []
        stages.train(folder, ledger, n2, replace(s, train_on="new"), champ, "http://127.0.0.1:9")
        assert ledger.stage(n2, "train:0:dpo") == {"skipped": f"dpo skipped (no preference pairs in "
                                                              f"{data.iteration_dir(folder, n2) / stages.PAIRS}): "
                                                              "the weights pass through unchanged"}
        assert ledger.runs(n2) == [] and stages.candidate(ledger, n2) is None
        assert stages.candidate(ledger, n2, champ) == Champion(n2, champ.sampler_path, champ.state_path)
    assert "dpo skipped (no preference pairs" in capsys.readouterr().err


def test_a_pairs_file_with_a_bad_line_stops_the_dpo_stage_with_one_line_naming_it(loop):
    from dataclasses import replace

    from rlcli.loop import stages

    folder, _ = loop
    n = _ingest(folder)
    path = data.iteration_dir(folder, n) / stages.PAIRS
    answer = {"role": "assistant", "content": "4"}
    path.write_text(json.dumps({"messages": [], "chosen": answer, "rejected": answer}) + "\n")
    with opened(folder) as ledger, pytest.raises(UsageError) as e:
        stages.pairs(folder, ledger, n, replace(settings.read(folder), train="dpo"))
    assert str(e.value).startswith(f"{path} line 1: the prompt (messages) is empty")
    path.write_text("\n")  # an empty file is no pair, not an error
    with opened(folder) as ledger:
        assert stages.pairs(folder, ledger, n, settings.read(folder)) == []


def test_every_stage_and_the_evaluation_take_the_loops_server_timeout(tmp_path):
    """`loop init --server-timeout S` (loop.toml's server_timeout): each stage's trainer is given it, so a server
    that stops answering ends the stage in S seconds, as it ends the evaluation."""
    from rlcli.loop import settings, stages
    from rlcli.loop.ledger import Champion

    dataset = tmp_path / "train.jsonl"
    dataset.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1?"},
                                                {"role": "assistant", "content": "2"}]}) + "\n")
    s = settings.LoopSettings(traces=str(tmp_path / "*.jsonl"), server_timeout=7.5)
    for kind in settings.STAGES:
        _, options = stages.stage(kind, tmp_path / kind, dataset, None, Champion(0), s, "http://127.0.0.1:1", False)
        assert options.server_timeout == 7.5, kind
    assert settings.LoopSettings(traces="x").server_timeout == 60.0  # a trainer's own default
