"""The embedded tiny Qwen3: shipped bytes that are the same on every machine, a recipe that repeats on one
machine, a usable ChatML tokenizer, pretrained weights that end their turns, a cheap install.

What the model does is checked on the shipped bytes (rlcli/assets/), never on a fresh build: a build on another
processor takes another path through float kernels. Builds here use the recipe with its pretraining cut to a few
steps (same code path): seed 0 built twice, once here and once by the CLI alongside, must give the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlcli import model
from rlcli.errors import RlcliError, UsageError
from rlcli.model import pretrain as model_pretrain
from rlcli.model import recipe as model_recipe

CHAT = [
    {"role": "user", "content": "What is 12 + 7?"},
    {"role": "assistant", "content": "19"},
]
# The shipped bytes, pinned here as well as in their record: swapping them must be a visible change.
SHIPPED_SHA256 = {
    "model.safetensors": "3a203b42503ce1c5195d60aa9424ed40c5266ff5ea4a7d1538f9e7c401d8f48a",
    "tokenizer.json": "56678273433d3bc064c133cd1b00b6dc6e3222ef4df0dabcaad51cc861885f75",
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


QUICK_STEPS = 10  # same code path as a full build, a fraction of the time


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped model as `serve start` finds it: installed into a fresh RLCLI_HOME."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCLI_HOME", str(tmp_path_factory.mktemp("home_shipped")))
        return model.ensure_embedded_model()


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Quick builds: seed 0 in two homes (here and by the CLI, at the same time), seed 1 via `build --output`."""
    import torch

    built: dict = {}
    home_b = tmp_path_factory.mktemp("home_b")
    env = {**os.environ, "RLCLI_HOME": str(home_b)}
    cli = subprocess.Popen([sys.executable, "-m", "rlcli.cli", "model", "build", "--steps", str(QUICK_STEPS)],
                           env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    threads = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as mp:
            home = tmp_path_factory.mktemp("home_a")
            mp.setenv("RLCLI_HOME", str(home))
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                assert model_recipe.build(model_recipe.BuildOptions(steps=QUICK_STEPS)) == 0
            built["a"] = home / "models" / f"{model.EMBEDDED_MODEL_NAME}-build"
            built["threads_after"] = (threads, torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
            out = tmp_path_factory.mktemp("explicit") / "seed1"
            stdout, stderr = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                assert model_recipe.build(model_recipe.BuildOptions(seed=1, output=str(out), steps=QUICK_STEPS)) == 0
            built["quick1"], built["quick1_stdout"], built["quick1_stderr"] = out, stdout.getvalue(), stderr.getvalue()
    finally:
        cli_out, cli_err = cli.communicate(timeout=600)
    assert cli.returncode == 0, cli_err
    built["b"], built["b_stdout"], built["b_stderr"] = Path(cli_out.splitlines()[0]), cli_out, cli_err
    return built


@pytest.fixture(scope="module")
def tokenizer(shipped: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(shipped)


def test_shipped_bytes_are_the_recorded_ones() -> None:
    """What every machine serves: the package's files, with the digests their record and this test pin."""
    record = model.shipped_record()
    folder = Path(str(model.shipped()))
    assert set(record["files"]) == {p.name for p in folder.iterdir()} - {model.MARKER}
    for name, digest in record["files"].items():
        assert _sha(folder / name) == digest, name
    for name, digest in SHIPPED_SHA256.items():
        assert record["files"][name] == digest, name


def test_install_copies_the_shipped_bytes_and_repairs_a_damaged_copy(shipped: Path) -> None:
    assert {p.name: _sha(p) for p in shipped.iterdir() if p.name != model.MARKER} == model.shipped_record()["files"]
    assert model.describe(shipped) == model.shipped_record()
    (shipped / "model.safetensors").write_bytes(b"damaged")
    home = shipped.parent.parent
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLCLI_HOME", str(home))
        assert model.ensure_embedded_model() == shipped
    assert _sha(shipped / "model.safetensors") == SHIPPED_SHA256["model.safetensors"]


def test_second_install_reads_only_and_imports_no_torch(shipped: Path) -> None:
    """Once installed, `serve start` only checks digests: no torch import, no file rewritten, nothing printed."""
    before = {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()}
    probe = ("import sys; from rlcli.model import ensure_embedded_model as e; print(e()); "
             "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'")
    env = {**os.environ, "RLCLI_HOME": str(shipped.parent.parent)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(shipped) and done.stderr == ""
    assert {p.name: p.stat().st_mtime_ns for p in shipped.iterdir()} == before


def test_install_command_prints_the_folder(tmp_path: Path) -> None:
    env = {**os.environ, "RLCLI_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "rlcli.cli", "model", "install"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(tmp_path / "models" / model.EMBEDDED_MODEL_NAME)
    assert "1,049,984 params, vocab 2048, 4 layers" in lines[1] and "installing" in done.stderr
    assert Path(lines[0]).stat().st_mode & 0o077 == 0  # the user's folder, like the rest of RLCLI_HOME


def test_a_damaged_package_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "pkg"
    shutil.copytree(Path(str(model.shipped())), fake)
    (fake / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(model, "shipped", lambda: fake)
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path / "home"))
    with pytest.raises(RlcliError, match="tokenizer.json does not match its recorded sha256"):
        model.ensure_embedded_model()
    assert not (tmp_path / "home" / "models" / model.EMBEDDED_MODEL_NAME).exists()


def test_the_model_was_kept_away_from_train_rls_heldout_problems() -> None:
    """The record names the sums no pretraining chat showed; train rl's held-out draw must stay inside them.

    Pinned by value: a change to the draw (seed, size, range) fails here, and then the shipped model must be
    rebuilt against the new set (else it would be evaluated on sums it was trained on)."""
    from rlcli.problems.heldout import ARITHMETIC_EVAL_MAX, arithmetic_eval_pairs

    draw = arithmetic_eval_pairs(ARITHMETIC_EVAL_MAX)
    assert draw[:6] == [(61, 32), (81, 35), (70, 33), (80, 83), (94, 55), (16, 68)]
    assert len(draw) == 1000
    record = model.shipped_record()["kept_away"]
    assert model_pretrain.kept_away() == record
    assert all(model_pretrain.is_heldout(x, y) for x, y in draw if max(x, y) >= 10)
    assert record["first"] == [[0, 15], [0, 16], [0, 21], [0, 25], [0, 26]]


def test_build_compares_its_bytes_with_the_shipped_ones(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(Path(str(model.shipped())), copy)
    assert model_recipe.compare_with_shipped(copy) == (
        True, f"the bytes match the shipped {model.EMBEDDED_MODEL_NAME}, file for file")
    record = model.describe(copy)
    record["files"]["model.safetensors"] = "0" * 64
    record["built_on"]["cpu"] = "Some Other CPU"
    (copy / model.MARKER).write_text(json.dumps(record))
    same, text = model_recipe.compare_with_shipped(copy)
    assert not same and "in model.safetensors." in text and "float kernels differ between CPU models" in text
    assert "Some Other CPU" in text and "AMD" not in text.split("this build:")[1]


@pytest.mark.slow  # quick builds (module fixture `homes`)
def test_same_seed_same_bytes_other_seed_differs(homes: dict) -> None:
    a, b, q1 = homes["a"], homes["b"], homes["quick1"]
    assert b.name == f"{model.EMBEDDED_MODEL_NAME}-build" and b.parent != a.parent
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert _sha(a / "model.safetensors") != _sha(q1 / "model.safetensors")
    # The pretraining is in the bytes: a 10-step build is not the shipped 1,000-step one.
    assert _sha(a / "model.safetensors") != SHIPPED_SHA256["model.safetensors"]
    # The tokenizer depends on neither seed nor steps nor CPU: every build shares the shipped one.
    assert _sha(q1 / "tokenizer.json") == SHIPPED_SHA256["tokenizer.json"]
    info = model.describe(a)
    assert info["files"]["model.safetensors"] == _sha(a / "model.safetensors") and info["seed"] == 0
    assert model.describe(q1)["seed"] == 1
    assert homes["quick1_stdout"].splitlines()[0] == str(q1)
    assert "1,049,984 params, vocab 2048, 4 layers" in homes["quick1_stdout"]
    assert "not the shipped model's settings" in homes["b_stdout"]


@pytest.mark.slow  # quick builds (module fixture `homes`)
def test_build_restores_torch_settings(homes: dict) -> None:
    before, after, deterministic = homes["threads_after"]
    assert after == before and deterministic is False


@pytest.mark.slow  # quick builds (module fixture `homes`)
def test_build_records_its_pretraining(homes: dict) -> None:
    info = model.describe(homes["a"])
    assert info["build_version"] == model_recipe.BUILD_VERSION and info["kept_away"] == model_pretrain.kept_away()
    assert info["pretraining"]["steps"] == QUICK_STEPS and info["built_on"]["cpu"] == model_recipe.cpu_name()
    # Progress lines go to stderr.
    assert f"pretraining step {QUICK_STEPS}/{QUICK_STEPS}" in homes["b_stderr"]
    assert f"pretraining step {QUICK_STEPS}/{QUICK_STEPS}" in homes["quick1_stderr"]


def test_shipped_record_describes_its_pretraining() -> None:
    info = model.shipped_record()
    pre = info["pretraining"]
    assert pre["steps"] == model_pretrain.STEPS and pre["threads"] == model_pretrain.THREADS
    assert 0 < pre["final_loss"] < 1.5 and 0 < pre["heldout_reply_loss"] < 3
    accuracy = pre["arithmetic_accuracy"]
    assert set(accuracy) == {"one_digit", "one_digit_bare_share", "two_digit_heldout", "demo_heldout"}
    assert accuracy["one_digit"] >= 0.25 and accuracy["two_digit_heldout"] < 0.9
    # Both habits are there for RL to choose between: bare sums and wordy ones.
    assert 0.1 <= accuracy["one_digit_bare_share"] <= 0.95
    assert pre["heldout_problems"] == len(model_pretrain.heldout_pairs())


def test_pretrained_model_ends_its_turn_and_knows_chats(shipped: Path, tokenizer) -> None:
    """Format learned: a held-out prompt gets a reply closed by <|im_end|>; held-out replies are likely."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(shipped).eval()
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
    assert loss < 3 < math.log(model_recipe.VOCAB_SIZE)  # random weights: ~7.6 nats (ln 2048)
    assert loss == pytest.approx(model.describe(shipped)["pretraining"]["heldout_reply_loss"], abs=1e-3)


def test_recipe_tokenizer_is_the_shipped_one(tmp_path: Path, shipped: Path) -> None:
    """The tokenizer the recipe trains is byte for byte the shipped one (no weights: fast)."""
    model_recipe._train_tokenizer().save_pretrained(tmp_path, save_jinja_files=False)
    assert _sha(tmp_path / "tokenizer.json") == SHIPPED_SHA256["tokenizer.json"]


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
    for token in model_recipe.SPECIAL_TOKENS + model_recipe.TAG_TOKENS:
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert len(tokenizer) == model_recipe.VOCAB_SIZE


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


def test_loads_in_transformers_and_runs(shipped: Path, tokenizer) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(shipped)
    assert type(lm).__name__ == "Qwen3ForCausalLM" and lm.dtype == torch.float32
    params = sum(p.numel() for p in lm.parameters())
    assert 1_000_000 <= params <= 2_000_000 and params == model.describe(shipped)["params"]
    ids = tokenizer.apply_chat_template(CHAT, return_dict=False)
    with torch.no_grad():
        logits = lm(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), lm.config.vocab_size) and torch.isfinite(logits).all()


def test_refuses_to_overwrite_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not an rlcli model folder"):
        model_recipe.build(model_recipe.BuildOptions(output=str(tmp_path)))
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
