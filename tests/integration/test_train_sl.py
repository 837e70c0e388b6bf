"""`rlcli train sl` against the real SkyRL server on CPU: it learns, saves, resumes and cleans up.

The embedded model's tied embeddings are random with rows of norm ~0.23 and the LoRA does not reach
them, so no logit can rise more than ~2.6 above the rest: from ln(2048) = 7.6 nats the loss can
fall to ~5.1 at best. "Falls by a clear margin" is therefore last < 0.8 x first (7.6 -> below 6.1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from rlcli.train.folder import MODELS_FILE, TEMP_PREFIX
from tests.conftest import REPO, popen_rlcli, run_rlcli

pytestmark = pytest.mark.server

FIXTURE = REPO / "tests" / "fixtures" / "sl_small.jsonl"
# 24 chats, batch 4: 6 steps per epoch. lr 5e-3 is what the tiny model's LoRA takes without diverging.
TRAIN = ["train", "sl", "--batch-size", "4", "--lr", "5e-3"]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def saved_state(run: Path) -> bool:
    """A complete checkpoints.jsonl line with a state_path (the file may be mid-write)."""
    path = run / "checkpoints.jsonl"
    text = path.read_text() if path.is_file() else ""
    return any('"state_path"' in line for line in text.splitlines(keepends=True) if line.endswith("\n"))


def leftovers(*folders: Path) -> list[Path]:
    return [p for folder in folders if folder.is_dir() for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


@pytest.fixture(scope="module")
def sft(server, tmp_path_factory):
    """One run from stdin: 8 epochs (48 steps), the final checkpoint only."""
    tmp = tmp_path_factory.mktemp("sl")
    env = dict(server.env, TMPDIR=str(tmp / "systmp"))
    (tmp / "systmp").mkdir()
    start = time.monotonic()
    proc = run_rlcli(*TRAIN, "--dataset", "-", "--epochs", "8", "--save-every", "0", "--log-path",
                     str(tmp / "run"), "--base-url", server.url, env=env, input=FIXTURE.read_text(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"sft run: {time.monotonic() - start:.1f}s")
    return tmp, proc


def test_sft_loss_falls(sft):
    tmp, proc = sft
    nll = [m["train_mean_nll"] for m in rows(tmp / "run" / "metrics.jsonl")]
    print(f"train_mean_nll first {nll[0]:.4f} last {nll[-1]:.4f} ratio {nll[-1] / nll[0]:.3f}")
    assert len(nll) == 48
    assert nll[-1] < 0.8 * nll[0]
    steps = [line for line in proc.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) == 48 and steps[-1].startswith("step 48/48") and "tok/s" in steps[-1]


def test_sft_reports_checkpoint_and_sample_command(sft):
    tmp, proc = sft
    final = rows(tmp / "run" / "checkpoints.jsonl")[-1]
    assert final["name"] == "final" and final["sampler_path"].startswith("tinker://") and final["state_path"]
    assert f"rlcli sample --checkpoint {final['sampler_path']}" in proc.stdout


def test_sft_frees_its_slot_and_leaves_no_data_copy(server, sft):
    tmp, _ = sft
    assert (tmp / "run" / MODELS_FILE).read_text() == ""
    assert leftovers(server.home / "tmp", tmp / "systmp", Path(tempfile.gettempdir())) == []


def test_sampling_from_the_final_checkpoint(server, sft, monkeypatch):
    """SkyRL samples a sampler checkpoint only while its model is loaded, and the run unloaded it:
    load the final state into a new LoRA, save it for the sampler, sample, unload."""
    import tinker

    from rlcli.client import unload_models

    tmp, _ = sft
    final = rows(tmp / "run" / "checkpoints.jsonl")[-1]
    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    service = tinker.ServiceClient(base_url=server.url)
    trainer = service.create_training_client_from_state(final["state_path"]).result()
    try:
        sampler = trainer.save_weights_and_get_sampling_client().result()
        result = sampler.sample(prompt=tinker.ModelInput.from_ints([1, 2, 3]), num_samples=1,
                                sampling_params=tinker.SamplingParams(max_tokens=8, temperature=0.0)).result()
        assert len(result.sequences[0].tokens) > 0
    finally:
        assert unload_models(server.url, [trainer.model_id]) == []


def test_resume_continues_from_the_last_checkpoint(server, tmp_path):
    """SIGKILL after the first checkpoint, then --resume: the run ends with each step logged once.
    (tests/faults/test_trainer_killed.py shows such a resume ends with the uninterrupted run's weights.)"""
    run = tmp_path / "run"
    args = [*TRAIN, "--dataset", str(FIXTURE), "--epochs", "2", "--max-steps", "8", "--save-every", "2",
            "--log-path", str(run), "--base-url", server.url]
    crashed = popen_rlcli(*args, env=server.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not saved_state(run):
            assert crashed.poll() is None and time.monotonic() < deadline, "no checkpoint before the kill"
            time.sleep(0.2)
    finally:
        os.kill(crashed.pid, signal.SIGKILL)
        crashed.wait()
    assert (run / MODELS_FILE).read_text().strip(), "the killed run's model should be on record"

    refused = run_rlcli(*args, env=server.env, timeout=60)  # the folder exists: never overwritten silently
    assert refused.returncode == 2 and "--resume" in refused.stderr

    resumed = run_rlcli(*args, "--resume", env=server.env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # From that checkpoint, or from the start if the kill came before the checkpoint's step had its row.
    assert f"resuming {run} from " in resumed.stderr
    assert [m["step"] for m in rows(run / "metrics.jsonl")] == list(range(8))
    assert rows(run / "checkpoints.jsonl")[-1]["name"] == "final"
    assert (run / MODELS_FILE).read_text() == ""  # the crashed attempt's slot and the resumed one's: both freed


def test_imported_tool_calls_train(server, tmp_path):
    """Logged tool calls (OpenAI shape, as `rlcli import` writes them) go through a real SFT step."""
    imported = run_rlcli("import", str(REPO / "tests" / "fixtures" / "import" / "openai.jsonl"), "-f", "openai",
                         check=True).stdout
    assert '"tool_calls"' in imported
    proc = run_rlcli(*TRAIN, "--dataset", "-", "--batch-size", "2", "--max-steps", "2", "--save-every", "0",
                     "--renderer", "qwen3", "--log-path", str(tmp_path / "run"), "--base-url", server.url,
                     env=server.env, input=imported, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = [r for r in rows(tmp_path / "run" / "metrics.jsonl") if "train_mean_nll" in r]
    assert len(steps) == 2 and all(r["train_mean_nll"] > 0 for r in steps)


def test_held_out_nll_is_measured_on_skyrls_prompt_logprobs(server, tmp_path):
    """tinker-cookbook 0.5.8 scores --test-size through a sampling client (SamplerNLLEvaluator, compute_logprobs):
    SkyRL's N-1 answer reaches it in hosted Tinker's shape (hooks.hosted_prompt_logprobs), so the run ends with a
    test NLL per eval step, of the size of the training loss on the same chats."""
    proc = run_rlcli(*TRAIN, "--dataset", str(FIXTURE), "--test-size", "4", "--eval-every", "2", "--max-steps", "3",
                     "--save-every", "0", "--log-path", str(tmp_path / "run"), "--base-url", server.url,
                     env=server.env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows_ = rows(tmp_path / "run" / "metrics.jsonl")
    tested = [r for r in rows_ if "test/nll" in r]
    train = [r["train_mean_nll"] for r in rows_ if "train_mean_nll" in r]
    assert len(tested) == 2 and len(train) == 3, rows_  # eval before steps 1 and 3
    assert all(0 < r["test/nll"] < 3 * max(train) for r in tested), (tested, train)
    assert "test_nll" in proc.stderr
