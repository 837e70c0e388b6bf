"""`rlcli train distill` without a server: the advantage against a float64 reference, flags, teachers,
tokenizer agreement, the plan, the progress line.

The teacher's sampling client is faked (a SkyRL-shaped N-1 answer from a table); the cookbook's own
KL code is the real one. tests/integration/test_distill.py runs all of it against the real server.
"""

from __future__ import annotations

import asyncio
import json
import shutil

import numpy as np
import pytest

from rlcli.errors import UsageError
from rlcli.train import distill, distill_loop, hooks, losses, metrics, teacher

DEAD_URL = "http://127.0.0.1:9"  # nothing listens: any request that slips through fails loudly


def skyrl_sampler(table: dict[tuple[int, ...], list[float]]):
    """A tinker.SamplingClient whose compute_logprobs answers as SkyRL's jax backend does: N-1 floats."""
    import tinker

    class Fake(tinker.SamplingClient):
        def compute_logprobs(self, prompt, prompt_logprobs_last_n=None):  # tinker 0.38: an awaitable APIFuture
            async def answer() -> list[float]:
                return list(table[tuple(prompt.to_ints())])
            return answer()

    return object.__new__(Fake)


def batch(rng: np.random.Generator, lengths: list[tuple[int, int]]):
    """Datums as the RL loop assembles them (prompt then response; targets shifted by one), the student's
    sampled logprobs, and the teacher's N-1 logprobs of each full sequence."""
    import tinker

    data, table, student, teacher_aligned, masks = [], {}, [], [], []
    for prompt_len, response_len in lengths:
        tokens = [int(t) for t in rng.integers(0, 1000, prompt_len + response_len)]
        mask = np.array([0.0] * (prompt_len - 1) + [1.0] * response_len, dtype=np.float32)
        lp = (-rng.random(len(mask)) * 3 * mask).astype(np.float32)
        teacher_lp = (-rng.random(len(tokens) - 1) * 3).tolist()  # one per token after the first
        table[tuple(tokens)] = teacher_lp
        data.append(tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                                 loss_fn_inputs={"target_tokens": np.array(tokens[1:], dtype=np.int64),
                                                 "logprobs": lp, "mask": mask,
                                                 "advantages": np.zeros(len(mask), dtype=np.float32)}))
        student.append(lp)
        teacher_aligned.append(np.array(teacher_lp))
        masks.append(mask)
    return data, skyrl_sampler(table), student, teacher_aligned, masks


@pytest.mark.parametrize(("kl_coef", "discount"), [(1.0, 0.0), (0.5, 0.9)])
def test_advantage_matches_a_float64_reference(kl_coef, discount):
    from tinker_cookbook.distillation.train_on_policy import incorporate_kl_penalty

    data, fake, student, teacher_lp, masks = batch(np.random.default_rng(0), [(5, 4), (9, 7), (3, 1)])
    with hooks.hosted_prompt_logprobs():
        found = asyncio.run(incorporate_kl_penalty(data, [fake] * len(data), [0] * len(data), kl_coef, discount))
    total_kl = total_tokens = 0.0
    for datum, s, t, m in zip(data, student, teacher_lp, masks, strict=True):
        want = distill_loop.reference_advantages(s, t, m, kl_coef, discount)
        assert np.allclose(datum.loss_fn_inputs["advantages"].to_numpy(), want, rtol=1e-5, atol=1e-5)
        assert np.all(want[m == 0] == 0) or discount > 0  # no signal on prompt tokens without a discount
        total_kl, total_tokens = total_kl + float(((s - t) * m).sum()), total_tokens + float(m.sum())
    assert found[metrics.TEACHER_KL] == pytest.approx(total_kl / total_tokens, rel=1e-5)


def test_without_the_hook_skyrls_answer_does_not_fit_the_cookbooks_slice():
    from tinker_cookbook.distillation.train_on_policy import incorporate_kl_penalty

    data, fake, *_ = batch(np.random.default_rng(1), [(5, 4)])
    with pytest.raises(RuntimeError, match="size of tensor"):
        asyncio.run(incorporate_kl_penalty(data, [fake], [0], 1.0, 0.0))


def test_hosted_shape_pads_only_skyrls_answer():
    assert hooks.hosted_shape([-1.0, -2.0], 3) == [None, -1.0, -2.0]
    assert hooks.hosted_shape([None, -1.0, -2.0], 3) == [None, -1.0, -2.0]  # hosted Tinker's: unchanged


