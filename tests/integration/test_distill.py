"""`rlcli train distill` and the SkyRL facts it rests on, against the real server on CPU.

The facts (docs/decisions.md), each pinned here: compute_logprobs answers N-1 prompt logprobs, which
rlcli's hook gives the shape the cookbook slices (its distillation KL and its RL loop's KL penalty);
create_sampling_client naming both base_model and model_path is refused; a stock server loads a
sampler checkpoint into its training model's own slot, over the live weights; without weights the
loss of a sequence is divided by its full length, with the mask sent as weights by its response's.
Then the command: recover (SFT moves the model away, distillation from the base brings the teacher
KL down by more than half), a checkpoint teacher in a slot of its own with --resume, a teacher on a
second server, and the two-server recipe (an RL run exported merged, served as the teacher). Sizes are
the smallest that show it: a handful of steps, 2-4 prompts.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from rlcli.client import unload_model
from rlcli.demo import DEMO_CHATS
from rlcli.server.private import private_server
from rlcli.train import hooks, metrics
from rlcli.train.folder import MODELS_FILE
from tests.conftest import run_rlcli, shared_compile_cache, shared_server_venv
from tests.integration.test_fused_gspo import clean_client, current_logprobs

pytestmark = pytest.mark.server

TINY = ["--batch-size", "2", "--group-size", "2", "--max-tokens", "8", "--eval-every", "0", "--save-every", "0"]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def service_for(url: str, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    return tinker.ServiceClient(base_url=url)


def distill(env: dict, url: str, run: Path, *flags: str) -> subprocess.CompletedProcess:
    start = time.monotonic()
    proc = run_rlcli("train", "distill", "--base-url", url, "--log-path", str(run), *flags, env=env, timeout=600)
    print(f"train distill {' '.join(flags)}: {time.monotonic() - start:.1f}s\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def sft_run(server, tmp_path_factory) -> Path:
    """SFT on the demo chats until the model has moved away from the base (12 steps)."""
    folder = tmp_path_factory.mktemp("distill")
    data = folder / "demo.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p},
                                                     {"role": "assistant", "content": r}]}) + "\n"
                            for p, r in DEMO_CHATS))
    run_rlcli("train", "sl", "--dataset", str(data), "--batch-size", "4", "--epochs", "12", "--save-every", "0",
              "--base-url", server.url, "--log-path", str(folder / "sft"), env=server.env, timeout=300, check=True)
    return folder / "sft"


# --- the SkyRL facts ---------------------------------------------------------------------------


def test_prompt_logprobs_are_n_minus_1_and_the_hook_gives_the_cookbook_its_shape(server, monkeypatch):
    import tinker
    from tinker_cookbook.rl.metrics import incorporate_kl_penalty

    base = service_for(server.url, monkeypatch).create_sampling_client(base_model=server.model).result()
    tokens = [int(t) for t in np.random.default_rng(0).integers(5, 900, 12)]
    prompt = tinker.ModelInput.from_ints(tokens)
    raw = base.compute_logprobs(prompt).result()
    assert len(raw) == len(tokens) - 1 and None not in raw  # hosted Tinker: N, the first None
    with hooks.hosted_prompt_logprobs():
        hosted = asyncio.run(base.compute_logprobs_async(prompt))
    assert hosted[0] is None and hosted[1:] == raw

    # The RL loop's KL penalty against the base model slices [1:]: it fails on SkyRL's answer, and with the
    # hook each response token's advantage is coef (mean difference - its sampled - base logprob).
    mask = np.array([0.0] * 6 + [1.0] * 5, dtype=np.float32)
    sampled = (-np.arange(11, dtype=np.float32) / 10) * mask

    def datum():
        return tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={"target_tokens": np.array(tokens[1:], dtype=np.int64),
                                            "logprobs": sampled, "mask": mask,
                                            "advantages": np.zeros(11, dtype=np.float32)})

    with pytest.raises(RuntimeError, match="size of tensor"):
        asyncio.run(incorporate_kl_penalty([datum()], base, 0.5, 0.0))
    data = [datum()]
    with hooks.hosted_prompt_logprobs():
        asyncio.run(incorporate_kl_penalty(data, base, 0.5, 0.0))
    diff = mask * (sampled - np.array(raw))
    want = 0.5 * mask * (diff.sum() / mask.sum() - diff)
    assert np.allclose(data[0].loss_fn_inputs["advantages"].to_numpy(), want, atol=1e-5)


def test_the_sl_recipes_test_nll_through_the_hook_is_what_forward_scores(server, monkeypatch):
    """tinker-cookbook 0.5.8's SamplerNLLEvaluator (the SL recipe's --test-size) slices compute_logprobs [1:] as
    for hosted Tinker: on SkyRL's N-1 answer its logprobs are one short of the weights; with the hook, the same
    weights' NLL as a forward pass of the same model."""
    import tinker
    from tinker_cookbook.supervised.nll_evaluator import SamplerNLLEvaluator

    trainer = service_for(server.url, monkeypatch).create_lora_training_client(base_model=server.model, rank=4,
                                                                               seed=0).result()
    try:
        tokens = [int(t) for t in np.random.default_rng(1).integers(5, 900, 10)]
        weights = np.array([0.0] * 4 + [1.0] * 5, dtype=np.float32)
        datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                             loss_fn_inputs={"target_tokens": np.array(tokens[1:], dtype=np.int64),
                                             "weights": weights})
        out = trainer.forward([datum], "cross_entropy").result()
        want = -float((out.loss_fn_outputs[0]["logprobs"].to_numpy() * weights).sum() / weights.sum())
        sampler = trainer.save_weights_and_get_sampling_client().result()
        evaluator = SamplerNLLEvaluator([datum])
        with pytest.raises(RuntimeError, match="size"):  # 8 logprobs for 9 weights
            asyncio.run(evaluator(sampler))
        with hooks.hosted_prompt_logprobs():
            got = asyncio.run(evaluator(sampler))["test/nll"]
        assert got == pytest.approx(want, rel=1e-3, abs=1e-3)
    finally:
        unload_model(server.url, trainer.model_id)


