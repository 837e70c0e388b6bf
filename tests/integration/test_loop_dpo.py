"""`rlcli loop`'s dpo stage against the real SkyRL server on CPU: an iteration whose folder holds preference pairs
(iterations/0001/pairs.jsonl, as the endpoint's feedback ingest writes them) trains sft, then dpo from sft's state
on those pairs, and the dpo run's weights are the candidate the gate judges. Kept small: 24 chats, 4 steps a stage,
16 pairs of 8 a step, at most 8 problems a set, 8 answer tokens.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from rlcli.loop import batches, data, settings, stages
from rlcli.loop.ledger import opened
from tests.conftest import run_rlcli

pytestmark = [pytest.mark.server, pytest.mark.slow]
SETTINGS = dict(train="sft,dpo", match="number", steps=4, lr=1e-2, save_every=0, max_tokens=8, eval_limit=8,
                regression_margin=1.0)


def pairs(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
             "chosen": {"role": "assistant", "content": str(2 * i)},
             "rejected": {"role": "assistant", "content": "I do not know."}} for i in range(n)]


@pytest.fixture(scope="module")
def iteration(server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop-dpo")
    (tmp / "inbox").mkdir()
    batches.write_batch(tmp / "inbox" / "batch-1.openai.jsonl", 1, 24)
    folder = tmp / "loop"
    run_rlcli("loop", "init", str(folder), "--traces", str(tmp / "inbox"), "--regression",
              str(batches.write_regression(tmp / "regression.jsonl")), "--base-url", server.url, env=server.env,
              check=True)
    settings.write(folder, replace(settings.read(folder), **SETTINGS))
    data.write_jsonl(data.iteration_dir(folder, 1) / stages.PAIRS, pairs(16))
    proc = run_rlcli("loop", "run", str(folder), "--once", env=server.env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with opened(folder) as ledger:
        found = {"runs": ledger.runs(1), "iteration": ledger.iteration(1), "dpo": ledger.stage(1, "train:1:dpo"),
                 "candidate": stages.candidate(ledger, 1)}
    history = run_rlcli("loop", "history", str(folder), env=server.env, check=True).stdout
    return folder, proc.stderr, found, history


def test_dpo_trains_from_the_sft_stage_on_the_iterations_pairs(iteration):
    folder, err, found, _ = iteration
    sft, dpo = found["runs"]
    assert (sft["kind"], dpo["kind"]) == ("sft", "dpo")
    info = json.loads((data.iteration_dir(folder, 1) / "run-1-dpo" / "rlcli-run.json").read_text())
    assert info["load_checkpoint"] == sft["state_path"] and info["pairs"] == 16  # the reference is sft's weights
    steps = [json.loads(line) for line in (data.iteration_dir(folder, 1) / "run-1-dpo" / "metrics.jsonl")
             .read_text().splitlines()]
    print(f"loop dpo: margin {steps[0]['margin']:.3f} -> {steps[-1]['margin']:.3f}, accuracy "
          f"{steps[0]['accuracy']:.2f} -> {steps[-1]['accuracy']:.2f}")
    assert len(steps) == 4 and steps[-1]["margin"] > steps[0]["margin"] + 0.05  # the weights moved off sft's
    assert "iteration 1: dpo from the previous stage" in err


def test_the_dpo_runs_weights_are_the_candidate_and_the_history_names_the_run(iteration):
    _, _, found, history = iteration
    sft, dpo = found["runs"]
    assert dpo["state_path"] != sft["state_path"] and dpo["sampler_path"] != sft["sampler_path"]
    assert found["dpo"] == {"state_path": dpo["state_path"], "sampler_path": dpo["sampler_path"]}
    assert found["candidate"].sampler_path == dpo["sampler_path"]
    assert found["iteration"]["decision"] in ("promoted", "rejected")  # judged by the gate like any candidate
    assert "sft+dpo" in history
