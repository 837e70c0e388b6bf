"""`--env replay` without a server: traces as problems, the held-out split, each reward, degenerate policies.

The env is the real one over the embedded model's renderer; replies are tokenized as a sample would be.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from rlcli.errors import UsageError
from rlcli.problems import rewards, traces
from rlcli.train import renderers
from tests.conftest import REPO

TRACES = REPO / "tests" / "fixtures" / "traces"
DEMO, VERDICTS, TOOLS = TRACES / "demo.jsonl", TRACES / "verdicts.jsonl", TRACES / "tools.jsonl"


# --- rewards, pure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "logged", "match", "agree"), [
    ("13 + 14 = 27.", "13 + 14 = 27.", "exact", True),
    ("13 + 14 = 27", "13 + 14 = 27.", "exact", False),
    ("  13 + 14 =   27 ", "13 + 14 = 27.", "normalized", True),
    ("The sum is 27", "13 + 14 = 27.", "number", True),
    ("The sum is 1,027.0", "It is 1027", "number", True),
    ("13 + 14", "13 + 14 = 27.", "number", False),  # the last number is what counts
    ("no digits", "no numbers either", "number", False),  # nothing extracted never agrees
    ("answer: B", "Answer: b", r"regex:(?i)answer:\s*(\w)", True),
    ("answer: C", "Answer: b", r"regex:(?i)answer:\s*(\w)", False),
    ("", "", "exact", False),
])
def test_match(reply, logged, match, agree):
    assert rewards.matches(reply, logged, match) is agree


def test_match_flag_is_checked():
    assert rewards.check_match("regex:\\d+") == "regex:\\d+"
    with pytest.raises(UsageError, match="not a valid regular expression"):
        rewards.check_match("regex:(")
    with pytest.raises(UsageError, match="choose exact, normalized, number or regex:PATTERN"):
        rewards.check_match("fuzzy")


def test_verdict_reward_rewards_good_targets_and_penalises_bad_ones():
    assert rewards.verdict_reward("Paris", "Paris.", 1.0, "normalized") == 1.0
    assert rewards.verdict_reward("Lyon", "Lyon.", 0.0, "normalized") == -1.0
    assert rewards.verdict_reward("Marseille", "Lyon.", 0.0, "normalized") == 0.0
    assert rewards.verdict_of({"score": 0.5}) == 0.5 and rewards.verdict_of({"score": True}) is None


RUBRIC = {"all": [{"check": "max_length", "value": 40}],
          "problems": {"trace-1": [{"check": "json_schema", "weight": 2, "value": {
              "type": "object", "required": ["city"], "additionalProperties": False,
              "properties": {"city": {"type": "string", "enum": ["Paris", "Lyon"]}}}}],
              "demo.jsonl:3": [{"check": "contains", "value": "33"}, {"check": "not_contains", "value": "34"},
                               {"check": "regex", "value": "^\\d+ \\+"}, {"check": "json"}]}}


def test_rubric_scores_the_weighted_share_of_passed_checks():
    rubric = rewards.parse_rubric(RUBRIC, "rubric.json")
    city = rubric.checks_for("trace-1", "x.jsonl:1")
    assert rewards.rubric_score('{"city": "Paris"}', city) == 1.0
    assert rewards.rubric_score('```json\n{"city": "Lyon"}\n```', city) == 1.0
    assert rewards.rubric_score('{"city": "Rome"}', city) == pytest.approx(1 / 3)  # only the length passes
    assert rewards.rubric_score('{"city": "Paris", "x": 1}', city) == pytest.approx(1 / 3)
    sums = rubric.checks_for("", "demo.jsonl:3")
    assert rewards.rubric_score("17 + 16 = 33.", sums) == pytest.approx(4 / 5)  # not JSON
    assert rewards.rubric_score("33", sums) == pytest.approx(4 / 5)  # JSON, but not the regex
    assert rubric.checks_for("other") == rubric.common


@pytest.mark.parametrize(("data", "message"), [
    ([], "expected a JSON object"),
    ({"all": []}, "has no checks"),
    ({"all": [{"check": "smells_nice"}]}, "each check is"),
    ({"all": [{"check": "contains", "value": ""}]}, "needs a non-empty text value"),
    ({"all": [{"check": "regex", "value": "("}]}, "not a valid regular expression"),
    ({"all": [{"check": "max_length", "value": "ten"}]}, "needs a character count"),
    ({"all": [{"check": "json", "weight": 0}]}, "weight must be a positive number"),
])
def test_bad_rubrics_are_one_line(data, message):
    with pytest.raises(UsageError, match=message):
        rewards.parse_rubric(data, "rubric.json")


# --- traces as problems ----------------------------------------------------------------------------


def test_demo_traces_are_problems_with_their_source():
    found = traces.read_traces(str(DEMO))
    assert len(found.problems) == 64 and not found.skipped
    first = found.problems[0]
    assert first.source == "demo.jsonl:1" and first.text == "13 + 14 = 27." and first.last_user() == "What is 13 + 14?"
    assert [m["role"] for m in first.prompt] == ["system", "user"]


def test_turns_and_skips_are_counted(tmp_path):
    lines = [{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "1"},
                           {"role": "user", "content": "b"}, {"role": "assistant", "content": "2"}]},
             {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "x"},
                           {"role": "assistant", "content": ""}]}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    last, every = traces.read_traces(str(path), "last"), traces.read_traces(str(path), "all")
    assert [p.text for p in last.problems] == ["2"] and last.skipped == Counter({"empty_reply": 1})
    assert [p.text for p in every.problems] == ["1", "2"]
    assert every.skipped == Counter({"no_user_turn_before": 1, "empty_reply": 1})
    assert [m["content"] for m in every.problems[1].prompt] == ["a", "1", "b"]
    tools = traces.read_traces(str(TOOLS))
    assert tools.skipped == Counter()  # each tool conversation ends with a text answer
    assert traces.read_traces(str(TOOLS), "all").skipped == Counter({"tool_call_turn": 3})


def test_bad_trace_files_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1 + 1", "answer": "2"}\n')
    with pytest.raises(UsageError, match="bad.jsonl line 1: .*run `rlcli import"):
        traces.read_traces(str(bad))
    with pytest.raises(UsageError, match="no traces file at"):
        traces.read_traces(str(tmp_path / "missing.jsonl"))


def test_verdicts_keep_scored_problems_and_count_the_rest():
    found = traces.with_verdicts(traces.read_traces(str(VERDICTS)))
    assert len(found.problems) == 7 and found.skipped == Counter({"no_verdict": 1})
    assert found.problems[0].trace_id == "trace-0" and found.problems[1].score == 0.0


def test_held_out_split_hashes_the_prompt_never_the_reply_nor_the_order():
    problems = traces.read_traces(str(DEMO)).problems
    train, test = traces.split(problems, 6)
    assert len(test) == 6 and not {p.key for p in test} & {p.key for p in train}
    again = traces.split(list(reversed(problems)), 6)[1]
    assert {p.key for p in again} == {p.key for p in test}  # file order does not matter
    rewritten = [traces.Problem(p.prompt, {"role": "assistant", "content": "?"}, p.source) for p in problems]
    assert {p.key for p in traces.split(rewritten, 6)[1]} == {p.key for p in test}  # nor the replies
    doubled = problems + problems
    train2, test2 = traces.split(doubled, 6)
    assert len(test2) == 6 and len(train2) == 2 * len(train)  # every copy of a held-out prompt leaves training


def test_flags_are_checked_before_any_file():
    judge = traces.judge_settings("base", None, None, None)
    with pytest.raises(UsageError, match="needs --dataset TRACES.jsonl"):
        traces.spec_from_flags("replay", None, None, "auto", None, "match", "normalized", "last", None, None)
    with pytest.raises(UsageError, match="--reward rubric needs --rubric"):
        traces.spec_from_flags("replay", "t.jsonl", None, "auto", None, "rubric", "normalized", "last", None, None)
    with pytest.raises(UsageError, match="are for --env replay"):
        traces.spec_from_flags("problems", "t.jsonl", None, "auto", None, "verdict", "normalized", "last", None, None)
    with pytest.raises(UsageError, match="judge flags are for --reward judge"):
        traces.spec_from_flags("replay", "t.jsonl", None, "auto", None, "match", "normalized", "last", None, judge)
    with pytest.raises(UsageError, match="needs --judge-model"):
        traces.judge_settings(None, None, "http://127.0.0.1:1/v1", None)
    with pytest.raises(UsageError, match="--judge x: give base"):
        traces.judge_settings("x", None, None, None)
    spec = traces.spec_from_flags("replay", "t.jsonl", None, "auto", None, "judge", "number", "all", None, judge)
    assert spec.label == "replay/judge:judge/turn:all" and spec.judge["kind"] == "tinker"
    assert spec.on_server("http://127.0.0.1:8000").judge["url"] == "http://127.0.0.1:8000"  # the training server
    other = traces.judge_settings("base", "http://127.0.0.1:9000", None, None)
    assert traces.Spec("t", reward="judge", judge=other).on_server("http://x").judge["url"] == "http://127.0.0.1:9000"


# --- the env: each reward on real tokens, and what a degenerate policy earns -----------------------


@pytest.fixture(scope="module")
def tokenized(embedded_model):
    from tinker_cookbook import renderers as cookbook_renderers
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    renderers.register_local_tokenizer(embedded_model)
    tokenizer = get_tokenizer(embedded_model)
    return cookbook_renderers.get_renderer(renderers.CHATML_RENDERER, tokenizer=tokenizer), tokenizer


def env_for(tokenized, problem, **spec):
    from rlcli.problems.replay import ReplayEnv

    rubric = rewards.parse_rubric(spec.pop("rubric"), "r.json") if "rubric" in spec else None
    return ReplayEnv(problem, tokenized[0], traces.Spec("x", **spec), rubric)


def step(tokenized, env, reply: str, stop: bool = True):
    action = tokenized[1].encode(reply + ("<|im_end|>" if stop else ""), add_special_tokens=False)
    return asyncio.run(env.step(action))


def test_env_prompts_with_the_logged_conversation_and_logs_its_source(tokenized):
    problem = traces.read_traces(str(DEMO)).problems[2]
    env = env_for(tokenized, problem, reward="match", match="number")
    prompt, _ = asyncio.run(env.initial_observation())
    text = tokenized[1].decode(prompt.to_ints())
    assert "You are a careful calculator." in text and "What is 17 + 16?" in text and "33" not in text
    result = step(tokenized, env, "It is 33.")
    assert result.reward == 1.0 and result.logs == {"source": "demo.jsonl:3", "trace_id": ""}
    assert result.metrics == {"echo": 0.0, "correct": 1.0, "reward/match": 1.0, "format": 1.0}
    cut = step(tokenized, env, "It is 33.", stop=False)
    assert cut.reward == pytest.approx(0.9) and cut.metrics["format"] == 0.0  # no stop token: the format penalty


DEGENERATE = {"empty": lambda p: "", "echo": lambda p: p.last_user(), "echo twice": lambda p: p.last_user() * 2}


@pytest.mark.parametrize("reward", ["match", "verdict", "rubric"])
def test_a_degenerate_policy_does_not_score_well(tokenized, reward):
    """Over every problem, the logged good reply outscores an empty reply and the prompt sent back."""
    path = VERDICTS if reward == "verdict" else DEMO
    found = traces.read_traces(str(path))
    problems = traces.with_verdicts(found).problems if reward == "verdict" else found.problems
    spec = {"reward": reward, "match": "number" if reward == "match" else "normalized"}
    if reward == "rubric":
        spec["rubric"] = {"all": [{"check": "regex", "value": r"=\s*\d+\.?$"}, {"check": "max_length", "value": 30},
                                  {"check": "not_contains", "value": "?"}]}

    def mean(policy) -> float:
        return sum(step(tokenized, env_for(tokenized, p, **dict(spec)), policy(p)).reward
                   for p in problems) / len(problems)

    logged = mean(lambda p: p.text if (p.score is None or p.score >= rewards.GOOD_SCORE) else "I am not sure.")
    assert logged > 0.4
    for name, policy in DEGENERATE.items():
        assert mean(policy) <= 0.0, name
    if reward == "verdict":  # copying every logged reply, bad ones included, is penalised
        assert mean(lambda p: p.text) < logged


def test_the_one_scorer_grades_each_answer_with_its_env(tokenized):
    """rlcli.problems.score: each problem answered by a policy, graded by its replay env; per problem for the
    loop's gate, as the cookbook's means for `rlcli eval`."""
    from tinker_cookbook.completers import TokensWithLogprobs

    from rlcli.problems import replay, score

    problems = traces.read_traces(str(DEMO)).problems[:4]
    asked: list[int] = []

    async def policy(prompt, stop, max_tokens=None):  # the logged reply to the first two, nonsense to the others
        n = len(asked)
        asked.append(prompt.length)
        reply = problems[n].text if n < 2 else "no idea"
        return TokensWithLogprobs(tokens=tokenized[1].encode(reply + "<|im_end|>", add_special_tokens=False),
                                  maybe_logprobs=None)

    groups = replay.one_each(problems, tokenized[0], traces.Spec("", match="normalized"))
    graded = score.answer(groups, policy, one_at_a_time=True)
    scored = score.per_problem(graded, tokenized[0])
    assert [g.correct for g in scored] == [1.0, 1.0, 0.0, 0.0] and len(asked) == 4
    assert scored[0].reply == problems[0].text.strip() and scored[3].reply == "no idea"
    means = score.means(groups, graded)
    assert means["test/env/all/correct"] == 0.5 and means["test/env/all/reward/total"] == pytest.approx(0.5)
    assert score.per_problem([None], tokenized[0]) == [score.Scored(0.0, 0.0, "")]


def test_the_scorer_asks_every_problem_at_once_and_k_answers_each(tokenized):
    """score.answer sends every problem's requests together (the server batches what is pending), at most
    `in_flight` at a time; a group of k answers scores the share right; score.rounds runs eval's K rounds in one go."""
    import asyncio

    from tinker_cookbook.completers import TokensWithLogprobs

    from rlcli.problems import replay, score

    problems = traces.read_traces(str(DEMO)).problems[:4]
    waiting, most, calls = [0], [0], [0]

    async def policy(prompt, stop, max_tokens=None):  # every other answer is the logged one
        waiting[0] += 1
        most[0] = max(most[0], waiting[0])
        await asyncio.sleep(0.01)
        waiting[0] -= 1
        calls[0] += 1
        reply = problems[0].text if calls[0] % 2 else "no idea"
        return TokensWithLogprobs(tokens=tokenized[1].encode(reply + "<|im_end|>", add_special_tokens=False),
                                  maybe_logprobs=None)

    groups = replay.one_each(problems[:1], tokenized[0], traces.Spec("", match="normalized"), samples=4)
    assert [g.correct for g in score.per_problem(score.answer(groups, policy), tokenized[0])] == [0.5]
    assert most[0] == 4  # the group's 4 answers asked together
    most[0] = 0
    one_each = replay.one_each(problems, tokenized[0], traces.Spec("", match="normalized"))
    assert most[0] == 0 and len(score.answer(one_each, policy, one_at_a_time=True)) == 4 and most[0] == 1
    rounds = score.rounds(one_each, policy, 3)
    assert [len(r) for r in rounds] == [4, 4, 4] and most[0] == 12  # 3 rounds of 4 problems, all at once
    most[0] = 0
    assert len(score.answer(one_each * 3, policy, in_flight=5)) == 12 and most[0] == 5  # never more than the cap


