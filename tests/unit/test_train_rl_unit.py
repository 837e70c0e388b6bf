"""`rlcli train rl` without a server: flags, data checks, the cookbook's GSM8K grading, plans, fail-fast order.

The server's answer about which losses it serves is faked (`served_losses`); `plan_loss` is the real one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest

from rlcli.errors import UsageError
from rlcli.train import losses, renderers, rl
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "gsm8k_sample.jsonl"
DEAD_URL = "http://127.0.0.1:9"  # nothing listens: any request that slips through fails loudly
STOCK_JAX = set(losses.STOCK_JAX)


@pytest.fixture
def envs():
    from rlcli.train import envs  # imports the cookbook and `datasets` (a few seconds, once)

    return envs


@pytest.fixture
def fake_server(monkeypatch):
    """served_losses answers like a stock jax server; callers may widen `served`.

    A local model makes train_rl set the hub's offline variables; setting them here first lets
    monkeypatch put the environment back afterwards.
    """
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    served = set(STOCK_JAX)
    monkeypatch.setattr(losses, "served_losses", lambda url, timeout=10.0: ("stock jax (fake)", served))
    return served


# --- flags ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dataset", "path", "message"), [
    (None, None, "pass --dataset arithmetic"),
    ("arithmetic", "x.jsonl", "--dataset-path is for gsm8k"),
    ("mine.jsonl", "x.jsonl", "is a file already"),
])
def test_dataset_flags_are_checked(dataset, path, message):
    with pytest.raises(UsageError, match=message):
        rl.choose_dataset(dataset, path)


def test_dataset_flags_resolve():
    assert rl.choose_dataset("arithmetic", None) == ("arithmetic", None)
    assert rl.choose_dataset("gsm8k", "g.jsonl") == ("gsm8k", "g.jsonl")
    assert rl.choose_dataset("g.jsonl", None) == ("gsm8k", "g.jsonl")


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("group_size", 1, "--group-size must be at least 2"),
    ("save_every", -1, "--save-every must be 0 \\(off\\) or more"),
    ("lr", 0.0, "--lr must be positive"),
])
def test_numbers_are_checked(flag, value, message):
    with pytest.raises(UsageError, match=message):
        rl.check_numbers(**{flag: value})


# --- GSM8K-format files --------------------------------------------------------------------------


GOOD = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "line 3: not valid JSON"),
    ('["a list"]', "line 3: expected a JSON object, got list"),
    (json.dumps({"question": "q"}), 'line 3: "answer" is missing'),
    (json.dumps({"question": "", "answer": "#### 1"}), 'line 3: "question" is missing'),
    (json.dumps({"question": "q", "answer": "it is 4"}), "line 3: \"answer\" has no final answer .*#### 42"),
])
def test_bad_problem_lines_name_their_line(envs, line, message):
    lines = [json.dumps(GOOD), "", line]  # the blank line still counts as line 2
    with pytest.raises(UsageError, match=message):
        envs.parse_problems(lines, "p.jsonl")


def test_empty_and_missing_files(envs, tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(UsageError, match="has no problems"):
        envs.read_problems(str(tmp_path / "empty.jsonl"))
    with pytest.raises(UsageError, match="no problems file at"):
        envs.read_problems(str(tmp_path / "nope.jsonl"))


def test_fixture_is_gsm8k_format(envs):
    from tinker_cookbook.recipes.math_rl.math_env import extract_gsm8k_final_answer

    problems = envs.read_problems(str(FIXTURE))
    assert len(problems.records) == 20
    golds = [extract_gsm8k_final_answer(r["answer"]) for r in problems.records]
    assert all(g.isdigit() for g in golds)  # '#### 1,000'-style commas are gone too


def test_hub_gsm8k_offline_says_how_to_get_the_data(envs, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(envs, "load_dataset", offline)
    with pytest.raises(UsageError, match="--dataset-path FILE.jsonl") as caught:
        envs.load_data("gsm8k", None, batch_size=8, max_steps=None)
    assert "\n" not in str(caught.value)


# --- the cookbook's grading on the offline env ---------------------------------------------------


@pytest.fixture
def gsm8k_env(envs, embedded_model):
    from tinker_cookbook import renderers as cookbook_renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderers.register_local_tokenizer(embedded_model)
    tokenizer = get_tokenizer(embedded_model)
    renderer = cookbook_renderers.get_renderer(renderers.CHATML_RENDERER, tokenizer=tokenizer)
    problems = envs.read_problems(str(FIXTURE))
    builder = envs.Gsm8kFileDataset(problems.records, batch_size=2, group_size=1, renderer=renderer).get_batch(0)[0]
    return asyncio.run(builder.make_envs())[0], tokenizer


def grade(env, tokenizer, reply: str):
    action = tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
    return asyncio.run(env.step(action))


def test_offline_env_prompts_like_the_cookbook(gsm8k_env):
    env, tokenizer = gsm8k_env
    prompt, _ = asyncio.run(env.initial_observation())
    text = tokenizer.decode(prompt.to_ints())
    assert "How many r's are in strawberry?" in text  # the cookbook's few-shot prefix
    assert "Write your answer in \\boxed{} format." in text


def test_offline_env_grades_boxed_answers(gsm8k_env):
    env, tokenizer = gsm8k_env
    right = grade(env, tokenizer, f"So the answer is \\boxed{{{env.answer}}}.")
    wrong = grade(env, tokenizer, f"So the answer is \\boxed{{{int(env.answer) + 1}}}.")
    unboxed = grade(env, tokenizer, f"So the answer is {env.answer}.")
    assert (right.reward, right.metrics["correct"]) == (1.0, 1.0)
    assert (wrong.reward, wrong.metrics["correct"]) == (0.0, 0.0)
    # No \boxed{}: not correct, and the cookbook's format penalty (format_coef 0.1) on top.
    assert unboxed.metrics["correct"] == 0.0 and unboxed.reward == pytest.approx(-0.1)


# --- plans and the dry run -----------------------------------------------------------------------


def dry_run(capsys, embedded_model, tmp_path, **flags) -> str:
    args = dict(dataset=str(FIXTURE), batch_size=2, group_size=4, max_tokens=16, base_url=DEAD_URL,
                model=embedded_model, log_path=str(tmp_path / "run"), dry_run=True) | flags
    assert rl.train_rl(**args) == 0
    return capsys.readouterr().out


def test_dry_run_prints_the_plan_and_creates_nothing(fake_server, capsys, embedded_model, tmp_path):
    out = dry_run(capsys, embedded_model, tmp_path, loss="gspo")
    assert "loss: gspo 2-pass" in out and "the server does not serve gspo fused" in out
    assert '"clip_high_threshold": 1.0004, "clip_low_threshold": 0.9997' in out  # the GSPO paper's eps
    assert "20 problems, 10 batches of 2" in out and "2 problems x 4 samples per step, 10 steps" in out
    assert not (tmp_path / "run").exists()


def test_dry_run_fused_when_served(fake_server, capsys, embedded_model, tmp_path):
    fake_server.add("gspo")
    out = dry_run(capsys, embedded_model, tmp_path, loss="gspo", dataset="arithmetic", max_steps=5)
    assert "loss: gspo fused" in out and "arithmetic" in out and "5 steps" in out


def test_existing_run_folder_is_refused_before_any_model(fake_server, embedded_model, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UsageError, match="already exists: pass --resume"):
        rl.train_rl(loss="ppo", dataset="arithmetic", base_url=DEAD_URL, model=embedded_model,
                    log_path=str(tmp_path / "run"))


def test_progress_line():
    metrics = {"progress/batch": 0, rl.REWARD: -0.1, rl.CORRECT: 0.25}
    line = rl.format_rl_progress(metrics, 0, 3, "gspo fused", 1.234)
    assert line == "step 1/3  reward -0.100  correct 0.25  gspo fused  1.23s"
    assert "reward -  correct -" in rl.format_rl_progress({"progress/batch": 1}, 1, 3, "ppo fused", 1.0)


# --- fail fast: the loss plan comes before tinker, data or models ---------------------------------


FAIL_FAST = textwrap.dedent("""
    import json, sys, time
    from rlcli.train import losses
    losses.served_losses = lambda url, timeout=10.0: ("stock jax (fake)", set(losses.STOCK_JAX))
    from rlcli.cli import main
    start = time.perf_counter()
    code = main(["train", "rl", *sys.argv[1:], "--dataset", "arithmetic", "--base-url", "{url}"])
    elapsed = time.perf_counter() - start
    heavy = [m for m in ("tinker", "tinker_cookbook", "datasets", "torch") if m in sys.modules]
    print(json.dumps({{"code": code, "elapsed": elapsed, "heavy": heavy}}))