def test_a_sampling_client_naming_both_base_model_and_model_path_is_refused(server, monkeypatch):
    service = service_for(server.url, monkeypatch)
    with pytest.raises(Exception, match="Exactly one of base_model or model_path"):
        service.create_sampling_client(base_model=server.model, model_path="tinker://model_x/sampler_weights/y").result()


def test_stock_skyrl_samples_an_old_checkpoint_over_the_live_weights(stock_server, embedded_model, monkeypatch):
    """Why rlcli never samples a sampler checkpoint of a model that may still be training."""
    import tinker

    url, _ = stock_server
    service = service_for(url, monkeypatch)
    client = clean_client(service, embedded_model, seed=3)
    tokens = np.random.default_rng(3).integers(5, 900, (2, 17))
    try:
        old = client.save_weights_for_sampler("old").result().path
        data = [tinker.Datum(model_input=tinker.ModelInput.from_ints(row[:-1].tolist()),
                             loss_fn_inputs={"target_tokens": row[1:].astype(np.int64)}) for row in tokens]
        for _ in range(3):
            client.forward_backward(data, "cross_entropy").result()
            client.optim_step(tinker.AdamParams(learning_rate=0.05)).result()
        live = current_logprobs(client, tokens)
        service.create_sampling_client(model_path=old).result().compute_logprobs(
            tinker.ModelInput.from_ints(tokens[0].tolist())).result()
        after = current_logprobs(client, tokens)
    finally:
        unload_model(url, client.model_id)
    assert np.abs(after - live).max() > 0.05  # the training model now holds the old weights


def test_the_mask_as_weights_divides_each_sequence_by_its_response(server, monkeypatch):
    """importance_sampling on one sequence: with no weights the server divides by all 15 target tokens,
    with the mask as weights by the 5 response tokens: the gradient is 3 times larger."""
    import tinker

    service = service_for(server.url, monkeypatch)
    client = clean_client(service, server.model, seed=4)
    tokens = np.random.default_rng(4).integers(5, 900, 16)
    mask = np.array([0.0] * 10 + [1.0] * 5, dtype=np.float32)
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1].tolist()),
                         loss_fn_inputs={"target_tokens": tokens[1:].astype(np.int64), "mask": mask,
                                         "logprobs": np.full(15, -5.0, dtype=np.float32),
                                         "advantages": mask * np.linspace(-1, 1, 15, dtype=np.float32)})

    def grad_norm(d) -> float:
        client.forward_backward([d], "importance_sampling").result()
        return float(client.optim_step(tinker.AdamParams(learning_rate=0.0)).result().metrics["skyrl.ai/grad_norm"])

    try:
        unweighted = grad_norm(tinker.Datum(model_input=datum.model_input, loss_fn_inputs={
            k: v for k, v in datum.loss_fn_inputs.items() if k != "mask"}))
        weighted = grad_norm(hooks.mask_as_weights(datum))
    finally:
        unload_model(server.url, client.model_id)
    assert unweighted > 0 and weighted / unweighted == pytest.approx(15 / 5, rel=1e-3)


# --- the command -------------------------------------------------------------------------------