def test_the_trainers_held_out_evaluator_asks_as_the_scorer_does(tokenized):
    """score.HeldOutEvaluator (train rl --eval-every, train distill): the cookbook's test-set evaluator asking at
    most IN_FLIGHT requests at once, where the cookbook's own sends every problem at once; the same metrics."""
    from types import SimpleNamespace

    from tinker_cookbook.rl.metric_util import RLTestSetEvaluator

    from rlcli.problems import replay, score

    problem = traces.read_traces(str(DEMO)).problems[0]
    tokens = tokenized[1].encode(problem.text + "<|im_end|>", add_special_tokens=False)
    waiting, most = [0], [0]

    class Client:  # a sampling client answering the logged reply after a moment
        async def sample_async(self, prompt, num_samples, sampling_params):
            waiting[0] += 1
            most[0] = max(most[0], waiting[0])
            await asyncio.sleep(0.01)
            waiting[0] -= 1
            return SimpleNamespace(sequences=[SimpleNamespace(tokens=tokens, logprobs=[0.0] * len(tokens),
                                                              stop_reason="stop")])

    groups = replay.one_each([problem] * (score.IN_FLIGHT + 16), tokenized[0], traces.Spec("", match="normalized"))
    found = {}
    for kind in (RLTestSetEvaluator, score.HeldOutEvaluator):
        most[0] = 0
        evaluator = kind(replay.ReplayDataset(groups, len(groups)), max_tokens=8, num_groups_to_log=0)
        found[kind] = asyncio.run(evaluator(Client())), most[0]
    assert found[RLTestSetEvaluator][1] == len(groups) and found[score.HeldOutEvaluator][1] == score.IN_FLIGHT
    assert found[RLTestSetEvaluator][0] == found[score.HeldOutEvaluator][0]
    assert found[score.HeldOutEvaluator][0]["test/env/all/correct"] == 1.0


