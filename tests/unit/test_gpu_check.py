"""benchmarks/gpu/: the GPU check's plan and arguments, its server-venv stand-in, its float64 per-token reference,
and the carried wheel set (pinned once each, never the image's CUDA builds, complete when downloaded)."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks.gpu import gpu_check as check
from benchmarks.gpu import wheelset
from rlcli.server import server_venv
from rlcli.train.losses import gspo_reference


def test_the_default_plan_is_qwen3_1_7b_in_bf16_sized_for_the_main_server():
    plan = check.plan_from_args(check.parse_args([]))
    assert plan.size == "1.7b" and plan.dtype == "bfloat16"
    assert {k: plan.arch[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                      "num_key_value_heads", "head_dim", "intermediate_size")} == {
        "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "intermediate_size": 6144}
    assert plan.arch["tie_word_embeddings"] is True
    # bench_loss holds three LoRA clients at once, and SkyRL keeps slot 0 for itself
    assert plan.main_slots >= 4 and all(s >= 2 for s in plan.slots)
    assert plan.budget_s < 540  # leaves a margin under a 10-minute limit for the phase that is running


def test_arguments_override_the_plan():
    args = check.parse_args(["--size", "tiny", "--pairs", "2", "--slots", "16,2", "--run-steps", "0",
                             "--budget-s", "100", "--dtype", "float32"])
    plan = check.plan_from_args(args)
    assert (plan.bench.pairs, plan.slots, plan.run_steps, plan.budget_s, plan.dtype) == (2, (16, 2), 0, 100, "float32")
    assert check.plan_from_args(check.parse_args(["--slots", ""])).slots == ()
    with pytest.raises(SystemExit, match="at least 2"):
        check.parse_slots("8,1")


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
    tokens = check.per_token_reference(lp, old, adv, weights, low, high)
    loss = np.mean([t.sum() / w.sum() for t, w in zip(tokens, weights, strict=True)])
    want, _ = gspo_reference(*(check.padded(x) for x in (lp, old, adv, weights)), 1 - low, high - 1)
    assert loss == pytest.approx(want, abs=1e-12)


def test_compile_times_are_read_from_wrapped_log_lines(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO - skyrl: JIT compilation for train seq_len=96 took\n   12.50s\n"
                   "INFO - skyrl: JIT compilation for sample seq_len=64 took 30.25s\n")
    assert check.compile_times(log) == [{"mode": "train", "seq_len": 96, "s": 12.5},
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