def test_the_mask_travels_as_weights_and_explicit_weights_win():
    import tinker

    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints([1, 2, 3]),
                         loss_fn_inputs={"target_tokens": np.array([2, 3, 4]), "mask": np.array([0.0, 1.0, 1.0])})
    out = hooks.mask_as_weights(datum)
    assert "mask" not in out.loss_fn_inputs and out.loss_fn_inputs["weights"].tolist() == [0.0, 1.0, 1.0]
    explicit = tinker.Datum(model_input=datum.model_input,
                            loss_fn_inputs={**datum.loss_fn_inputs, "weights": np.array([1.0, 1.0, 0.5])})
    assert hooks.mask_as_weights(explicit).loss_fn_inputs["weights"].tolist() == [1.0, 1.0, 0.5]
    from tinker_cookbook.rl import train as rl_train

    with hooks.response_weights():
        assert rl_train._remove_mask is hooks.mask_as_weights
    assert rl_train._remove_mask is not hooks.mask_as_weights


@pytest.mark.parametrize(("flags", "message"), [
    ({"kl_coef": 0.0}, "--kl-coef must be positive"),
    ({"kl_discount": 1.0}, r"--kl-discount must be in \[0, 1\)"),
    ({"reward_coef": -1.0}, "--reward-coef must be 0"),
    ({"reward_coef": 1.0, "group_size": 1}, "--group-size must be at least 2"),
    ({"group_size": 0}, "--group-size must be at least 1"),
    ({"prompts": None}, "pass --prompts arithmetic"),
    ({"prompts": "arithmetic", "dataset_path": "x.jsonl"}, "--dataset-path is for gsm8k data"),
    ({"prompts": "mine.jsonl", "dataset_path": "x.jsonl"}, "--prompts mine.jsonl is a file already"),
    ({"teacher": None}, "pass --teacher base"),
    ({"teacher": "tinker://m/weights/x", "teacher_url": DEAD_URL}, "drop --teacher"),
    ({"teacher": "no/such/run"}, "nor a run folder"),
    ({"teacher": "tinker://m/bogus/x/y"}, "is not a checkpoint path"),
    ({"teacher_context": "answer"}, "--teacher-context answer needs prompts with logged answers"),
    ({"teacher_context": "bogus"}, "--teacher-context bogus: choose from none, answer"),
    ({"keep": "doors.jsonl"}, "--keep distills its prompts toward the weights the student starts from"),
    ({"keep": "doors.jsonl", "load_checkpoint": "runs/sl", "keep_batch_size": 0}, "--keep-batch-size must be"),
])
def test_bad_flags_fail_in_one_line_before_any_model(fake_server, embedded_model, tmp_path, flags, message):
    args = dict(prompts="arithmetic", teacher="base", base_url=DEAD_URL, model=embedded_model,
                log_path=str(tmp_path / "run"), dry_run=True) | flags
    with pytest.raises(UsageError, match=message):
        distill.train_distill(distill.DistillOptions(**args))
    assert not (tmp_path / "run").exists()


@pytest.fixture
def fake_server(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setattr(losses, "served_losses", lambda url, timeout=10.0: ("stock jax (fake)", set(losses.STOCK_JAX)))


def test_dry_run_prints_the_plan(fake_server, embedded_model, tmp_path, capsys):
    assert distill.train_distill(distill.DistillOptions(
        prompts="arithmetic", teacher="base", base_url=DEAD_URL, model=embedded_model, max_steps=5, batch_size=2,
        group_size=2, eval_size=4, kl_discount=0.5, log_path=str(tmp_path / "run"), dry_run=True, loss="gspo")) is None
    out = capsys.readouterr().out
    assert f"teacher: the served base model {embedded_model}" in out
    assert "signal: -1 x (student - teacher logprob) per token, discounted 0.5" in out
    assert "loss: gspo 2-pass" in out and "2 prompts x 2 samples per step, 5 steps" in out
    assert "4 held-out prompts" in out and not (tmp_path / "run").exists()


def test_keep_plans_a_second_teacher_the_start_weights(fake_server, embedded_model, tmp_path, capsys):
    """--keep: each step also distills prompts toward the weights the student starts from, so what they taught
    stays while --prompts moves it (notebooks/distill.ipynb); a step takes a batch of each, --keep's going round."""
    sft = tmp_path / "sl"
    sft.mkdir()
    (sft / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "state_path": "tinker://m1/weights/final"})
                                           + "\n")
    doors = tmp_path / "doors.jsonl"
    doors.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Door {n}: code please."},
                                                      {"role": "assistant", "content": "42"}]}) + "\n"
                             for n in range(100, 110)))
    assert distill.train_distill(distill.DistillOptions(
        prompts="arithmetic", teacher="base", base_url=DEAD_URL, model=embedded_model, max_steps=8, batch_size=2,
        group_size=2, eval_size=4, load_checkpoint=str(sft), keep=str(doors), keep_batch_size=3,
        log_path=str(tmp_path / "run"), dry_run=True)) is None
    out = capsys.readouterr().out
    assert (f"keep: replay traces {doors}: 10 prompts, 4 batches of 3 (round and round), distilled toward the start "
            "weights tinker://m1/weights/final (a second teacher") in out
    assert "2 prompts x 2 samples per step, 8 steps" in out  # --keep's 4 batches go round: --prompts sets the steps


