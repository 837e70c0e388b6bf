"""`rlcli train rl` against the real SkyRL server on CPU: each loss route runs, logs, and frees its slot.

Sizes are the smallest that still exercise a group: 2 problems x 4 samples, 8 sampled tokens, 4
held-out problems (18 for the ppo run that `rlcli eval` scores again). Three steps are too few for
learning to show through sampling noise, so it is not asserted here, only that every figure is logged
(notebooks/gsm8k.ipynb shows a run that learns).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from rlcli.train.folder import MODELS_FILE
from rlcli.train.losses import served_losses
from tests.conftest import REPO, popen_rlcli, run_rlcli

pytestmark = pytest.mark.server

FIXTURE = REPO / "tests" / "fixtures" / "gsm8k_sample.jsonl"
PLAIN = REPO / "tests" / "fixtures" / "rl_qa_plain.jsonl"
TINY = ["--batch-size", "2", "--group-size", "4", "--max-tokens", "8", "--save-every", "0", "--eval-size", "4"]
# Per step: reward (the cookbook's), loss and clip fraction (rlcli's, from the loss outputs), step time.
STEP_KEYS = ("env/all/reward/total", "env/all/correct", "optim/loss", "optim/clip_fraction", "time/total")
TEST_KEY = "test/env/all/correct"  # the cookbook's evaluator, on the held-out problems


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train(server, run: Path, *flags: str) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = run_rlcli("train", "rl", *TINY, *flags, "--base-url", server.url, "--log-path", str(run),
                     env=server.env, timeout=300)
    print(f"train rl {' '.join(flags)}: {time.monotonic() - start:.1f}s\n{proc.stderr[-1500:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def check_run(run: Path, proc: subprocess.CompletedProcess, steps: int, route: str) -> None:
    metrics = rows(run / "metrics.jsonl")
    assert len(metrics) == steps and all(key in m for m in metrics for key in STEP_KEYS), metrics[-1].keys()
    assert all(0.0 <= m["optim/clip_fraction"] <= 1.0 and m["time/total"] > 0 for m in metrics)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert len(lines) == steps and lines[-1].startswith(f"step {steps}/{steps}") and route in lines[-1]
    assert rows(run / "checkpoints.jsonl")[-1]["name"] == "final"
    assert (run / MODELS_FILE).read_text() == ""  # the run unloaded its LoRA: the slot is free again


# Runs that several tests assert on, trained once per module (each `train rl` costs a process start, a model
# and a final checkpoint): ppo with held-out scoring on the one-digit sums that `rlcli eval` scores too, and
# cispo without held-out problems, which the resume test continues from a copy.
PPO_FLAGS = ("--loss", "ppo", "--dataset", "arithmetic", "--max-operand", "9", "--max-steps", "3", "--eval-every",
             "2", "--eval-size", "18")
CISPO_FLAGS = ("--loss", "cispo", "--dataset", "arithmetic", "--eval-every", "0")


@pytest.fixture(scope="module")
def ppo_run(server, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("ppo") / "run"
    return run, train(server, run, *PPO_FLAGS)


@pytest.fixture(scope="module")
def cispo_run(server, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path_factory.mktemp("cispo") / "run"
    return run, train(server, run, *CISPO_FLAGS, "--max-steps", "2")


def test_ppo_on_arithmetic_with_held_out_evaluation(ppo_run):
    run, proc = ppo_run
    check_run(run, proc, 3, "ppo fused")
    assert json.loads((run / "config.json").read_text())["loss_fn"] == "ppo"
    # Scored before steps 1 and 3 (the recipe evaluates when step % eval_every == 0), on 18 problems.
    assert [TEST_KEY in m for m in rows(run / "metrics.jsonl")] == [True, False, True]
    assert rows(run / "metrics.jsonl")[0]["test/env/all/total_episodes"] == 18
    assert "18 held-out problems scored every 2 steps" in proc.stderr and "held-out correct" in proc.stdout


def test_cispo_on_arithmetic(cispo_run):
    run, proc = cispo_run
    check_run(run, proc, 2, "cispo fused")
    # --eval-every 0 with an explicit --eval-size: the problems are kept out of training, never scored in the run.
    assert not any(TEST_KEY in m for m in rows(run / "metrics.jsonl"))
    assert "4 held-out problems kept out of training, not scored during the run" in proc.stderr


def test_gspo_two_pass(server, tmp_path):
    run = tmp_path / "run"
    proc = train(server, run, "--loss", "gspo", "--passes", "2", "--dataset", "arithmetic", "--max-steps", "3")
    check_run(run, proc, 3, "gspo 2-pass")
    assert "loss: gspo 2-pass" in proc.stderr and "--passes 2 asked for" in proc.stderr


def test_gspo_fused(server, tmp_path):
    description, served = served_losses(server.url)
    if "gspo" not in served:
        pytest.skip(f"the test server does not serve gspo fused ({description})")
    run = tmp_path / "run"
    proc = train(server, run, "--loss", "gspo", "--passes", "1", "--dataset", "arithmetic", "--max-steps", "3")
    check_run(run, proc, 3, "gspo fused")
    config = json.loads((run / "config.json").read_text())
    assert config["loss_fn_config"] == {"clip_low_threshold": 1 - 3e-4, "clip_high_threshold": 1 + 4e-4}


def test_gsm8k_offline_from_fixture(server, tmp_path):
    run = tmp_path / "run"
    proc = train(server, run, "--loss", "ppo", "--dataset", "gsm8k", "--dataset-path", str(FIXTURE),
                 "--max-steps", "1", "--max-tokens", "16")
    check_run(run, proc, 1, "ppo fused")
    assert "16 problems" in proc.stderr and "grader gsm8k; 4 held-out problems" in proc.stderr  # 20 - 4


def test_plain_question_answer_file(server, tmp_path):
    run = tmp_path / "run"
    proc = train(server, run, "--loss", "importance_sampling", "--dataset", str(PLAIN), "--max-steps", "1",
                 "--max-tokens", "16")
    check_run(run, proc, 1, "importance_sampling fused")
    assert "question/answer file" in proc.stderr and "grader numeric" in proc.stderr
    assert rows(run / "metrics.jsonl")[0]["test/env/all/total_episodes"] == 4


def test_interrupt_frees_the_slot(server, tmp_path):
    """Ctrl-C mid-run: exit 130, and the model the run created is unloaded on the way out."""
    run = tmp_path / "run"
    proc = popen_rlcli("train", "rl", *TINY, "--loss", "ppo", "--dataset", "arithmetic", "--max-steps", "50",
                       "--base-url", server.url, "--log-path", str(run), env=server.env, ctrl_c=True)
    try:
        deadline = time.monotonic() + 120
        while not ((run / MODELS_FILE).is_file() and (run / MODELS_FILE).read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "the run made no model"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert (run / MODELS_FILE).read_text() == ""


def test_resume_continues_from_the_final_checkpoint_and_another_run_starts_from_it(server, cispo_run, tmp_path):
    run = Path(shutil.copytree(cispo_run[0], tmp_path / "run"))  # a finished 2-step run, ours to continue
    proc = train(server, run, *CISPO_FLAGS, "--max-steps", "3", "--resume")
    assert "from checkpoint final" in proc.stderr
    assert [m["progress/batch"] for m in rows(run / "metrics.jsonl")] == [0, 1, 2]
    assert (run / MODELS_FILE).read_text() == ""
    # --load-checkpoint RUN_FOLDER: that run's newest saved state (checkpoints.jsonl), fresh optimizer.
    state = rows(run / "checkpoints.jsonl")[-1]["state_path"]
    after = tmp_path / "after"
    proc = train(server, after, "--loss", "ppo", "--dataset", "arithmetic", "--max-steps", "1",
                 "--load-checkpoint", str(run))
    assert f"start: {state}" in proc.stderr
    assert json.loads((after / "config.json").read_text())["load_checkpoint_path"] == state
    assert f"Loaded weights from {state}" in (after / "logs.log").read_text()
    assert (after / MODELS_FILE).read_text() == ""


def sample_batches(server, since: int) -> list[int]:
    """The requests in each sample batch the engine logged after byte `since` of its log."""
    with open(server.log, "rb") as f:
        f.seek(since)
        return [int(n) for n in re.findall(rb"process_batch_requests\(sample, n=(\d+)\)", f.read())]


def test_eval_scores_the_base_model_and_a_finished_run_on_the_held_out_problems(server, ppo_run, tmp_path):
    """`rlcli eval` on train rl's held-out one-digit sums: the base model (pretrained on one-digit sums; with
    room for its wordy answers to finish, graded right it scores well above 0), asked in batched requests, then a
    finished run's weights, served again from its saved state."""
    flags = ["--dataset", "arithmetic", "--max-operand", "9", "--eval-size", "18", "--max-tokens", "40",
             "--base-url", server.url]
    since = server.log.stat().st_size
    proc = run_rlcli("eval", *flags, "-o", str(tmp_path / "base.json"), env=server.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    batches = sample_batches(server, since)
    assert sum(batches) == 18 and max(batches) > 1, batches  # not one request after another
    base = json.loads(proc.stdout)
    assert base == json.loads((tmp_path / "base.json").read_text())
    assert base["problems"] == 18 and base["samples"] == 1 and base["temperature"] == 0
    assert base["correct"] >= 0.2, base  # greedy, 40 tokens: the build scored 0.53 on all 100 one-digit sums
    assert "0..9" in base["dataset"] and f"{base['correct']:.3f} correct on 18 held-out problems" in proc.stderr

    run = ppo_run[0]  # ppo on the same one-digit sums, scored on the same 18 held-out problems while training
    proc = run_rlcli("eval", *flags, "--checkpoint", str(run), "--temperature", "1", "--samples", "2",
                     env=server.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    after = json.loads(proc.stdout)
    assert after["source"] == rows(run / "checkpoints.jsonl")[-1]["sampler_path"]
    assert len(after["correct_per_round"]) == 2 and 0 <= after["correct"] <= 1
    assert "serving it again" in proc.stderr  # the run unloaded its model; eval loaded it back and freed it
    assert rows(run / "metrics.jsonl")[0]["test/env/all/total_episodes"] == 18  # the same 18 problems


def makefile_command(name: str, url: str) -> list[str]:
    """The rlcli arguments of a Makefile variable (`RL_DEMO = $(RLCLI) train rl ...`), as `make demo` runs them."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith(f"{name} = $(RLCLI) "))
    return line.split(" = $(RLCLI) ", 1)[1].replace("$(URL)", url).split()


def demo_flags(target: str = "demo") -> list[str]:
    """The flags a Makefile target adds to $(RL_DEMO) (make demo: its steps, no evaluation during the run)."""
    text = (REPO / "Makefile").read_text().replace("\\\n", " ")
    recipe = text.split(f"\n{target}: ", 1)[1].split("\n\n", 1)[0]
    return re.search(r"\$\(RL_DEMO\) ((?:--[a-z-]+ \d+ ?)+)", recipe).group(1).split()


def test_the_demos_rl_raises_held_out_correctness(server, tmp_path):
    """`make demo`'s RL stage as the Makefile runs it (its variable and its flags): the greedy score on the 18
    held-out sums, which the run reports itself (--greedy-score), rises (5/18 -> 7-8/18 in every seed tried;
    docs/decisions.md, "make demo's RL")."""
    run = tmp_path / "rl"
    proc = run_rlcli(*makefile_command("RL_DEMO", server.url), *demo_flags(), "--log-path", str(run),
                     env=server.env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "18 held-out problems kept out of training, answered greedily" in proc.stderr
    scores = json.loads((run / "greedy_scores.json").read_text())
    assert scores["problems"] == 18 and scores["final"] > scores["start"], (scores, proc.stdout)
    assert f"held-out greedy {round(scores['start'] * 18)}/18 -> {round(scores['final'] * 18)}/18" in proc.stdout


def test_held_out_evaluation_asks_in_batches_of_at_most_in_flight(server, monkeypatch):
    """train rl's and train distill's held-out evaluator (score.HeldOutEvaluator) on 80 held-out sums: the engine
    samples them in batches of several requests, never more than IN_FLIGHT; greedy, it scores what one request at
    a time scores (a batch can move a near tie, hence one problem's slack)."""
    import asyncio

    import tinker
    from tinker_cookbook.completers import TinkerTokenCompleter

    from rlcli.config import PLACEHOLDER_API_KEY
    from rlcli.problems import envs, score
    from rlcli.train import run

    monkeypatch.setenv("RLCLI_HOME", server.env["RLCLI_HOME"])
    monkeypatch.setenv("TINKER_API_KEY", server.env.get("TINKER_API_KEY", PLACEHOLDER_API_KEY))
    renderer = run.prepare_model(server.model, None)
    data = envs.load_data("arithmetic", None, 1, None, "arithmetic", 80, 99)
    _, test = asyncio.run(envs.dataset_builder(data, server.model, renderer, 1, 1)())
    client = tinker.ServiceClient(base_url=server.url).create_sampling_client(base_model=server.model).result()
    evaluator = score.HeldOutEvaluator(test, max_tokens=16, num_groups_to_log=0)
    since = server.log.stat().st_size
    assert asyncio.run(evaluator(client))["test/env/all/total_episodes"] == 80
    batches = sample_batches(server, since)
    assert sum(batches) == 80 and 1 < max(batches) <= score.IN_FLIGHT, batches

    async def greedy() -> dict[str, float]:
        return await evaluator.eval_token_completer(score.capped(TinkerTokenCompleter(client, 16, temperature=0.0)))

    batched = asyncio.run(greedy())["test/env/all/correct"]
    problems = score.problems_of(test)
    one_by_one = score.means(problems, score.answer(problems, TinkerTokenCompleter(client, 16, temperature=0.0),
                                                    one_at_a_time=True))["test/env/all/correct"]
    assert abs(batched - one_by_one) <= 1 / 80, (batched, one_by_one)
