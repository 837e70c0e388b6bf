"""The recipe that made the embedded model's shipped bytes (`rlcli model build` runs it).

A byte-level BPE tokenizer trained on a corpus this module writes itself, a `Qwen3ForCausalLM` initialised
with `torch.manual_seed(seed)`, pretrained briefly on synthetic ChatML chats (rlcli/model/pretrain.py), saved
in Hugging Face format. Same machine, same seed: same bytes. Another processor may give other bytes (float
kernels differ between CPU models), so rlcli serves the bytes it ships (rlcli/model/__init__.py), not a fresh build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import random
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlcli.config import private_dir, rlcli_home
from rlcli.model import _locked, _stage, _summary, describe, shipped_record
from rlcli.options import SEED, Record, option

EMBEDDED_MODEL_NAME = "rlcli-tiny-qwen3-v1"
BUILD_VERSION = 2  # bump when the corpus, template, pretraining or architecture changes (and ship new bytes)
MARKER = "rlcli-model.json"  # the model's record: what it is, how it was made, the sha256 of each file

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen3 keeps these as plain (non-special) added tokens; single ids keep the qwen3 renderers' empty
# think block and tool tags short, and decoding still shows them.
TAG_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
VOCAB_SIZE = 2048
ARCH = dict(
    hidden_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
    # transformers' default 0.02 is sized for hidden sizes in the thousands; at 128 the pretraining
    # learned sums much more slowly from it (one-digit accuracy over seeds 0-3: 40-57%; 52-80% from 0.05).
    initializer_range=0.05,
)
# Qwen2/3's pre-tokenizer split: every digit is its own token, which is what lets a tiny model learn
# carries in "12 + 7 = 19"; words keep one leading space or punctuation mark.
_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML as Qwen3 writes it: tool results travel as a user turn wrapped in <tool_response>, and
# enable_thinking=false writes the empty think block on the produced (last) assistant turn and after
# the generation prompt, token for token what the qwen3_disable_thinking renderer emits.
CHAT_TEMPLATE = """{%- set no_think = enable_thinking is defined and enable_thinking is false -%}
{%- set think = '<think>\\n\\n</think>\\n\\n' -%}
{%- for message in messages -%}
{%- if message.content is string -%}{%- set content = message.content -%}
{%- elif message.content -%}{%- set content = message.content | selectattr('text', 'defined')
    | map(attribute='text') | join('') -%}
{%- else -%}{%- set content = '' -%}{%- endif -%}
{%- if message.role == 'tool' -%}
{{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' -}}
{%- else -%}
{%- set empty_think = no_think and loop.last and message.role == 'assistant' and '</think>' not in content -%}
{{- '<|im_start|>' + message.role + '\\n' + (think if empty_think else '') + content -}}
{%- for call in message.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{{- '\\n' if (content or not loop.first) else '' -}}
{{- '<tool_call>\\n{"name": "' + fn.name + '", "arguments": ' -}}
{{- (fn.arguments if fn.arguments is string else fn.arguments | tojson) + '}\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if no_think -%}{{- think -}}{%- endif -%}
{%- endif -%}"""

_WORDS = """
the be to of and a in that have it for not on with he as you do at this but his by from they we say
her she or an will my one all would there their what so up out if about who get which go me when make
can like time no just him know take people into year your good some could them see other than then now
look only come its over think also back after use two how our work first well way even new want because
any these give day most us is are was were has had did said made went got came number answer question
problem add plus minus times sum total result equal equals correct wrong right left true false yes
please thank thanks hello hi help sure okay sorry question answers step steps first second third next
last final value values list file files line lines code run test tests error errors output input data
model models train training learn learning reward rewards agent agents task tasks tool tools call calls
user users assistant system message messages chat reply response request server client command
function return name type string int float bool none null dict key keys word words text read write
open close start stop find show tell ask try keep let put set need mean feel leave seem turn hand part
place case point fact group world life home school state family student country city house world night
small large big little long short high low old young early late great same different important public
able bad best better sure free full whole real hard easy clear simple possible several many much more
less few each every both own such very still never always often again already here where why while
before between under around through during without within against among since until each another
water food money book story game music room door car road tree dog cat sun moon light color red blue
green black white one two three four five six seven eight nine ten hundred thousand zero half count
many math compute calculate solve check verify explain because therefore so thus example examples
minute hour week month today tomorrow yesterday morning evening name person man woman child children
friend friends team project idea ideas plan plans change changes move play live believe bring happen
begin began begun show shown build built send sent spend spent stand understand remember report
continue create follow learn lead understand watch stop speak read allow add grow offer walk win meet
include pay hear serve die send expect stay fall cut reach kill remain suggest raise pass sell require
decide pull explain hope develop carry break receive agree support hit produce eat cover catch draw
choose cause point listen realize place close note fill order print import class self def async await
"""
_PUNCT = [".", ",", "!", "?", ":", ";", " -", " (", ")", '"', "'", "...", " /", " *", " =", " +"]
_CODE = [
    "def add(x, y):\n    return x + y\n",
    'import json\nimport os\n\nprint(json.dumps({"a": 1, "b": [1, 2, 3]}))\n',
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
    "class Model:\n    def __init__(self, name: str) -> None:\n        self.name = name\n",
    "$ ls -la /tmp\n$ cd /work && cat README.md\n$ python -m pytest -q\n",
    '{"name": "bash", "arguments": {"command": "ls -la"}}',
    "x = [1, 2, 3]\ny = {k: v for k, v in zip(x, x)}\nassert len(y) == 3\n",
    'if __name__ == "__main__":\n    main()\n',
]


def _corpus(lines: int = 6000) -> Iterator[str]:
    """Text for the BPE trainer: words, arithmetic, chats and code, the same on every machine."""
    rng = random.Random(1234)  # fixed: the tokenizer does not depend on the model's seed
    words = list(dict.fromkeys(_WORDS.split()))
    yield from words
    yield from _CODE
    for _ in range(lines):
        x, y = rng.randint(0, 200), rng.randint(0, 200)
        sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        yield sentence[0].upper() + sentence[1:] + rng.choice(_PUNCT[:4])
        yield f"What is {x} + {y}?"
        yield f"{x} + {y} = {x + y}. The answer is {x + y}. \\boxed{{{x + y}}}"
        yield f"{x} - {y} = {x - y}, {x} * {y} = {x * y}{rng.choice(_PUNCT)}"
        yield (
            f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{sentence}?"
            f"<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n{x + y}<|im_end|>\n"
        )
        yield f"User: What is {x} + {y}?\n\nAssistant: {x + y}\n\n"
        yield rng.choice(_CODE)


def _train_tokenizer() -> Any:
    """A byte-level BPE tokenizer with ChatML special tokens, as a transformers fast tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(TAG_TOKENS),
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Specials and tags become single tokens after training; fed to the trainer they would only
    # waste merges on their pieces.
    cut = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS + TAG_TOKENS))
    tok.train_from_iterator((p for text in _corpus() for p in cut.split(text) if p), trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=ARCH["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file of a model folder but its record: what identifies the model."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != MARKER}


def cpu_name() -> str:
    """The processor's model name (the recipe's bytes depend on it), from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_into(folder: Path, seed: int, quiet: bool = True, steps: int | None = None) -> dict[str, Any]:
    """Write tokenizer, config and float32 weights into folder; return the record (rlcli-model.json)."""
    import tokenizers
    import torch
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rlcli.model.pretrain import STEPS, kept_away, pretrain

    tokenizer = _train_tokenizer()
    tokenizer.save_pretrained(folder, save_jinja_files=False)  # chat_template inside tokenizer_config
    # transformers 5 writes its own class name; this one loads in transformers 4 and 5 alike (vLLM too).
    tok_config_path = folder / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tok_config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False) + "\n")
    eos, bos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    # No pad_token_id on the model: it would zero <|endoftext|>'s (tied) embedding and freeze it.
    config = Qwen3Config(vocab_size=len(tokenizer), bos_token_id=bos, eos_token_id=eos, **ARCH)
    config.dtype = torch.float32
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    # Random weights never end a turn or answer in format (flat RL reward; a LoRA on them got the SFT
    # loss no lower than ~5.1 nats): a short full-model run on synthetic chats teaches both.
    pretraining = pretrain(model, tokenizer, seed, quiet, steps or STEPS)
    model.eval()
    model.generation_config.eos_token_id = [eos, bos]
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # the one progress line is ours
    try:
        model.save_pretrained(folder)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    return {
        "name": EMBEDDED_MODEL_NAME,
        "build_version": BUILD_VERSION,
        "seed": seed,
        "architecture": "Qwen3ForCausalLM",
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "files": file_digests(folder),
        "pretraining": pretraining,
        # Sums no training chat showed: `rlcli train rl --dataset arithmetic` evaluates on some of them.
        "kept_away": kept_away(),
        "built_with": {m.__name__: m.__version__ for m in (torch, transformers, tokenizers)},
        "built_on": {"cpu": cpu_name(), "machine": platform.machine()},
    }


# --- `rlcli model build` -------------------------------------------------------------------------


def _build(target: Path, seed: int, steps: int | None) -> None:
    def fill(staging: Path) -> None:
        # Nothing here should touch the network; if a library tries, fail fast instead of hanging.
        with _offline():
            info = build_into(staging, seed, quiet=False, steps=steps)
        (staging / MARKER).write_text(json.dumps(info, indent=2) + "\n")

    parent = private_dir(target.parent)
    with _locked(parent / f".{target.name}.lock"):
        _stage(parent, target, fill)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(dict.fromkeys(saved, "1"))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def compare_with_shipped(folder: Path) -> tuple[bool, str]:
    """Whether a build's bytes are the shipped ones, and a sentence that says so (and why they may not be)."""
    built = describe(folder)
    try:
        ship = shipped_record()
    except (OSError, ValueError):
        return False, "this rlcli ships no model to compare with"
    if (built["seed"], built["pretraining"]["steps"]) != (ship["seed"], ship["pretraining"]["steps"]):
        return False, (f"not the shipped model's settings (seed {ship['seed']}, {ship['pretraining']['steps']} "
                       "pretraining steps): nothing to compare")
    differ = sorted(n for n in set(built["files"]) | set(ship["files"])
                    if built["files"].get(n) != ship["files"].get(n))
    if not differ:
        return True, f"the bytes match the shipped {EMBEDDED_MODEL_NAME}, file for file"
    versions = ", ".join(f"{k} {v}" for k, v in built["built_with"].items())
    return False, (
        f"differs from the shipped {EMBEDDED_MODEL_NAME} in {', '.join(differ)}. Expected on another processor "
        f"or library version: float kernels differ between CPU models, so the pretraining takes another path "
        f"(shipped: built on {ship['built_on']['cpu']} with "
        f"{', '.join(f'{k} {v}' for k, v in ship['built_with'].items())}; this build: {built['built_on']['cpu']} "
        f"with {versions}). rlcli serves the shipped bytes either way."
    )


@dataclass(frozen=True, kw_only=True)
class BuildOptions(Record):
    """`rlcli model build`'s options."""

    seed: int = SEED(0)
    output: str | None = option(None, "build into this folder (default RLCLI_HOME/models/rlcli-tiny-qwen3-v1-build"
                                      "[-seedN])", short="-o")
    steps: int | None = option(None, "pretraining steps (default the shipped model's); fewer only to try the "
                                     "recipe quickly", low=1)


def build(o: BuildOptions) -> int:
    """Run the recipe that made the shipped model, then say whether the bytes it produced match the shipped ones."""
    seed, output, steps = o.seed, o.output, o.steps
    start = time.monotonic()
    suffix = "" if seed == 0 else f"-seed{seed}"
    target = (Path(output).expanduser().resolve() if output
              else rlcli_home() / "models" / f"{EMBEDDED_MODEL_NAME}-build{suffix}")
    print(f"rlcli: building {EMBEDDED_MODEL_NAME} (seed {seed}) in {target} ...", file=sys.stderr)
    _build(target, seed, steps)
    info = describe(target)
    print(target)
    print(f"{_summary(info)} ({time.monotonic() - start:.1f} s)")
    print(compare_with_shipped(target)[1])
    return 0