def test_a_run_folder_or_a_sampler_checkpoint_teacher_is_a_training_state(tmp_path, capsys):
    (tmp_path / "checkpoints.jsonl").write_text(json.dumps({"name": "final", "state_path": "tinker://m1/weights/final",
                                                            "sampler_path": "tinker://m1/final"}) + "\n")
    assert teacher.state_of(str(tmp_path)) == "tinker://m1/weights/final"
    assert teacher.state_of("tinker://m1/weights/000004") == "tinker://m1/weights/000004"
    # Never sampled directly: it would load into model m1's own slot, over its live weights.
    assert teacher.state_of("tinker://m1/sampler_weights/000004") == "tinker://m1/weights/000004"
    found = teacher.resolve("tinker://m1/sampler_weights/000004", None, DEAD_URL, "model", dry_run=True)
    assert (found.kind, found.path) == ("state", "tinker://m1/weights/000004")
    assert "the teacher is its training state tinker://m1/weights/000004" in capsys.readouterr().err


def test_tokenizers_must_agree(embedded_model, tmp_path):
    same, other = tmp_path / "same", tmp_path / "other"
    for folder in (same, other):
        folder.mkdir()
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(f"{embedded_model}/{name}", folder / name)
    assert teacher.tokenizer_mismatch(embedded_model, str(same)) is None
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    assert teacher.tokenizer_mismatch(embedded_model, str(other)) == "their chat template differ"
    assert "cannot load the tokenizer" in teacher.tokenizer_mismatch(embedded_model, str(tmp_path / "none"))


def test_progress_line():
    progress = distill_loop.DistillProgress(4, "importance_sampling", 1, with_reward=False)
    row = {metrics.BATCH: 0, metrics.TEACHER_KL: 0.51, metrics.SAMPLED_TOKENS: 12.75, metrics.LOSS: 0.5,
           metrics.TIME: 1.5, metrics.TEST_TEACHER_KL: 0.44, metrics.TEST_CORRECT: 0.125}
    want = ("step 1/4  teacher KL +0.5100  tokens 12.8  loss +0.5000  importance_sampling fused  1.50s  "
            "held-out KL +0.4400  held-out correct 0.12")
    assert progress.line(row, 0, 9.0) == want
    with_reward = distill_loop.DistillProgress(4, "ppo", 1, with_reward=True)
    assert "reward -  correct -" in with_reward.line({metrics.BATCH: 1}, 1, 2.0)


def test_keep_prompts_go_round_for_as_many_steps_as_the_prompts_take():
    class Batches:
        def __len__(self):
            return 3

        def get_batch(self, index):
            return [f"batch {index}"]

    cycled = distill_loop.Cycled(Batches(), 7)
    assert len(cycled) == 7 and [cycled.get_batch(i)[0] for i in range(7)] == [f"batch {i % 3}" for i in range(7)]


def test_rewards_are_scaled_and_the_rest_passes_through():
    from tinker_cookbook.rl.types import StepResult

    class Env:
        async def initial_observation(self):
            return "prompt", "stop"

        async def step(self, action):
            return StepResult(reward=-0.1, episode_done=True, next_observation=None, next_stop_condition=None,
                              metrics={"correct": 0.0})

    class Group:
        async def make_envs(self):
            return [Env(), Env()]

        async def compute_group_rewards(self, trajectory_group, env_group):
            assert all(isinstance(e, Env) for e in env_group)  # the inner builder sees its own envs
            return [(1.0, {}), (0.0, {})]

        def logging_tags(self):
            return ["arithmetic"]

    class Data:
        def __len__(self):
            return 3

        def get_batch(self, index):
            return [Group()]

    scaled = distill_loop.RewardScaled(Data(), 0.5)
    group = scaled.get_batch(0)[0]
    envs = asyncio.run(group.make_envs())
    step = asyncio.run(envs[0].step("answer"))
    assert (step.reward, step.metrics) == (-0.05, {"correct": 0.0}) and len(scaled) == 3
    assert asyncio.run(group.compute_group_rewards(None, envs)) == [(0.5, {}), (0.0, {})]
    assert group.logging_tags() == ["arithmetic"] and asyncio.run(envs[1].initial_observation()) == ("prompt", "stop")


def test_fixed_choices_are_declared():
    from rlcli.options import specs

    found = {spec.name: spec.choices for spec in specs(distill.DistillOptions) if spec.choices}
    assert found["loss"] == ("importance_sampling", "ppo", "cispo", "gspo")
    assert found["grader"] == ("auto", "gsm8k", "numeric", "exact")
    assert found["teacher_context"] == ("none", "answer")
