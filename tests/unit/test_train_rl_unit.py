"""`rlcli train rl` without a server: flags, data checks, grading, held-out splits, step statistics, plans,
fail-fast order.

The server's answer about which losses it serves is faked (`served_losses`); `plan_loss` is the real one.
"""

from __future__ import annotations

import asyncio
import io
import json
import math
import subprocess
import sys
import textwrap

import pytest

from rlcli.errors import UsageError
from rlcli.problems import heldout
from rlcli.train import folder as runs
from rlcli.train import greedy_score, hooks, losses, metrics, renderers, rl, rl_loop, run, stats
from rlcli.train.options import kept
from tests.conftest import REPO

FIXTURE = REPO / "tests" / "fixtures" / "gsm8k_sample.jsonl"
PLAIN = REPO / "tests" / "fixtures" / "rl_qa_plain.jsonl"  # final answers only; one question twice
DEAD_URL = "http://127.0.0.1:9"  # nothing listens: any request that slips through fails loudly
STOCK_JAX = set(losses.STOCK_JAX)


@pytest.fixture
def envs():
    from rlcli.problems import envs  # imports the cookbook and `datasets` (a few seconds, once)

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


@pytest.mark.parametrize(("dataset", "path", "grader", "message"), [
    ("arithmetic", None, "numeric", "arithmetic grades its own"),
    ("gsm8k", None, "exact", "--grader exact is for JSONL files"),
])
def test_grader_flag_is_checked(dataset, path, grader, message):
    with pytest.raises(UsageError, match=message):
        rl.choose_dataset(dataset, path, grader)


def test_dataset_flags_resolve():
    assert rl.choose_dataset("arithmetic", None) == ("arithmetic", None, "auto")
    assert rl.choose_dataset("gsm8k", "g.jsonl") == ("gsm8k", "g.jsonl", "gsm8k")  # the hub's format, offline
    assert rl.choose_dataset("gsm8k", "g.jsonl", "numeric") == ("gsm8k", "g.jsonl", "numeric")
    assert rl.choose_dataset("g.jsonl", None) == ("file", "g.jsonl", "auto")  # the answers decide


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("group_size", 1, "--group-size must be at least 2"),
    ("save_every", -1, "--save-every must be 0 or more"),
    ("lr", 0.0, "--lr must be positive"),
    ("temperature", 0.0, "--temperature must be positive"),
    ("kl_coef", -0.1, "--kl-coef must be 0 or more"),
    ("loss", "dro", "--loss dro: choose from gspo, cispo, dppo, ppo, importance_sampling"),
])
def test_numbers_are_checked(flag, value, message):
    with pytest.raises(UsageError, match=message):
        rl.RlOptions(**{flag: value})


# --- GSM8K-format files --------------------------------------------------------------------------


GOOD = {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}


@pytest.mark.parametrize(("line", "grader", "message"), [
    ("{not json", "auto", "line 3: not valid JSON"),
    ('["a list"]', "auto", "line 3: expected a JSON object, got list"),
    (json.dumps({"question": "q"}), "auto", 'line 3: "answer" is missing'),
    (json.dumps({"question": "", "answer": "#### 1"}), "auto", 'line 3: "question" is missing'),
    (json.dumps({"question": "q", "answer": "#### "}), "numeric", 'line 3: "answer" has an empty final answer'),
    (json.dumps({"question": "q", "answer": "it is 4"}), "gsm8k", "line 3: \"answer\" has no final answer .*#### 42"),
    # auto: line 1 is GSM8K-style, so a plain answer further down is a mix, refused where it starts
    (json.dumps({"question": "q", "answer": "4"}), "auto", "line 3: no '#### N' final answer, unlike line 1"),
])
def test_bad_problem_lines_name_their_line(envs, line, grader, message):
    lines = [json.dumps(GOOD), "", line]  # the blank line still counts as line 2
    with pytest.raises(UsageError, match=message):
        envs.parse_problems(lines, "p.jsonl", grader)


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