def test_recover_brings_the_teacher_kl_down_by_half(server, sft_run, tmp_path):
    run = tmp_path / "recover"
    proc = distill(server.env, server.url, run, "--prompts", "arithmetic", "--teacher", "base", "--load-checkpoint",
                   str(sft_run), "--max-steps", "8", "--batch-size", "4", "--group-size", "2", "--max-tokens", "16",
                   "--eval-size", "8", "--eval-every", "7", "--save-every", "0", "--lr", "5e-3")
    found = rows(run / "metrics.jsonl")
    kl = [m[metrics.TEACHER_KL] for m in found]
    held_out = [m[metrics.TEST_TEACHER_KL] for m in found if metrics.TEST_TEACHER_KL in m]
    print(f"teacher KL per step {np.round(kl, 3).tolist()}; held-out {np.round(held_out, 3).tolist()}; "
          f"held-out correct {[m[metrics.TEST_CORRECT] for m in found if metrics.TEST_CORRECT in m]}")
    assert len(found) == 8 and len(held_out) == 2
    assert np.mean(kl[:3]) > 0.1  # the SFT moved the student away from the base
    assert np.mean(kl[-3:]) < np.mean(kl[:3]) / 2 and held_out[-1] < held_out[0] / 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert len(lines) == 8 and "teacher KL" in lines[0] and "held-out KL" in lines[0]
    assert "teacher KL" in proc.stdout and rows(run / "checkpoints.jsonl")[-1]["name"] == "final"
    assert (run / MODELS_FILE).read_text() == ""


def test_a_checkpoint_teacher_in_its_own_slot_and_resume(server, sft_run, tmp_path):
    run = tmp_path / "student"
    sampler = rows(sft_run / "checkpoints.jsonl")[-1]["sampler_path"]
    proc = distill(server.env, server.url, run, "--prompts", "arithmetic", "--teacher", sampler, *TINY,
                   "--max-steps", "2", "--save-every", "1")
    assert "is a sampler checkpoint" in proc.stderr and "re-created in a LoRA slot of its own" in proc.stderr
    assert rows(run / "metrics.jsonl")[0][metrics.TEACHER_KL] > 0.1  # a base student against the SFT teacher
    distill(server.env, server.url, run, "--prompts", "arithmetic", "--teacher", str(sft_run), *TINY,
            "--max-steps", "3", "--save-every", "1", "--resume")
    assert [m[metrics.BATCH] for m in rows(run / "metrics.jsonl")][-1] == 2
    assert (run / MODELS_FILE).read_text() == ""  # the student's slot and the teacher's, freed
    refused = run_rlcli("train", "distill", "--base-url", server.url, "--log-path", str(run), "--resume",
                        "--prompts", "arithmetic", "--teacher", "base", *TINY, env=server.env, timeout=120)
    assert refused.returncode != 0 and "was run with teacher" in refused.stderr


def test_keep_distills_its_prompts_toward_the_start_weights(server, sft_run, tmp_path):
    """--keep: beside the sums (teacher: the base), each step distills the SFT chats' prompts toward the SFT weights
    the student starts from, a second teacher in a slot of its own: on the first step the student is those weights,
    so its teacher KL there is ~0 while the sums' is not; both slots are freed."""
    chats = tmp_path / "chats.jsonl"
    chats.write_text("".join(json.dumps({"messages": [{"role": "user", "content": p},
                                                      {"role": "assistant", "content": r}]}) + "\n"
                             for p, r in DEMO_CHATS))
    run = tmp_path / "keep"
    proc = distill(server.env, server.url, run, "--prompts", "arithmetic", "--teacher", "base", "--load-checkpoint",
                   str(sft_run), "--keep", str(chats), "--keep-batch-size", "2", *TINY, "--max-steps", "3")
    assert "keep: replay traces" in proc.stderr and "(a second teacher" in proc.stderr
    found = rows(run / "metrics.jsonl")
    assert len(found) == 3  # --keep's 2 batches went round for the 3 steps --max-steps asks
    first = found[0]
    assert abs(first["teacher_kl/dataset_1"]) < 0.01 < first["teacher_kl/dataset_0"], first
    assert (run / MODELS_FILE).read_text() == ""


def test_a_teacher_on_a_second_server(server, stock_server, tmp_path):
    url, _ = stock_server
    run = tmp_path / "remote"
    proc = distill(server.env, server.url, run, "--prompts", "arithmetic", "--teacher-url", url, *TINY,
                   "--max-steps", "1", "--reward-coef", "0.5")
    assert f"the base model {server.model} of the server at {url}" in proc.stderr
    row = rows(run / "metrics.jsonl")[0]
    assert abs(row[metrics.TEACHER_KL]) < 0.01  # a fresh LoRA is the base
    assert metrics.REWARD in row and "reward" in [ln for ln in proc.stderr.splitlines() if ln.startswith("step")][0]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a second server starts (its engine compiles): minutes on a loaded 2-core machine
