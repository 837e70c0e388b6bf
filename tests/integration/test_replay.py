"""`--env replay` and `rlcli synth qa` on the real SkyRL server with the embedded model.

The trace set is one-digit sums the base model answers partly (in several wordings; `--match number`
reads the last number). One run trains on it; the asserts are what holds through sampling noise: every
step logs the reward's components, every rollout names its source line, and the mean reward of the
second half of the run is above the first half's (a run made while writing: 0.30 -> 0.41). The
synthesized QA file goes through `train rl` and `eval` unchanged.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_rlcli

pytestmark = pytest.mark.server

TRACES = REPO / "tests" / "fixtures" / "traces"
SUMS = TRACES / "one_digit_sums.jsonl"  # 20 sums x + y (x 0..4, y 5..8), each logged 3 times
COMPONENTS = ("env/all/reward/total", "env/all/reward/match", "env/all/correct", "env/all/format", "env/all/echo")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rlcli(server, *args: str, timeout: float = 900):
    start = time.monotonic()
    proc = run_rlcli(*args, "--base-url", server.url, env=server.env, timeout=timeout)
    print(f"rlcli {' '.join(args[:3])}: {time.monotonic() - start:.1f}s\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow  # 12 steps of 32 samples: about 6 minutes on a busy 2-core machine
def test_replay_match_run_logs_components_and_sources_and_its_reward_rises(server, tmp_path):
    run = tmp_path / "run"
    steps = 12
    rlcli(server, "train", "rl", "--env", "replay", "--dataset", str(SUMS), "--reward", "match", "--match", "number",
          "--batch-size", "4", "--group-size", "8", "--max-tokens", "32", "--max-steps", str(steps), "--lr", "3e-3",
          "--save-every", "0", "--eval-every", "0", "--log-path", str(run))
    metrics = rows(run / "metrics.jsonl")
    assert len(metrics) == steps and all(key in m for m in metrics for key in COMPONENTS)
    assert all(m["env/all/echo"] == 0.0 for m in metrics)
    summaries = rows(run / "iteration_000000" / "train_rollout_summaries.jsonl")
    sources = {s["steps"][0]["logs"]["source"] for s in summaries}
    assert sources and all(src.startswith("one_digit_sums.jsonl:") for src in sources)
    assert all(s["steps"][0]["logs"]["trace_id"].startswith("sum-") for s in summaries)
    reward = [m["env/all/reward/match"] for m in metrics]  # 32 samples a step: halves average 192 each
    first, last = sum(reward[:steps // 2]) / (steps // 2), sum(reward[steps // 2:]) / (steps // 2)
    print(f"match reward by step: {[round(r, 2) for r in reward]}; first half {first:.3f}, second {last:.3f}")
    assert 0.0 < first < 0.9  # the base model answers partly: there is room, and a signal
    assert last > first


def test_synth_qa_round_trips_into_train_rl_and_eval(server, tmp_path):
    qa = tmp_path / "qa.jsonl"
    proc = run_rlcli("synth", "qa", str(TRACES / "demo.jsonl"), "-o", str(qa), timeout=120)
    assert proc.returncode == 0 and "63 problems" in proc.stderr, proc.stderr
    run = tmp_path / "run"
    proc = rlcli(server, "train", "rl", "--dataset", str(qa), "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "8", "--max-steps", "1", "--eval-size", "2", "--save-every", "0",
                 "--log-path", str(run))
    assert len(rows(run / "metrics.jsonl")) == 1 and "question/answer file" in proc.stdout + proc.stderr
    out = rlcli(server, "eval", "--dataset", str(qa), "--eval-size", "2", "--max-tokens", "8", "--checkpoint", str(run))
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["problems"] == 2 and 0.0 <= result["correct"] <= 1.0


def test_eval_replay_scores_the_held_out_prompts(server, tmp_path):
    out = rlcli(server, "eval", "--env", "replay", "--dataset", str(TRACES / "demo.jsonl"), "--match", "number",
                "--eval-size", "3", "--max-tokens", "16")
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["problems"] == 3 and result["dataset"].startswith("replay traces")


def test_judge_reward_through_an_openai_endpoint_and_a_tinker_judge_that_fails(server, tmp_path):
    from rlcli.problems import judge
    from tests.unit.test_judge_unit import JudgeServer, ranker

    srv = JudgeServer(ranker)
    try:
        run = tmp_path / "run"
        rlcli(server, "train", "rl", "--env", "replay", "--dataset", str(SUMS), "--reward", "judge",
              "--judge-openai", srv.url, "--judge-model", "loopback", "--batch-size", "2", "--group-size", "2",
              "--max-tokens", "8", "--max-steps", "1", "--eval-every", "0", "--save-every", "0",
              "--log-path", str(run))
    finally:
        srv.close()
    step = rows(run / "metrics.jsonl")[0]
    assert step["env/all/judge/failed"] == 0.0 and "env/all/reward/judge" in step and len(srv.requests) == 2
    assert len(list((Path(server.env["RLCLI_HOME"]) / "judge-cache").iterdir())) == 2
    # The embedded model as the judge on the real server: it writes no scores, and that is counted.
    tinker_judge = judge.Judge.from_settings({"kind": "tinker", "checkpoint": None, "url": server.url},
                                             home=tmp_path)
    answers, ask = [], tinker_judge.ask
    tinker_judge.ask = lambda text: answers.append(ask(text)) or answers[-1]
    prompt = [{"role": "user", "content": "What is 2 + 5?"}]
    assert tinker_judge.scores(prompt, "2 + 5 = 7.", ["7", "8"], []) is None
    assert len(answers) == 1 and isinstance(answers[0], str)  # it answered: the answer held no scores
    assert tinker_judge.counts == {"asked": 1, "cached": 0, "failed": 1}


def test_tools_env_trains_and_scores_its_held_out_conversation(server, tmp_path):
    run = tmp_path / "run"
    proc = rlcli(server, "train", "rl", "--env", "tools", "--dataset", str(TRACES / "tools.jsonl"), "--batch-size",
                 "2", "--group-size", "2", "--max-tokens", "24", "--max-steps", "1", "--eval-size", "1",
                 "--eval-every", "1", "--save-every", "0", "--log-path", str(run))
    assert "tool traces" in proc.stdout + proc.stderr and "(skipped: 1 no_tool_call)" in proc.stdout + proc.stderr
    step = rows(run / "metrics.jsonl")[0]
    for key in ("env/all/reward/tools", "env/all/precision", "env/all/recall", "env/all/correct",
                "test/env/all/reward/tools"):
        assert key in step, sorted(step)
    assert step["test/env/all/total_episodes"] == 1
    summaries = rows(run / "iteration_000000" / "train_rollout_summaries.jsonl")
    assert {s["steps"][0]["logs"]["source"].split(":")[0] for s in summaries} == {"tools.jsonl"}