# --- plain {question, answer} files: numeric or exact grading ------------------------------------


@pytest.mark.parametrize(("given", "gold", "grader", "right"), [
    ("42", "42", "numeric", True),
    ("42.0", "42", "numeric", True),
    (" 1,234 ", "1234", "numeric", True),
    ("-2", "-2.00", "numeric", True),
    ("4.2e1", "42", "numeric", True),
    ("12345678901234567891", "12345678901234567890", "numeric", False),  # as floats these would be equal
    ("43", "42", "numeric", False),
    ("Paris", " Paris ", "numeric", True),  # not numbers: text, whitespace normalized
    ("New  York", "New York", "exact", True),
    ("paris", "Paris", "numeric", False),
    ("42.0", "42", "exact", False),  # exact never reads numbers
    ("42 apples", "42", "numeric", False),
])
def test_grade_answer(envs, given, gold, grader, right):
    assert envs.grade_answer(given, gold, grader) is right


def test_the_answers_decide_the_grader(envs):
    assert envs.read_problems(str(PLAIN)).grader == "numeric"
    assert envs.read_problems(str(FIXTURE)).grader == "gsm8k"
    assert envs.read_problems(str(PLAIN), "exact").grader == "exact"
    with pytest.raises(UsageError, match="line 1: \"answer\" has no final answer"):
        envs.read_problems(str(PLAIN), "gsm8k")
    # numeric on a GSM8K-style file grades the text after '####'
    assert envs.gold_answer("so 1,000 + 1 = 1,001\n#### 1,001") == "1001" and envs.gold_answer(" 7 ") == "7"


def make_renderer(embedded_model):
    from tinker_cookbook import renderers as cookbook_renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderers.register_local_tokenizer(embedded_model)
    tokenizer = get_tokenizer(embedded_model)
    return cookbook_renderers.get_renderer(renderers.CHATML_RENDERER, tokenizer=tokenizer), tokenizer


def test_plain_env_asks_for_boxed_and_grades_numbers_and_text(envs, embedded_model):
    renderer, tokenizer = make_renderer(embedded_model)
    records = [{"question": "What is 999 + 235?", "answer": "1,234"}, {"question": "Capital of France?",
                                                                        "answer": "Paris"}]
    groups = envs.FileDataset(records, batch_size=2, group_size=1, renderer=renderer, grader="numeric",
                              seed=None).get_batch(0)
    number, text = (asyncio.run(g.make_envs())[0] for g in groups)
    prompt, _ = asyncio.run(number.initial_observation())
    assert "Write your answer in \\boxed{} format." in tokenizer.decode(prompt.to_ints())
    assert grade(number, tokenizer, "It is \\boxed{1234.0}").metrics["correct"] == 1.0
    assert grade(number, tokenizer, "It is \\boxed{1243}").metrics["correct"] == 0.0
    assert grade(text, tokenizer, "\\boxed{ Paris }").metrics["correct"] == 1.0
    unboxed = grade(text, tokenizer, "Paris")
    assert unboxed.metrics["correct"] == 0.0 and unboxed.reward == pytest.approx(-0.1)  # the format penalty


# --- held-out splits -------------------------------------------------------------------------------


def test_file_split_is_seeded_disjoint_and_takes_every_copy_out():
    records = [{"question": f"question {i}", "answer": str(i)} for i in range(10)]
    records += [{"question": f"question  {i} ", "answer": str(i)} for i in range(10)]  # each asked twice
    train, test = heldout.split_problems(records, 3)
    assert (train, test) == heldout.split_problems(records, 3)  # the same split every run
    held = {heldout.question_key(r["question"]) for r in test}
    assert len(test) == len(held) == 3 and len(train) == 14
    assert not held & {heldout.question_key(r["question"]) for r in train}
    assert heldout.split_problems(records, 0) == (records, [])