def test_an_rl_run_exported_merged_teaches_a_base_student_from_a_second_server(server, tmp_path):
    """The documented two-server recipe: `train rl` (gspo), `export --format merged`, `serve start --base-model`
    of that folder on a second server, `train distill --teacher-url`. The export carries the base's tokenizer
    byte for byte, so the tokenizer check passes; a fresh student starts at the base, away from the teacher."""
    rl, start = tmp_path / "rl", time.monotonic()
    run_rlcli("train", "rl", "--loss", "gspo", "--dataset", "arithmetic", "--max-operand", "9", "--max-steps", "3",
              "--batch-size", "4", "--group-size", "4", "--max-tokens", "8", "--lr", "1e-2", "--eval-every", "0",
              "--save-every", "0", "--base-url", server.url, "--log-path", str(rl), env=server.env, timeout=600,
              check=True)
    merged = tmp_path / "rl-merged"
    run_rlcli("export", rows(rl / "checkpoints.jsonl")[-1]["sampler_path"], "--format", "merged", "-o", str(merged),
              "--base-url", server.url, env=server.env, timeout=300, check=True)
    print(f"train rl and export: {time.monotonic() - start:.0f}s")
    with private_server(merged, "--slots", "1", venv=shared_server_venv(),
                        home=shared_compile_cache(tmp_path / "teacher-home")) as teacher:
        print(f"teacher server started in {teacher.start_s:.0f}s")
        proc = distill(server.env, server.url, tmp_path / "student", "--prompts", "arithmetic", "--max-operand", "9",
                       "--teacher-url", teacher.url, *TINY, "--batch-size", "4", "--max-steps", "8", "--lr", "5e-3",
                       "--eval-size", "8", "--eval-every", "7")
    assert f"the base model {merged} of the server at {teacher.url}" in proc.stderr  # the tokenizer check passed
    found = rows(tmp_path / "student" / "metrics.jsonl")
    kl = [m[metrics.TEACHER_KL] for m in found]
    held_out = [m[metrics.TEST_TEACHER_KL] for m in found if metrics.TEST_TEACHER_KL in m]
    print(f"teacher KL per step {np.round(kl, 3).tolist()}; held-out {np.round(held_out, 3).tolist()}")
    # The batch KL (4 prompts x 2 samples of a few tokens) swings by a nat from step to step; the held-out KL,
    # on the same 8 prompts each time, is the signal.
    assert len(kl) == 8 and len(held_out) == 2 and held_out[0] > 0.1  # the RL teacher is not the base
    assert held_out[-1] < held_out[0] / 2


def test_train_rl_with_a_kl_penalty_against_the_base(server, tmp_path):
    """The cookbook's KL penalty slices SkyRL's prompt logprobs too: with the hook `train rl --kl-coef` runs."""
    run = tmp_path / "rl"
    proc = run_rlcli("train", "rl", "--loss", "ppo", "--dataset", "arithmetic", "--kl-coef", "0.1", *TINY,
                     "--max-steps", "1", "--base-url", server.url, "--log-path", str(run), env=server.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "KL penalty vs the base model: 0.1" in proc.stderr
    assert abs(rows(run / "metrics.jsonl")[0]["kl_policy_base"]) < 0.01  # a fresh LoRA is the base


def test_self_distillation_on_imported_conversations(server, tmp_path):
    """`rlcli import` output as prompts, the teacher (the base) shown each logged answer: a fresh LoRA
    student is the base, so any teacher KL comes from the answer in the teacher's prompt."""
    data = tmp_path / "traces.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"What is {i} + {i + 3}?"},
                                                     {"role": "assistant", "content": f"It is {2 * i + 3}."}]}) + "\n"
                            for i in range(6)))
    run = tmp_path / "self"
    proc = distill(server.env, server.url, run, "--prompts", str(data), "--teacher", "base",
                   "--teacher-context", "answer", *TINY, "--max-steps", "2", "--eval-size", "2", "--eval-every", "2")
    assert f"replay traces {data}" in proc.stderr and "its prompt also shows the logged answer" in proc.stderr
    found = rows(run / "metrics.jsonl")
    kl = [m[metrics.TEACHER_KL] for m in found if metrics.TEACHER_KL in m]
    print(f"teacher KL per step {kl}; held-out {[m.get(metrics.TEST_TEACHER_KL) for m in found]}")
    assert len(kl) == 2 and abs(kl[0]) > 0.01  # without the answer a fresh LoRA would sit below 0.01
    assert metrics.TEST_TEACHER_KL in found[0]
    seen = rows(run / "teacher_prompts.jsonl")
    assert len(seen) >= 2 * 2 + 2  # two steps of two prompts, and the two held-out ones
    for row in seen:
        assert f"correct answer is: {row['answer']}" in row["teacher_prompt"]
        assert row["answer"] not in row["student_prompt"] and row["answer"].startswith("It is ")
    assert (run / MODELS_FILE).read_text() == ""