# --- the command --------------------------------------------------------------------------------------


def test_dry_run_plans_a_replay_run(monkeypatch, capsys, embedded_model, tmp_path):
    from rlcli.train import losses, rl

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(losses, "served_losses", lambda url, timeout=10.0: ("fake", set(losses.STOCK_JAX)))
    assert rl.train_rl(rl.RlOptions(env="replay", dataset=str(VERDICTS), reward="verdict", batch_size=2,
                                    group_size=4, base_url="http://127.0.0.1:9", model=embedded_model,
                                    log_path=str(tmp_path / "run"), dry_run=True, eval_size=1)) is None
    out = capsys.readouterr().out
    assert f"replay traces {VERDICTS} (skipped: 1 no_verdict): 6 problems" in out
    assert "grader replay/verdict:verdict, match normalized/turn:last; 1 held-out problems" in out


def test_eval_plays_tool_policies_without_a_server(tmp_path):
    from tests.conftest import run_rlcli

    proc = run_rlcli("eval", "--env", "tools", "--policy", "oracle", "--dataset", str(TOOLS), timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["reward"] == 1.0, proc.stderr
    proc = run_rlcli("eval", "--policy", "nop", "--dataset", str(TOOLS), timeout=120)
    assert proc.returncode == 2 and "pass all three" in proc.stderr