def test_eval_size_defaults_and_limits():
    def questions(n):
        return [{"question": f"q{i}", "answer": "1"} for i in range(n)]

    assert heldout.file_eval_size(questions(20), None, "f") == 2  # a tenth of a small file
    assert heldout.file_eval_size(questions(5000), None, "f") == heldout.EVAL_SIZE
    assert heldout.file_eval_size(questions(20), 19, "f") == 19
    with pytest.raises(UsageError, match="--eval-size 20 would hold out all 20 distinct questions of f"):
        heldout.file_eval_size(questions(20), 20, "f")


def pairs_of(groups) -> list[tuple[int, int]]:
    return [g.env_thunk.args[:2] for g in groups]  # partial(ArithmeticEnv, x, y, ...)


def test_arithmetic_never_trains_on_a_held_out_problem(envs, embedded_model):
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset

    renderers.register_local_tokenizer(embedded_model)
    builder = envs.ArithmeticSplitBuilder(batch_size=8, model_name_for_tokenizer=embedded_model,
                                          renderer_name=renderers.CHATML_RENDERER, n_batches=200, group_size=2)
    train, test = asyncio.run(builder())
    held = pairs_of(test.get_batch(0))
    assert held == heldout.arithmetic_eval_pairs(heldout.EVAL_SIZE)  # fixed by its own seed
    held_keys = {heldout.pair_key(*p) for p in held}
    assert len(held_keys) == 32 and heldout.pair_key(4, 5) not in held_keys  # the few-shot example's pair
    assert all(g.num_envs == 1 for g in test.get_batch(0))
    trained = [p for i in range(len(train)) for p in pairs_of(train.get_batch(i))]
    assert len(trained) == 1600 and not held_keys & {heldout.pair_key(*p) for p in trained}
    # Without the exclusion the same seeded draws would have hit held-out problems: the check above means something.
    plain = ArithmeticDataset(batch_size=8, renderer=train.renderer, group_size=2, n_batches=200)
    drawn = [p for i in range(200) for p in pairs_of(plain.get_batch(i))]
    assert held_keys & {heldout.pair_key(*p) for p in drawn}


def test_file_builder_hands_the_recipe_disjoint_train_and_test_sets(envs, embedded_model):
    renderers.register_local_tokenizer(embedded_model)
    # 24 lines, 23 distinct questions: with 8 held out, the seeded draw includes the one asked twice, and
    # both of its copies leave training.
    data = envs.load_data("file", str(PLAIN), batch_size=4, max_steps=None, eval_size=8)
    assert (data.size, data.held_out, data.batches, data.grader) == (15, 8, 4, "numeric")
    builder = envs.dataset_builder(data, embedded_model, renderers.CHATML_RENDERER, batch_size=4, group_size=2)
    train, test = asyncio.run(builder())

    def questions(dataset):
        return [heldout.question_key(asyncio.run(g.make_envs())[0].problem)
                for i in range(len(dataset)) for g in dataset.get_batch(i)]

    trained, tested = questions(train), questions(test)
    assert len(trained) == 15 and len(tested) == 8 and not set(trained) & set(tested)
    assert "What is the capital of France?" in tested
    none = envs.dataset_builder(envs.load_data("file", str(PLAIN), 4, None, eval_size=0), embedded_model,
                                renderers.CHATML_RENDERER, 4, 2)
    assert asyncio.run(none())[1] is None  # no held-out set: the recipe runs no evaluator


# --- the cookbook's grading on the offline env ---------------------------------------------------


@pytest.fixture
def gsm8k_env(envs, embedded_model):
    from tinker_cookbook import renderers as cookbook_renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderers.register_local_tokenizer(embedded_model)
    tokenizer = get_tokenizer(embedded_model)
    renderer = cookbook_renderers.get_renderer(renderers.CHATML_RENDERER, tokenizer=tokenizer)
    problems = envs.read_problems(str(FIXTURE))
    builder = envs.FileDataset(problems.records, batch_size=2, group_size=1, renderer=renderer).get_batch(0)[0]
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
    assert rl.train_rl(rl.RlOptions(**args)) is None
    return capsys.readouterr().out


