"""benchmarks/gpu/: the GPU check's plan and arguments, its server-venv stand-in, its float64 per-token reference,
and the carried wheel set (pinned once each, never the image's CUDA builds, complete when downloaded)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.gpu import gpu_check as check
from benchmarks.gpu import phases, plans, roofline, sampling, wheelset
from rlcli.server import server_venv
from rlcli.train.losses import gspo_reference

SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
              "intermediate_size")


def test_the_1_7b_plan_is_qwen3_1_7b_in_bf16_sized_for_the_main_server():
    plan = plans.plan_from_args(check.parse_args(["--size", "1.7b"]))
    assert plan.size == "1.7b" and plan.dtype == "bfloat16"
    assert {k: plan.arch[k] for k in SHAPE_KEYS} == {
        "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 6144}
    assert plan.arch["tie_word_embeddings"] is True
    # bench_loss holds three LoRA clients at once, and SkyRL keeps slot 0 for itself
    assert plan.main_slots >= 4 and all(s >= 2 for s in plan.slots)
    assert plan.budget_s < 540  # leaves a margin under a 10-minute limit for the phase that is running
    assert plan.phases[0] == "breakdown" and plan.vocab == 151_936


def test_the_default_is_the_4b_with_its_real_vocabulary_breakdown_first_then_the_1_7b_target_shape():
    stages = plans.stages_from_args(check.parse_args([]))
    four, target = stages
    assert four.size == "4b" and four.dtype == "bfloat16" and four.vocab == 151_936
    assert {k: four.arch[k] for k in SHAPE_KEYS} == {
        "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 9728}
    assert four.arch["tie_word_embeddings"] is True
    # the most wanted numbers first: the sampling breakdown at the RL run's shapes, then the RL step split
    assert four.phases[:2] == ("breakdown", "run") and four.run_steps >= 2
    assert {"batch", "pairs", "exactness"} <= set(four.phases) and four.phases.index("exactness") < four.phases.index(
        "pairs")
    assert {(8, 32), (64, 32), (8, 1), (64, 1)} <= set(four.breakdown.shapes)
    assert (four.bench.prompts, four.bench.samples, four.bench.max_tokens) == (8, 8, 32)
    assert target.arch == plans.QWEN3_1_7B and (64, 32) in target.breakdown.shapes and target.then is None
    assert four.budget_s < 540
    line = plans.plan_line(stages)
    assert "4b: 4.02B params, vocab 151,936" in line and "then 1.7b-target" in line


def test_the_dry_run_covers_every_phase_of_the_gpu_sizes():
    tiny = plans.stages_from_args(check.parse_args(["--size", "tiny"]))
    assert [p.phases for p in tiny][0] == plans.PLANS["4b"].phases and len(tiny) == 2
    covered = {name for p in tiny for name in p.phases}
    for size in ("4b", "1.7b"):
        stages = plans.stages_from_args(check.parse_args(["--size", size]))
        assert {name for p in stages for name in p.phases} <= covered
    assert all(p.vocab > 2048 for p in tiny)  # the model's vocabulary wider than the tokenizer's, as the 4B's


def test_the_parameter_count_matches_the_built_1_7b_and_qwen3_4b_s_model_card():
    # the first GPU receipt's model: 1,413,604,352 parameters (vocab 2,048)
    assert roofline.param_count(plans.QWEN3_1_7B, 2048)["total"] == 1_413_604_352
    four = roofline.param_count(plans.QWEN3_4B, plans.QWEN3_VOCAB)
    assert round(four["total"] / 1e9, 1) == 4.0 and round(four["non_embedding"] / 1e9, 1) == 3.6


def test_the_padded_length_is_the_samplers_bucketing():
    assert [roofline.padded_length(n) for n in (1, 32, 33, 48, 49, 57, 64, 65, 89, 96, 97, 200)] == [
        32, 32, 48, 48, 64, 64, 64, 96, 96, 96, 128, 256]
    assert roofline.cache_length(57, 32) == 96  # prompt 57 -> 64, + 32 new -> 96


def test_the_roofline_of_a_4b_decode_at_batch_64_on_an_h200():
    peaks = roofline.device_peaks("NVIDIA H200", None)
    assert (peaks["bandwidth_Bps"], peaks["source"]) == (4.8e12, "datasheet table")
    bound = roofline.decode_bound(plans.QWEN3_4B, plans.QWEN3_VOCAB, "bfloat16", 64, 96, peaks)
    assert bound["weight_bytes"] == 2 * 4_022_468_096
    assert bound["kv_bytes"] == 64 * 96 * 36 * 2 * 8 * 128 * 2
    assert bound["bound_s"] == bound["memory_s"] == pytest.approx((bound["weight_bytes"] + bound["kv_bytes"]) / 4.8e12)
    assert 1.8e-3 < bound["bound_s"] < 1.9e-3  # 8.0 GB of weights + 0.9 GB of KV at 4.8 TB/s
    measured = roofline.against_bound(2 * bound["bound_s"], bound)
    assert measured["times_bound"] == pytest.approx(2.0)


def test_a_device_the_table_does_not_know_takes_the_probe_and_says_so():
    assert roofline.device_peaks("NVIDIA H100 PCIe", None)["bandwidth_Bps"] == 2.0e12  # not the SXM's
    probe = {"copy_Bps": 2e10, "matmul_flops": 1e11}
    cpu = roofline.device_peaks("cpu", probe)
    assert cpu["bandwidth_Bps"] == 2e10 and "placeholder" in cpu["source"]
    assert roofline.device_peaks("cpu", None)["bandwidth_Bps"] is None


def test_the_breakdown_splits_a_request_into_its_parts():
    def reps(client, engine):
        return [{"client_s": client, "engine_s": engine, "tokens": [32] * 8}] * 3

    raw = {"handovers": [{"client_s": 0.2}, {"client_s": 0.4}, {"client_s": 0.3}],
           "shapes": {"8x1": {"samples": 8, "max_tokens": 1, "first": {"client_s": 5.0}, "reps": reps(0.15, 0.1)},
                      "8x32": {"samples": 8, "max_tokens": 32, "first": {"client_s": 9.0},
                               "reps": reps(0.8, 0.72)}},
           "after_new_weights": {"shape": "8x1", "sample": {"engine_s": 0.35}}}
    split = sampling.derive(raw, 57, plans.QWEN3_4B, plans.QWEN3_VOCAB, "bfloat16",
                            roofline.device_peaks("NVIDIA H200", None), [])["8x32"]
    assert split["decode_per_token_s"] == pytest.approx(0.02) and split["prefill_s"] == 0.1
    assert split["waiting_s"] == pytest.approx(0.08) and split["compile_s"] == pytest.approx(8.2)
    # the policy's first hand-over apart, the later ones' median
    assert split["first_handover_s"] == 0.2 and split["handover_s"] == pytest.approx(0.35)
    assert split["weight_load_s"] == pytest.approx(0.25)
    # prefill + (N - 1) decode + waiting is the warm request
    assert split["prefill_s"] + split["decode_s"] + split["waiting_s"] == pytest.approx(split["warm_request_s"])
    assert split["with_handover_s"] == pytest.approx(0.8 + 0.35 + 0.25)
    assert split["roofline"]["times_bound"] > 1 and "8x1" not in sampling.derive(
        raw, 57, plans.QWEN3_4B, plans.QWEN3_VOCAB, "bfloat16", {}, [])


def test_the_jax_that_ran_is_checked_against_the_lock():
    locked = check.locked_jax()
    assert locked and locked.startswith("0.12")
    assert check.jax_vs_lock(locked)["same"]
    old = check.jax_vs_lock("0.11.2")
    assert not old["same"] and "0.11.2" in old["note"] and locked in old["note"]


def test_arguments_override_the_plan():
    args = check.parse_args(["--size", "tiny", "--pairs", "2", "--slots", "16,2", "--run-steps", "0",
                             "--budget-s", "100", "--dtype", "float32"])
    plan = plans.plan_from_args(args)
    assert (plan.bench.pairs, plan.slots, plan.run_steps, plan.budget_s, plan.dtype) == (2, (16, 2), 0, 100, "float32")
    assert plans.plan_from_args(check.parse_args(["--slots", ""])).slots == ()
    with pytest.raises(SystemExit, match="at least 2"):
        plans.parse_slots("8,1")


def test_plan_prints_without_running(capsys):
    assert check.main(["--plan", "--size", "tiny"]) == 0
    assert '"size": "tiny"' in capsys.readouterr().out


def test_a_missing_tokenizer_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as caught:
        check.find_tokenizer(str(tmp_path))
    message = str(caught.value)
    assert "--tokenizer" in message and "\n" not in message
    for name in check.TOKENIZER_FILES:
        (tmp_path / name).write_text("{}")
    assert check.find_tokenizer(str(tmp_path)) == tmp_path


def test_the_image_interpreter_passes_for_a_complete_server_venv(tmp_path):
    venv = check.image_venv(sys.executable, tmp_path / "venv")
    assert server_venv.is_complete(venv, "jax")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix)"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == sys.prefix  # the wrapper runs the interpreter as itself (its venv kept)


def test_per_token_reference_reduces_to_the_float64_gspo_loss():
    rng = np.random.default_rng(3)
    lengths, low, high = (7, 12, 9), 0.8, 1.2
    lp = [rng.normal(-2.0, 0.5, n) for n in lengths]
    old = [a - rng.normal(0.0, 0.3) - rng.normal(0.0, 0.05, a.shape) for a in lp]
    adv = [np.full(n, rng.normal()) for n in lengths]
    weights = [np.r_[np.zeros(2), np.ones(n - 2)] for n in lengths]
    tokens = phases.per_token_reference(lp, old, adv, weights, low, high)
    loss = np.mean([t.sum() / w.sum() for t, w in zip(tokens, weights, strict=True)])
    want, _ = gspo_reference(*(phases.padded(x) for x in (lp, old, adv, weights)), 1 - low, high - 1)
    assert loss == pytest.approx(want, abs=1e-12)


def test_compile_times_are_read_from_wrapped_log_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO - skyrl: JIT compilation for train seq_len=96 took\n   12.50s\n"
                   "INFO - skyrl: JIT compilation for sample seq_len=64 took 30.25s\n")
    assert phases.compile_times(log) == [{"mode": "train", "seq_len": 96, "s": 12.5},
                                        {"mode": "sample", "seq_len": 64, "s": 30.25}]


def test_the_pinned_wheels_are_one_of_each_and_none_of_the_images_cuda_builds():
    pins, image = wheelset.read_pins(), wheelset.read_image()
    assert wheelset.plan_problems(pins, image) == []
    names = {p.name for p in pins}
    assert {"skyrl", "tinker"} <= names and not names & wheelset.NEVER_CARRY
    # the versions rlcli's CPU server venv runs (its lock), so a dry run on CPU tests what the GPU gets
    lock = server_venv.pins_file("jax").read_text()
    locked = {wheelset.canonical(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", lock, re.M)}
    assert {p.name: p.version for p in pins} == {p.name: locked.get(p.name) for p in pins}
    assert [p.name for p in pins if p.fallback] == ["flax"]
    assert image["jax"] == "0.11.2" and not set(wheelset.NOT_CARRIED) & names


def test_the_closure_names_what_nothing_provides():
    pins = [wheelset.Pin("app", "1.0"), wheelset.Pin("lib", "2.0")]
    image = {"numpy": "2.0", "transformers": "5.17.0"}
    requires = {"app": ("1.0", ["lib>=2", "numpy", "datasets>=4", "absent", "transformers<=5.16.1",
                                "ray; extra == 'ray'", "colorama; sys_platform == 'win32'"]),
                "lib": ("2.0", ["app>=3"])}
    report = wheelset.closure_report(pins, image, requires)
    assert report["missing"] == ["app needs absent: neither carried nor in the image", "lib needs app>=3; carried "
                                 "app==1.0"]
    assert [dep for dep, _ in report["conflicts"]] == ["transformers"] and "datasets" in report["not_carried"]


@pytest.mark.skipif(not any(wheelset.WHEELS.glob("*.whl")), reason="no wheels downloaded (make gpu-wheels)")
def test_the_downloaded_wheels_are_complete_for_the_image(capsys):
    assert wheelset.check(wheelset.WHEELS) == 0, capsys.readouterr().err


def test_a_later_stage_starts_only_if_its_model_server_and_first_phase_fit():
    four, target = plans.stages_from_args(check.parse_args([]))
    receipt = type("R", (), {"body": {"phases": {"model": {"seconds": 30.0}, "server": {"seconds": 110.0}}}})()
    # the 1.7B's weights are under half the 4B's: half the 4B's start, plus its breakdown (two shapes)
    assert check.stage_need(receipt, target, four) == pytest.approx(0.5 * 140 + 10 + 25 * 2)
    assert check.stage_need(receipt, four, four) == pytest.approx(140 + plans.phase_need(four, "breakdown"))
