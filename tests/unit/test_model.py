"""The embedded tiny Qwen3: reproducible bytes, a usable ChatML tokenizer, loadable weights, a cheap cache."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcli import model
from rlcli.errors import UsageError

CHAT = [
    {"role": "user", "content": "What is 12 + 7?"},
    {"role": "assistant", "content": "19"},
]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Seed 0 built in two separate homes; seed 1 built through `build(output=...)`."""
    built: dict[str, Path] = {}
    for name in ("a", "b"):
        home = tmp_path_factory.mktemp(f"home_{name}")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RLCLI_HOME", str(home))
            built[name] = model.ensure_embedded_model(seed=0, quiet=True)
        assert built[name] == home / "models" / model.EMBEDDED_MODEL_NAME
    out = tmp_path_factory.mktemp("explicit") / "seed1"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        assert model.build(seed=1, output=str(out)) == 0
    built["seed1"], built["seed1_stdout"] = out, stdout.getvalue()  # type: ignore[assignment]
    return built


@pytest.fixture(scope="module")
def tokenizer(homes: dict[str, Path]):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(homes["a"])


def test_same_seed_same_bytes_other_seed_differs(homes: dict[str, Path]) -> None:
    a, b, c = homes["a"], homes["b"], homes["seed1"]
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert (a / "tokenizer_config.json").read_bytes() == (b / "tokenizer_config.json").read_bytes()
    assert _sha(a / "model.safetensors") != _sha(c / "model.safetensors")
    # The tokenizer does not depend on the seed: checkpoints of any seed share it.
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()
    info = model.describe(a)
    assert info["weights_sha256"] == _sha(a / "model.safetensors") and info["seed"] == 0
    assert model.describe(c)["seed"] == 1
    assert homes["seed1_stdout"].splitlines()[0] == str(c)
    assert "1,049,984 params, vocab 2048, 4 layers" in homes["seed1_stdout"]


def test_special_tokens_are_single_ids(tokenizer) -> None:
    for token in model.SPECIAL_TOKENS + model.TAG_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert len(tokenizer) == model.VOCAB_SIZE


@settings(max_examples=200, deadline=None)
@given(text=st.text())
def test_byte_level_round_trip(tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_numbers_split_into_digits_and_words_merge(tokenizer) -> None:
    pieces = tokenizer.tokenize("What is 12 + 7? The answer is 19.")
    assert len(pieces) <= 16 and {"1", "2", "9"} <= {tokenizer.convert_tokens_to_string([p]) for p in pieces}


def test_chat_template_is_chatml(tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, CHAT[0]]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_tool = [*CHAT, {"role": "tool", "content": "ok"}]
    text = tokenizer.apply_chat_template(with_tool, tokenize=False)
    assert text.endswith("<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n")


def test_loads_in_transformers_and_runs(homes: dict[str, Path], tokenizer) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(homes["a"])
    assert type(lm).__name__ == "Qwen3ForCausalLM" and lm.dtype == torch.float32
    params = sum(p.numel() for p in lm.parameters())
    assert 1_000_000 <= params <= 2_000_000 and params == model.describe(homes["a"])["params"]
    ids = tokenizer.apply_chat_template(CHAT, return_dict=False)
    with torch.no_grad():
        logits = lm(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), lm.config.vocab_size) and torch.isfinite(logits).all()


def test_second_call_is_fast_and_imports_no_torch(homes: dict[str, Path]) -> None:
    probe = (
        "import sys, time; from rlcli.model import ensure_embedded_model as e; t = time.perf_counter(); "
        "p = e(); print(p, time.perf_counter() - t); assert 'torch' not in sys.modules, 'torch imported'"
    )
    env = {**os.environ, "RLCLI_HOME": str(homes["a"].parent.parent)}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    path, seconds = done.stdout.split()
    assert path == str(homes["a"]) and float(seconds) < 0.5 and "building" not in done.stderr
    assert time.monotonic() - start < 5


def test_refuses_to_overwrite_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not an rlcli model folder"):
        model.build(output=str(tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_cookbook_renderers_build_examples(tokenizer) -> None:
    from tinker_cookbook.renderers import get_renderer

    qwen = get_renderer("qwen3_disable_thinking", tokenizer)
    model_input, weights = qwen.build_supervised_example(CHAT)
    tokens = model_input.to_ints()
    assert len(tokens) == len(weights) and weights.sum() > 0
    trained = tokenizer.decode([t for t, w in zip(tokens, weights.tolist(), strict=True) if w > 0])
    assert trained == "19<|im_end|>"
    # The template with enable_thinking=False agrees with the renderer token for token.
    prompt = qwen.build_generation_prompt(CHAT[:1]).to_ints()
    kwargs = {"enable_thinking": False, "return_dict": False}
    assert prompt == tokenizer.apply_chat_template(CHAT[:1], add_generation_prompt=True, **kwargs)
    assert tokens + tokenizer.encode("\n") == tokenizer.apply_chat_template(CHAT, **kwargs)
    assert qwen.get_stop_sequences() == [tokenizer.eos_token_id]
    colon_input, colon_weights = get_renderer("role_colon", tokenizer).build_supervised_example(CHAT)
    assert colon_input.length == len(colon_weights) and colon_weights.sum() > 0