def test_dry_run_prints_the_plan_and_creates_nothing(fake_server, capsys, embedded_model, tmp_path):
    out = dry_run(capsys, embedded_model, tmp_path, loss="gspo")
    assert "loss: gspo 2-pass" in out and "the server does not serve gspo fused" in out
    assert '"clip_high_threshold": 1.0004, "clip_low_threshold": 0.9997' in out  # the GSPO paper's eps
    # 20 problems: a tenth (2) held out for evaluation by default, 18 to train on.
    assert "18 problems, 9 batches of 2; grader gsm8k; 2 held-out problems" in out
    assert "2 problems x 4 samples per step, 9 steps" in out
    assert not (tmp_path / "run").exists()


def test_dry_run_fused_when_served(fake_server, capsys, embedded_model, tmp_path):
    fake_server.add("gspo")
    out = dry_run(capsys, embedded_model, tmp_path, loss="gspo", dataset="arithmetic", max_steps=5)
    assert "loss: gspo fused" in out and "arithmetic" in out and "5 steps" in out


def test_existing_run_folder_is_refused_before_any_model(fake_server, embedded_model, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UsageError, match="already exists: pass --resume"):
        rl.train_rl(rl.RlOptions(loss="ppo", dataset="arithmetic", base_url=DEAD_URL, model=embedded_model,
                                 log_path=str(tmp_path / "run")))


def test_progress_line():
    row = {"progress/batch": 0, metrics.REWARD: -0.1, metrics.CORRECT: 0.25, metrics.LOSS: 0.01234,
           metrics.CLIP: 0.125}
    line = rl_loop.format_rl_progress(row, 0, 3, "gspo fused", 1.234)
    assert line == "step 1/3  reward -0.100  correct 0.25  loss +0.0123  clip 0.12  gspo fused  1.23s"
    assert "reward -  correct -" in rl_loop.format_rl_progress({"progress/batch": 1}, 1, 3, "ppo fused", 1.0)
    evaluated = rl_loop.format_rl_progress({**row, metrics.TEST_CORRECT: 0.5}, 0, 3, "ppo fused", 1.0)
    assert evaluated.endswith("held-out correct 0.50")



def test_final_report_compares_the_first_and_last_quarter_of_the_steps(tmp_path):
    rewards = [0.2, 0.0, 0.1, 0.1, 0.3, 0.3, 0.5, 0.3]  # a short run's single steps swing more than it gains
    assert rl_loop.reward_change(rewards) == "reward +0.100 -> +0.400 over 8 steps (mean of the first and last 2)"
    assert rl_loop.reward_change([0.1, 0.2, 0.3]) == "reward +0.100 -> +0.300 over 3 steps"
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"progress/batch": i, metrics.REWARD: r}) + "\n"
                                                    for i, r in enumerate(rewards)))
    assert rl_loop.final_report(tmp_path).startswith("reward +0.100 -> +0.400 over 8 steps")


def test_greedy_score_is_one_line_of_the_final_report(tmp_path):
    """`train rl --greedy-score` (make demo's RL) records the start and final weights' greedy scores in the run
    folder; the report shows them as counts of the held-out problems."""
    assert greedy_score.report_line(tmp_path) is None and "held-out greedy" not in rl_loop.final_report(tmp_path)
    (tmp_path / greedy_score.RESULT).write_text(json.dumps({"start": 5 / 18, "final": 8 / 18, "problems": 18}))
    line = "held-out greedy 5/18 -> 8/18 (start -> final weights, temperature 0, 18 problems never trained on)"
    assert greedy_score.report_line(tmp_path) == line and line in rl_loop.final_report(tmp_path).splitlines()
    (tmp_path / greedy_score.RESULT).write_text(json.dumps({"start": 0.5, "final": None, "problems": 4}))
    assert greedy_score.report_line(tmp_path).startswith("held-out greedy 2/4 -> - (")  # no final sampler saved


