"""Weights out of the server: tinker CLI passthrough, sample, chat, export (peft and merged), doctor.

One LoRA is trained for a few steps per module and saved for the sampler and as training state; the
exports are then checked against the server's own logprobs on the same tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from rlcli.client import unload_model
from tests.conftest import run_rlcli

server_test = pytest.mark.server
LOGPROB_TOLERANCE = 1e-3  # absolute, per token; measured agreement is ~2e-6 (float32 on both sides)
TEXTS = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "2 + 3 = 5."}],
    [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello! How can I help you today?"}],
]


@dataclass
class Trained:
    service: Any
    tokenizer: Any
    run_id: str
    sampler_path: str  # as SkyRL returns it: tinker://RUN/ID
    state_path: str


@pytest.fixture(scope="module")
def trained(server):
    import tinker
    from transformers import AutoTokenizer

    from rlcli.demo import DEMO_CHATS, chat_datum

    tokenizer = AutoTokenizer.from_pretrained(server.model)
    service = tinker.ServiceClient(base_url=server.url, api_key="tml-test")
    trainer = service.create_lora_training_client(base_model=server.model, rank=8, seed=2).result()
    try:
        batch = [chat_datum(tokenizer, p, r) for p, r in DEMO_CHATS]
        for _ in range(3):
            trainer.forward_backward(batch, "cross_entropy")
            trainer.optim_step(tinker.AdamParams(learning_rate=1e-2))
        sampler_path = trainer.save_weights_for_sampler(name="wo-sampler").result().path
        state_path = trainer.save_state(name="wo-state").result().path
        yield Trained(service, tokenizer, trainer.model_id, sampler_path, state_path)
    finally:
        unload_model(server.url, trainer.model_id)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@server_test
def test_tinker_cli_passthrough(server, trained):
    wrong_env = dict(server.env, TINKER_BASE_URL="http://127.0.0.1:9")  # --base-url must win over it
    proc = run_rlcli("checkpoint", "list", "--run-id", trained.run_id, "--format", "json",
                     "--base-url", server.url, env=wrong_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ids = {c["checkpoint_id"] for c in json.loads(proc.stdout)["checkpoints"]}
    assert ids == {"wo-sampler", "wo-state"}
    proc = run_rlcli("checkpoint", "info", trained.sampler_path, env=server.env, timeout=120)  # managed server
    assert proc.returncode == 0 and "sampler" in proc.stdout, proc.stderr  # SkyRL's tinker://RUN/ID form

    bogus = run_rlcli("checkpoint", "bogus", env=server.env, timeout=120)
    assert bogus.returncode == 2 and "No such command" in bogus.stderr
    every = run_rlcli("checkpoint", "list", env=server.env, timeout=120)
    assert every.returncode == 1 and "--run-id" in _one_line(every.stderr)
    download = run_rlcli("checkpoint", "download", trained.sampler_path, env=server.env, timeout=120)
    assert download.returncode == 1 and "rlcli export" in _one_line(download.stderr)


@server_test
def test_sample_prints_completions(server, trained):
    proc = run_rlcli("sample", "--checkpoint", trained.sampler_path, "--prompt", "What is 2 + 3?",
                     "--max-tokens", "8", "--n", "2", "--temperature", "1.0", env=server.env, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("--- completion") == 2 and len(proc.stdout.strip().splitlines()) >= 4
    # The base model, with the same shapes (prompt, n, max tokens): the server compiled those above.
    base = run_rlcli("sample", "--prompt", "What is 2 + 3?", "--max-tokens", "8", "--n", "2", "--base-url",
                     server.url, env=server.env, timeout=180)
    assert base.returncode == 0 and base.stdout.strip(), base.stderr


@server_test
def test_chat_answers_each_piped_line(server, trained):
    path = trained.sampler_path.replace(f"{trained.run_id}/", f"{trained.run_id}/sampler_weights/")
    proc = run_rlcli("chat", "--checkpoint", path, "--max-tokens", "8", env=server.env, timeout=180,
                     input="hi\n\nWhat is 2 + 3?\n/exit\nnot read\n")
    assert proc.returncode == 0, proc.stderr
    assert sum(line.startswith("assistant: ") for line in proc.stdout.splitlines()) == 2, proc.stdout


def _hf_logprobs(model, ids: list[int]) -> list[float]:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def _max_gap(model, tokenizer, server_lp) -> float:
    gaps = []
    for messages in TEXTS:
        ids = tokenizer.encode(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)
        theirs = [x for x in server_lp(ids) if x is not None][-(len(ids) - 1):]  # SkyRL omits the first token's
        gaps += [abs(a - b) for a, b in zip(_hf_logprobs(model, ids), theirs, strict=True)]
    return max(gaps)


@server_test
def test_export_peft_and_merged_match_the_servers_logprobs(server, trained, tmp_path):
    import tinker
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for fmt in ("peft", "merged"):
        proc = run_rlcli("export", trained.sampler_path, "--format", fmt, "-o", str(tmp_path / fmt),
                         env=server.env, timeout=300)
        assert proc.returncode == 0 and proc.stdout.strip() == str(tmp_path / fmt), proc.stderr
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == server.model and len(config["target_modules"]) == 7

    sampler = trained.service.create_sampling_client(model_path=trained.sampler_path).result()

    def server_lp(ids):
        return sampler.compute_logprobs(tinker.ModelInput.from_ints(ids)).result()

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")  # the export carries the tokenizer
    adapter = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "peft").eval()  # finds the base by itself
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base = AutoModelForCausalLM.from_pretrained(server.model).eval()
    gaps = {name: _max_gap(m, tokenizer, server_lp) for name, m in
            (("peft", adapter), ("merged", merged), ("base", base))}
    print(f"max |logprob gap| vs the server: {gaps}")
    assert gaps["peft"] < LOGPROB_TOLERANCE and gaps["merged"] < LOGPROB_TOLERANCE, gaps
    assert gaps["base"] > 100 * LOGPROB_TOLERANCE, gaps  # the LoRA matters: the comparison is not vacuous


@server_test
def test_export_refuses_a_full_folder_and_training_checkpoints(server, trained, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    proc = run_rlcli("export", trained.sampler_path, "-o", str(tmp_path / "full"), env=server.env, timeout=120)
    assert proc.returncode == 2 and "--force" in _one_line(proc.stderr)
    proc = run_rlcli("export", trained.sampler_path, "-o", str(tmp_path / "full"), "--force", env=server.env,
                     timeout=120)
    assert proc.returncode == 0 and not (tmp_path / "full" / "keep.txt").exists(), proc.stderr
    proc = run_rlcli("export", trained.state_path, "-o", str(tmp_path / "t"), env=server.env, timeout=120)
    line = _one_line(proc.stderr)
    assert proc.returncode == 2 and "save_weights_for_sampler" in line and "sampler_weights" in line
    assert not (tmp_path / "t").exists()


@server_test
def test_sampling_an_unloaded_model_says_what_to_do(server):
    import tinker

    service = tinker.ServiceClient(base_url=server.url, api_key="tml-test")
    trainer = service.create_lora_training_client(base_model=server.model, rank=1, seed=0).result()
    try:
        path = trainer.save_weights_for_sampler(name="gone").result().path
    finally:
        unload_model(server.url, trainer.model_id)
    proc = run_rlcli("sample", "--checkpoint", path, "--prompt", "hi", "--max-tokens", "4", env=server.env,
                     timeout=180)
    line = _one_line(proc.stderr)
    assert proc.returncode == 1 and "not loaded" in line and "create_training_client_from_state" in line


@server_test
def test_sampling_a_finished_runs_checkpoint_reloads_it_from_its_training_state(server):
    """A run that saved state and sampler weights under one name can still be sampled after it unloads."""
    import tinker

    service = tinker.ServiceClient(base_url=server.url, api_key="tml-test")
    trainer = service.create_lora_training_client(base_model=server.model, rank=1, seed=0).result()
    try:
        trainer.save_state(name="back").result()
        path = trainer.save_weights_for_sampler(name="back").result().path
    finally:
        unload_model(server.url, trainer.model_id)
    proc = run_rlcli("sample", "--checkpoint", path, "--prompt", "hi", "--max-tokens", "4", env=server.env,
                     timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "serving it again" in proc.stderr  # it did reload, rather than sample something else


@server_test
def test_doctor_against_the_live_server(server):
    proc = run_rlcli("doctor", "--base-url", server.url, env=server.env, timeout=60)
    lines = proc.stdout.strip().splitlines()
    names = [line.split()[1] for line in lines[:-1]]
    assert names == ["client-python", "server-python", "tinker-pins", "server-venv", "manifest", "server", "api-key",
                     "database", "backend", "cuda", "processes", "docker", "disk", "memory", "map-count"], proc.stdout
    assert lines[4].startswith("ok    manifest") and lines[5].startswith("ok    server"), proc.stdout
    assert lines[8].startswith("ok    backend"), proc.stdout
    # this server checks no keys and keeps sqlite
    assert lines[6].startswith("ok    api-key") and lines[7].startswith("ok    database"), proc.stdout
    failed = [line.split()[1] for line in lines[:-1] if line.startswith("fail")]
    assert proc.returncode == (1 if failed else 0) and all(name in lines[-1] for name in failed), proc.stdout
