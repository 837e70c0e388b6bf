"""`rlcli loop`'s rl and sft,distill stages against the real SkyRL server on CPU, the regression rule on.

One loop folder learns batch 1 (the door code, 42) with sft and promotes it; its regression set is that skill
asked about other doors, so a later candidate that forgets it fails the rule (margin 0.1). Batch 2 (a new
skill: the coins in a chest, 77) then arrives, and iteration 2 runs in three copies of the folder, each from
the same champion: `sft` alone (train_on new: it learns 77 and forgets 42, and the gate rejects it for the
regression), `sft,distill` (then distill from the champion on batch 1's prompts: the door code comes back),
and `rl` (a run on the replay env, scored and gated). The gate decides per slice: the doors asked in the regression
set and held out of batch 1 are one slice, which sft alone makes fall. Kept small: 48 and 96 chats, 8 sft steps, at
most 32 problems a slice of each set, 8 answer tokens, distill as many steps as batch 1's prompts fill, rl 2 steps
of 4 x 2.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from rlcli.loop import batches, gate, settings
from rlcli.loop.ledger import opened
from tests.conftest import run_rlcli

pytestmark = [pytest.mark.server, pytest.mark.slow]
MARGIN = 0.1
SETTINGS = dict(match="number", steps=8, lr=1e-2, save_every=0, max_tokens=8, eval_limit=32, train_on="new",
                regression_margin=MARGIN, heldout_share=0.2)  # the settings these figures were measured with
DOORS, CHESTS = "Door #: code please.", "Chest #: how many coins?"  # batch 1's and batch 2's slices


def loop_run(folder: Path, server) -> str:
    proc = run_rlcli("loop", "run", str(folder), "--once", env=server.env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.fixture(scope="module")
def champion_loop(server, tmp_path_factory):
    """A loop folder whose iteration 1 (sft on batch 1) was promoted with the regression rule on; batch 2 is
    waiting in its inbox."""
    tmp = tmp_path_factory.mktemp("loop-stages")
    made = tmp / "batches"
    made.mkdir()
    batches.write_batch(made / "batch-1.openai.jsonl", 1, 48)
    batches.write_batch(made / "batch-2.openai.jsonl", 2, 96)
    regression = batches.write_skill_regression(made / "doors.jsonl", 1, 16)
    (tmp / "inbox").mkdir()
    folder = tmp / "loop"
    run_rlcli("loop", "init", str(folder), "--traces", str(tmp / "inbox"), "--regression", str(regression),
              "--base-url", server.url, env=server.env, check=True)
    settings.write(folder, replace(settings.read(folder), **SETTINGS))
    shutil.copy(made / "batch-1.openai.jsonl", tmp / "inbox")
    err = loop_run(folder, server)
    with opened(folder) as ledger:
        it, found = ledger.iteration(1), ledger.stage(1, "evaluate")
    assert it["decision"] == "promoted", err[-2000:]
    assert found["regression"]["candidate"] >= 0.9  # the door code learned: now there is something to forget
    shutil.copy(made / "batch-2.openai.jsonl", tmp / "inbox")
    return folder


def iteration_two(champion_loop: Path, server, name: str, **changes) -> dict:
    """Iteration 2 in a copy of the loop folder, with `changes` to its settings; what the ledger recorded."""
    folder = champion_loop.parent / name
    shutil.copytree(champion_loop, folder)
    settings.write(folder, replace(settings.read(folder), **changes))
    err = loop_run(folder, server)
    print(f"{name}: " + "\n".join(x for x in err.splitlines() if "held-out" in x))  # pytest -rP shows it
    with opened(folder) as ledger:
        return {"folder": folder, "stderr": err, "iteration": ledger.iteration(2), "runs": ledger.runs(2),
                "evaluate": ledger.stage(2, "evaluate"), "gate": ledger.stage(2, "gate"),
                "champion": ledger.champion(), "scores": ledger.scores(2)}


@pytest.fixture(scope="module")
def sft_alone(champion_loop, server):
    return iteration_two(champion_loop, server, "sft", train="sft")


@pytest.fixture(scope="module")
def sft_distill(champion_loop, server):  # distill at lr 1e-2 recovered the door code in every run; 3e-3 did not
    return iteration_two(champion_loop, server, "sft-distill", train="sft,distill")


def regression(result: dict) -> float:
    return result["evaluate"]["regression"]["candidate"]


def test_sft_alone_forgets_and_the_regression_rule_rejects_it(sft_alone):
    """The per-slice gate rejects the candidate for one slice, the door code (held-out and regression doors),
    and names it."""
    it = sft_alone["iteration"]
    assert it["decision"] == "rejected", sft_alone["stderr"][-2000:]
    assert f"slice '{DOORS}' fell beyond the margin {MARGIN:g}" in it["why"]
    doors = next(x for x in sft_alone["evaluate"]["slices"] if x["name"] == DOORS)
    assert not doors["new"] and doors["high"] < 0 and doors["gain"] < -MARGIN and doors["n"] >= 16
    assert regression(sft_alone) < sft_alone["evaluate"]["regression"]["champion"] - MARGIN
    assert [r["kind"] for r in sft_alone["runs"]] == ["sft"] and sft_alone["champion"].iteration == 1


def test_sft_then_distill_from_the_champion_recovers_what_sft_forgot(sft_distill, sft_alone):
    runs = sft_distill["runs"]
    assert [r["kind"] for r in runs] == ["sft", "distill"], sft_distill["stderr"][-2000:]
    distill = json.loads((Path(runs[1]["folder"]) / "rlcli-run.json").read_text())
    recorded = json.loads(sft_distill["iteration"]["settings"])["champion"]  # the champion it started from
    assert distill["load_checkpoint"] == runs[0]["state_path"]  # distill starts from the sft stage's weights
    assert distill["teacher"] == recorded["state_path"] and recorded["iteration"] == 1  # taught by the champion
    where = sft_distill["folder"] / "iterations"
    prompts = (where / "0002" / "distill-prompts.jsonl").read_text()
    assert prompts == (where / "0001" / "train.jsonl").read_text()  # on the earlier iteration's data
    # what the regression rule watches came back, and the gate recorded it as kept (or a drop within the margin)
    assert regression(sft_distill) > regression(sft_alone) + MARGIN
    assert f"'{DOORS}' fell" not in sft_distill["iteration"]["why"]
    assert sft_distill["iteration"]["decision"] in ("promoted", "rejected")


def test_rl_iteration_records_its_run_scores_and_decision(champion_loop, server):
    done = iteration_two(champion_loop, server, "rl", train="rl", steps=2, batch_size=4, group_size=2, lr=0.0)
    assert [r["kind"] for r in done["runs"]] == ["rl"], done["stderr"][-2000:]
    run = Path(done["runs"][0]["folder"])
    assert json.loads((run / "rlcli-run.json").read_text())["load_checkpoint"] == \
        json.loads(done["iteration"]["settings"])["champion"]["state_path"]  # rl starts from the champion
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    heldout, reg = (gate.Comparison(**done["evaluate"][k]) for k in ("heldout", "regression"))
    slices = [gate.Slice(**x) for x in done["evaluate"]["slices"]]
    assert heldout.n >= 10 and reg.n == 16 and {x.name for x in slices} >= {DOORS, CHESTS}
    assert done["scores"][("candidate", "heldout")] == (heldout.candidate, heldout.n)  # the scores table agrees
    assert all(done["scores"][("candidate", f"slice:{x.name}")] == (x.candidate, x.n) for x in slices)
    promote, why = gate.decide_slices(slices, MARGIN)  # the recorded decision is the gate's on the recorded scores
    assert done["gate"] == {"promote": promote, "why": why, "manual": False}
    assert done["iteration"]["decision"] == ("promoted" if promote else "rejected")
    assert (done["champion"].iteration == 2) == promote