def test_greedy_score_starts_from_the_base_or_a_run_folders_sampler_weights(tmp_path):
    assert greedy_score.start_weights(None) is None  # a fresh LoRA: the base model answers
    rows = [{"name": "final", "state_path": "tinker://m/weights/final", "sampler_path": "tinker://m/final"}]
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert greedy_score.start_weights(str(tmp_path)) == "tinker://m/final"
    for bad in ("tinker://m/weights/final", str(tmp_path / "none")):  # a bare state has no sampler weights to ask
        with pytest.raises(UsageError, match="pass that run folder"):
            greedy_score.start_weights(bad)


def test_greedy_score_needs_held_out_problems(fake_server, capsys, embedded_model, tmp_path):
    with pytest.raises(UsageError, match="holds none out: pass --eval-size"):
        dry_run(capsys, embedded_model, tmp_path, dataset="arithmetic", eval_every=0, greedy_score=True)
    out = dry_run(capsys, embedded_model, tmp_path, dataset="arithmetic", eval_every=0, eval_size=18,
                  max_operand=9, greedy_score=True)
    assert "18 held-out problems kept out of training, answered greedily before the first step and after" in out


def test_an_explicit_eval_size_is_held_out_even_when_nothing_is_scored_during_the_run():
    """make demo keeps 18 sums out of RL (--eval-every 0 --eval-size 18) and scores them with rlcli eval: were they
    trained on, the before -> after would not be on unseen problems."""
    assert heldout.held_out_for(0, 18) == 18 and heldout.held_out_for(0, None) == 0
    assert heldout.held_out_for(5, None) is None and heldout.held_out_for(5, 4) == 4
    assert heldout.kept_out(18, 0) == ("18 held-out problems kept out of training, not scored during the "
                                        "run (rlcli eval scores them)")
    assert heldout.kept_out(18, 2) == "18 held-out problems scored every 2 steps"
    assert heldout.kept_out(0, 2) == "no held-out evaluation"

# --- fail fast: the loss plan comes before tinker, data or models ---------------------------------


FAIL_FAST = textwrap.dedent("""
    import json, sys, time
    from rlcli.train import losses
    losses.served_losses = lambda url, timeout=10.0: ("stock jax (fake)", set(losses.STOCK_JAX))
    from rlcli.cli import main
    start = time.perf_counter()
    try:
        code = main(["train", "rl", *sys.argv[1:], "--dataset", "arithmetic", "--base-url", "{url}"])
    except SystemExit as e:  # argparse's usage error: a fixed choice (rlcli.options)
        code = e.code
    elapsed = time.perf_counter() - start
    heavy = [m for m in ("tinker", "tinker_cookbook", "datasets", "torch") if m in sys.modules]
    print(json.dumps({{"code": code, "elapsed": elapsed, "heavy": heavy}}))
""").format(url=DEAD_URL)


