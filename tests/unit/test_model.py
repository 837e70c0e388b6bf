"""The embedded tiny Qwen3: reproducible bytes, a usable ChatML tokenizer, pretrained weights that end
their turns, a cheap cache.

Full builds (~75 s each, single-threaded) are the slow part (marked slow: `make test` runs them,
`make test-fast` does not): seed 0 is built twice, once here and once by the CLI in a subprocess running
alongside, so the bit-identity check costs one build's time on a 2-core machine. Other checks use
builds with the pretraining cut to a few steps, or the tokenizer alone.
"""

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

from rlcli import model, model_pretrain
from rlcli.errors import UsageError

CHAT = [
    {"role": "user", "content": "What is 12 + 7?"},
    {"role": "assistant", "content": "19"},
]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


QUICK_STEPS = 10  # same code path as a full build, a fraction of the time


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Seed 0 fully built in two homes (here and by the CLI); seeds 0 and 1 quickly built, 1 via `build`."""
    import torch

    built: dict = {}
    home_b = tmp_path_factory.mktemp("home_b")
    env = {**os.environ, "RLCLI_HOME": str(home_b)}
    cli = subprocess.Popen([sys.executable, "-m", "rlcli.cli", "model", "build"], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    threads = torch.get_num_threads()
    try:
        home = tmp_path_factory.mktemp("home_a")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RLCLI_HOME", str(home))
            built["a"] = model.ensure_embedded_model(seed=0, quiet=True)
        assert built["a"] == home / "models" / model.EMBEDDED_MODEL_NAME
        built["threads_after"] = (threads, torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(model_pretrain, "STEPS", QUICK_STEPS)
            home = tmp_path_factory.mktemp("home_quick")
            mp.setenv("RLCLI_HOME", str(home))
            built["quick0"] = model.ensure_embedded_model(seed=0, quiet=True)
            out = tmp_path_factory.mktemp("explicit") / "seed1"
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                assert model.build(seed=1, output=str(out)) == 0
            built["quick1"], built["quick1_stdout"], built["quick1_stderr"] = out, stdout.getvalue(), stderr.getvalue()
    finally:
        cli_out, cli_err = cli.communicate(timeout=600)
    assert cli.returncode == 0, cli_err
    built["b"] = Path(cli_out.splitlines()[0])
    built["b_stderr"] = cli_err
    return built


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tokenizer a build saves, as a build saves it (no weights: fast enough for `make test-fast`)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tokenizer")
    model._train_tokenizer().save_pretrained(folder, save_jinja_files=False)
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.slow  # full builds (module fixture `homes`)
def test_same_seed_same_bytes_other_seed_differs(homes: dict) -> None:
    a, b, q0, q1 = homes["a"], homes["b"], homes["quick0"], homes["quick1"]
    assert b.name == model.EMBEDDED_MODEL_NAME and b.parent != a.parent
    assert _sha(a / "model.safetensors") == _sha(b / "model.safetensors")
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert (a / "tokenizer_config.json").read_bytes() == (b / "tokenizer_config.json").read_bytes()
    assert (a / "config.json").read_bytes() == (b / "config.json").read_bytes()
    assert _sha(q0 / "model.safetensors") != _sha(q1 / "model.safetensors")
    assert _sha(a / "model.safetensors") != _sha(q0 / "model.safetensors")  # the pretraining is in the bytes
    # The tokenizer does not depend on the seed: checkpoints of any seed share it.
    assert (a / "tokenizer.json").read_bytes() == (q1 / "tokenizer.json").read_bytes()
    info = model.describe(a)
    assert info["weights_sha256"] == _sha(a / "model.safetensors") and info["seed"] == 0
    assert model.describe(q1)["seed"] == 1
    assert homes["quick1_stdout"].splitlines()[0] == str(q1)
    assert "1,049,984 params, vocab 2048, 4 layers" in homes["quick1_stdout"]


@pytest.mark.slow  # full builds (module fixture `homes`)
def test_build_restores_torch_settings(homes: dict) -> None:
    before, after, deterministic = homes["threads_after"]
    assert after == before and deterministic is False


@pytest.mark.slow  # full builds (module fixture `homes`)
def test_marker_records_the_pretraining(homes: dict) -> None:
    info = model.describe(homes["a"])
    assert info["build_version"] == model.BUILD_VERSION
    pre = info["pretraining"]
    assert pre["steps"] == model_pretrain.STEPS and pre["threads"] == model_pretrain.THREADS
    assert 0 < pre["seconds"] and 0 < pre["final_loss"] < 1.5 and 0 < pre["heldout_reply_loss"] < 3
    accuracy = pre["arithmetic_accuracy"]
    assert set(accuracy) == {"one_digit", "one_digit_bare_share", "two_digit_heldout", "demo_heldout"}
    # Loose: on another CPU the run ends elsewhere (seed 0 gave 53% here); a broken run gives ~9%.
    assert accuracy["one_digit"] >= 0.25 and accuracy["two_digit_heldout"] < 0.9
    # Both habits are there for RL to choose between: bare sums and wordy ones (seed 0: 55% bare, greedy).
    assert 0.1 <= accuracy["one_digit_bare_share"] <= 0.95
    assert pre["heldout_problems"] == len(model_pretrain.heldout_pairs())
    assert model.describe(homes["quick1"])["pretraining"]["steps"] == QUICK_STEPS
    # Progress lines go to stderr unless quiet.
    assert f"pretraining step 50/{model_pretrain.STEPS}" in homes["b_stderr"]
    assert f"pretraining step {QUICK_STEPS}/{QUICK_STEPS}" in homes["quick1_stderr"]


@pytest.mark.slow  # full builds (module fixture `homes`)
def test_pretrained_model_ends_its_turn_and_knows_chats(homes: dict, tokenizer) -> None:
    """Format learned: a held-out prompt gets a reply closed by <|im_end|>; held-out replies are likely."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(homes["a"]).eval()
    x, y = model_pretrain.heldout_pairs()[3]
    for messages in ([{"role": "user", "content": f"What is {x} + {y}?"}],
                     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        with torch.no_grad():
            out = lm.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
        reply = out[0, len(ids):].tolist()
        assert reply[-1] == tokenizer.eos_token_id, tokenizer.decode(reply)  # stopped at <|im_end|>
        assert len(reply) > 1 and "<think>" not in tokenizer.decode(reply)
    loss = model_pretrain.reply_loss(lm, tokenizer, model_pretrain.heldout_chats())
    assert loss < 3 < math.log(model.VOCAB_SIZE)  # random weights: ~7.6 nats (ln 2048)
    assert loss == pytest.approx(model.describe(homes["a"])["pretraining"]["heldout_reply_loss"], abs=1e-3)


def test_render_matches_the_chat_template(tokenizer) -> None:
    """The pretraining corpus is tokenized as the chat template (and so the renderers) tokenize chats."""
    kwargs = {"return_dict": False}
    for messages, think in ((model_pretrain.demo_chat(12, 7), False), (model_pretrain.cookbook_chat(37, 58), True),
                            ([{"role": "system", "content": "Be brief."}, *model_pretrain.demo_chat(3, 4)], False)):
        extra = {"enable_thinking": False} if think else {}
        tokens, weights = model_pretrain.render(tokenizer, messages, think)
        assert tokens == tokenizer.apply_chat_template(messages, **kwargs, **extra)
        prompt, _ = model_pretrain.render(tokenizer, messages[:-1], think, generation_prompt=True)
        assert prompt == tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, **kwargs, **extra)
        reply = [t for t, w in zip(tokens, weights, strict=True) if w == 1.0]
        assert tokenizer.decode(reply).endswith(messages[-1]["content"] + "<|im_end|>")


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


@pytest.mark.slow  # full builds (module fixture `homes`)
def test_loads_in_transformers_and_runs(homes: dict, tokenizer) -> None:
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


@pytest.mark.slow  # full builds (module fixture `homes`)
def test_second_call_is_fast_and_imports_no_torch(homes: dict) -> None:
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