""").format(url=DEAD_URL)


@pytest.mark.parametrize(("flags", "message"), [
    (["--loss", "dppo", "--passes", "1"], "does not serve loss dppo"),
    (["--loss", "gspo", "--passes", "1"], "--passes 1: this server does not serve gspo fused"),
    (["--loss", "ppo", "--loss-config", '{"delta_low": 0.1}'], "do not apply to loss ppo"),
    (["--loss", "dro"], "unknown --loss 'dro'"),
])
def test_unservable_loss_fails_before_anything_heavy(flags, message):
    proc = subprocess.run([sys.executable, "-c", FAIL_FAST, *flags], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["code"] == 2 and message in proc.stderr, proc.stderr
    assert result["heavy"] == []  # no tinker client, cookbook or data library: no model could have been made
    print(f"{flags}: failed in {result['elapsed'] * 1000:.0f} ms")
    assert result["elapsed"] < 1.0


def test_help_is_fast():
    code = "import time, sys; s = time.perf_counter(); from rlcli.cli import main; main(['train', 'rl', '--help'])"
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0 and "--loss-config" in proc.stdout
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert not imported & {"tinker", "tinker_cookbook", "datasets", "torch"}



# --- hooks and resume ------------------------------------------------------------------------------


def test_hooks_route_every_training_client_inside_the_block_only(monkeypatch):
    import tinker

    monkeypatch.setattr(tinker.TrainingClient, "__init__", lambda self, model_id: setattr(self, "model_id", model_id))
    plan = losses.LossPlan("gspo", dict(losses.GSPO_DEFAULTS), 2, "")
    with rl.cookbook_hooks(plan):
        routed = tinker.TrainingClient("fresh")
        resumed = tinker.TrainingClient("resumed")
    after = tinker.TrainingClient("after")
    assert routed._rlcli_loss_plan is plan and resumed._rlcli_loss_plan is plan
    assert not hasattr(after, "_rlcli_loss_plan")


def test_resume_refuses_another_loss(tmp_path):
    settings = rl.Settings("m", "r", "arithmetic", "gspo", {}, 1, 2, 4, 1e-4, 8, 1.0, 8, 3, 0, 0)
    (tmp_path / rl.RUN_INFO).write_text(json.dumps({"dataset_sha256": "arithmetic", "loss": "ppo"}))
    with pytest.raises(UsageError, match="was run with loss 'ppo'"):
        rl.check_resume(tmp_path, DEAD_URL, "arithmetic", settings)
    with pytest.raises(UsageError, match="trained on other data"):
        rl.check_resume(tmp_path, DEAD_URL, "hub:openai/gsm8k", settings)