@pytest.mark.parametrize(("flags", "message"), [
    (["--loss", "dppo", "--passes", "1"], "does not serve loss dppo"),
    (["--loss", "gspo", "--passes", "1"], "--passes 1: this server does not serve gspo fused"),
    (["--loss", "ppo", "--loss-config", '{"delta_low": 0.1}'], "do not apply to loss ppo"),
    (["--loss", "dro"], "argument --loss: invalid choice: 'dro'"),
])
def test_unservable_loss_fails_before_anything_heavy(flags, message):
    proc = subprocess.run([sys.executable, "-c", FAIL_FAST, *flags], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["code"] == 2 and message in proc.stderr, proc.stderr
    assert result["heavy"] == []  # no tinker client, cookbook or data library: no model could have been made
    print(f"{flags}: failed in {result['elapsed'] * 1000:.0f} ms")  # speed: benchmarks/cli_startup.py


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
    with rl_loop.routed(plan, rl_loop.RlProgress(1, "gspo", 2)):
        routed = tinker.TrainingClient("fresh")
        resumed = tinker.TrainingClient("resumed")
    after = tinker.TrainingClient("after")
    assert routed._rlcli_loss_plan is plan and resumed._rlcli_loss_plan is plan
    assert not hasattr(after, "_rlcli_loss_plan")


def test_resume_refuses_another_loss(tmp_path):
    settings = kept(rl.RlOptions(model="m", renderer="r", dataset="arithmetic", loss="gspo", max_tokens=8),
                    passes=1, grader="arithmetic", eval_size=32)
    (tmp_path / runs.RUN_INFO).write_text(json.dumps({"dataset_sha256": "arithmetic", "loss": "ppo"}))

    def check(digest: str) -> None:
        run.check_resume(tmp_path, DEAD_URL, digest=("dataset_sha256", digest), same_input="the same --dataset",
                         settings=settings, keys=rl.RESUME_KEYS)

    with pytest.raises(UsageError, match="was run with loss 'ppo'"):
        check("arithmetic")
    with pytest.raises(UsageError, match="trained on other data"):
        check("hub:openai/gsm8k")


# --- step statistics: loss and clip fraction from the loss outputs --------------------------------


def rl_datum(old_T, adv_T, weights_T=None):
    import numpy as np
    import tinker

    inputs = {"target_tokens": np.arange(5, 5 + len(old_T), dtype=np.int64),
              "logprobs": np.asarray(old_T, dtype=np.float32), "advantages": np.asarray(adv_T, dtype=np.float32)}
    if weights_T is not None:
        inputs["weights"] = np.asarray(weights_T, dtype=np.float32)
    return tinker.Datum(model_input=tinker.ModelInput.from_ints(list(range(1, 1 + len(old_T)))), loss_fn_inputs=inputs)


def loss_output(loss_T, lp_T):
    import numpy as np
    import tinker

    return {"elementwise_loss": tinker.TensorData.from_numpy(np.asarray(loss_T, dtype=np.float32)),
            "logprobs": tinker.TensorData.from_numpy(np.asarray(lp_T, dtype=np.float32))}


# A prompt token (advantage 0), then ratios 1.5 (A+), 0.5 (A+), 0.5 (A-), 1.0 (A-); current logprobs all -1.
LP = [-1.0] * 5
OLD = [-1.0, -1.0 - math.log(1.5), -1.0 - math.log(0.5), -1.0 - math.log(0.5), -1.0]
ADV = [0.0, 1.0, 1.0, -1.0, -1.0]
TOKEN_LOSSES = [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize(("loss", "config", "want_loss", "want_clip"), [
    # ppo: the clip zeroes the gradient at 1.5 with A > 0 and at 0.5 with A < 0: 2 of 4 tokens with an advantage
    ("ppo", {}, 10 / 5, 2 / 4),  # no weights sent: the server weights all 5 tokens 1
    ("ppo", {"clip_high_threshold": 2.0}, 10 / 5, 1 / 4),
    ("cispo", {}, 10 / 5, 3 / 4),  # the weight is truncated at 1.5, 0.5, 0.5
    ("importance_sampling", {}, 10 / 5, 0.0),
    # gspo: s = exp(mean log ratio over the 4 response tokens) = (1.5 * 0.5 * 0.5) ** 0.25 = 0.78 < 0.8: the
    # clip acts where A < 0; the routes send the response weights, so the loss is over 4 tokens
    ("gspo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, 10 / 4, 2 / 4),
    ("gspo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.2}, 10 / 4, 0.0),
])
def test_step_statistics_per_loss(loss, config, want_loss, want_clip):
    step_stats = stats.StepStats(loss, config)
    result = type("Result", (), {"loss_fn_outputs": [loss_output(TOKEN_LOSSES, LP)]})()
    step_stats.record([rl_datum(OLD, ADV)], result, None)
    got = step_stats.drain()
    assert got[metrics.LOSS] == pytest.approx(want_loss)
    assert got[metrics.CLIP] == pytest.approx(want_clip)
    assert step_stats.drain() == {}  # one step's worth at a time


def test_step_statistics_average_sequences_and_honour_sent_weights():
    step_stats = stats.StepStats("ppo", None)
    result = type("Result", (), {"loss_fn_outputs": [loss_output(TOKEN_LOSSES, LP), loss_output([0.0, 6.0], LP[:2])]})()
    step_stats.record([rl_datum(OLD, ADV), rl_datum(OLD[:2], [0.0, 1.0], weights_T=[0.0, 2.0])], result, None)
    got = step_stats.drain()
    assert got[metrics.LOSS] == pytest.approx((10 / 5 + 6 / 2) / 2)  # per sequence sum / sum of weights, then mean
    assert got[metrics.CLIP] == pytest.approx(3 / 5)  # the second sequence's one token is clipped too


def test_step_statistics_reach_metrics_jsonl_through_the_cookbooks_logger(tmp_path):
    from tinker_cookbook.utils import ml_log

    class Future:
        async def result_async(self, timeout=None):
            return type("Result", (), {"loss_fn_outputs": [loss_output(TOKEN_LOSSES, LP)]})()

    class Client:  # tinker 0.38's: forward_backward_async is deprecated, forward_backward submits
        def forward_backward(self, data, loss_fn, loss_fn_config=None):
            return Future()

    step_stats, client = stats.StepStats("ppo", None), Client()
    step_stats.watch(client)
    progress = rl_loop.RlProgress(2, "ppo", 1, stream=io.StringIO())
    progress.step_metrics = step_stats.drain

    async def recipe_step():  # what the cookbook's train_step does with the future
        future = await client.forward_backward_async([rl_datum(OLD, ADV)], loss_fn="ppo", loss_fn_config=None)
        await future.result_async()

    with hooks.cookbook_logging(progress):
        logger = ml_log.setup_logging(log_dir=str(tmp_path), do_configure_logging_module=False)
        asyncio.run(recipe_step())
        logger.log_metrics({"progress/batch": 0, "env/all/reward/total": 0.5}, step=0)
        logger.log_metrics({"progress/batch": 1}, step=1)  # a step whose result nobody read: no statistics
        logger.close()
    assert ml_log.setup_logging.__module__ == "tinker_cookbook.utils.ml_log"  # put back
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0][metrics.LOSS] == pytest.approx(2.0) and rows[0][metrics.CLIP] == pytest.approx(0.5)
    assert metrics.LOSS not in rows[1]


# --- --load-checkpoint -----------------------------------------------------------------------------


def test_load_checkpoint_takes_a_state_path_or_a_run_folders_newest_state(tmp_path):
    state = "tinker://model_a/weights/final"
    assert rl.checkpoint_state(None) is None and rl.checkpoint_state(state) == state
    (tmp_path / "checkpoints.jsonl").write_text(
        json.dumps({"name": "000008", "state_path": "tinker://model_a/weights/000008"}) + "\n"
        + json.dumps({"name": "final", "state_path": state, "sampler_path": "tinker://model_a/final"}) + "\n")
    assert rl.checkpoint_state(str(tmp_path)) == state
    with pytest.raises(UsageError, match="give a training state, tinker://<model>/weights/<name>"):
        rl.checkpoint_state("tinker://model_a/final")  # a sampler export
    with pytest.raises(UsageError, match="nor a run folder whose checkpoints.jsonl lists a saved state"):
        rl.checkpoint_state(str(tmp_path / "nothing-here"))
