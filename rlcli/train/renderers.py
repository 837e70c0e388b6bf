"""Which renderer and tokenizer a model gets, and a dry render of the data through them.

The cookbook knows renderers for the Hugging Face names it lists (`model_info`); a local model
folder (the embedded model, or weights a user saved) is chosen from its tokenizer: ChatML
special tokens mean the Qwen3 renderer with thinking off, anything else the plain `role_colon`.
Nothing heavy is imported at module level: `rlcli train sl --help` must stay fast.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

from rlcli.errors import UsageError

# The text-only renderers tinker-cookbook 0.5.5 builds by name (its get_renderer has no list to ask).
BUILTIN_RENDERERS = (
    "role_colon", "qwen3_disable_thinking", "qwen3", "qwen3_instruct", "qwen3_5", "qwen3_5_disable_thinking",
    "qwen3_8_disable_thinking", "llama3", "deepseekv3", "deepseekv3_thinking", "kimi_k2", "kimi_k25",
    "kimi_k25_disable_thinking", "nemotron3", "nemotron3_disable_thinking", "gpt_oss_no_sysprompt",
    "gpt_oss_low_reasoning", "gpt_oss_medium_reasoning", "gpt_oss_high_reasoning",
)  # fmt: skip
CHATML_RENDERER = "qwen3_disable_thinking"
PLAIN_RENDERER = "role_colon"
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "special_tokens_map.json", "added_tokens.json")
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def is_local_model(model: str) -> bool:
    return Path(model).expanduser().is_dir()


def go_offline() -> None:
    """A local model folder needs no hub: say so before transformers/datasets read these at import."""
    for var in _OFFLINE_VARS:
        os.environ[var] = "1"


def renderer_choices() -> str:
    return ", ".join(BUILTIN_RENDERERS)


def has_chatml_tokens(folder: Path) -> bool:
    """True when the folder's tokenizer files define <|im_start|> (read as text: no transformers import)."""
    for name in _TOKENIZER_FILES:
        path = folder / name
        if path.is_file() and "<|im_start|>" in path.read_text(errors="replace"):
            return True
    return False


def choose_renderer(model: str, explicit: str | None = None) -> str:
    """--renderer if given; else the cookbook's recommendation, or the folder's tokenizer for local models."""
    if explicit:
        return explicit
    if is_local_model(model):
        return CHATML_RENDERER if has_chatml_tokens(Path(model).expanduser()) else PLAIN_RENDERER
    from tinker_cookbook import model_info

    try:
        return model_info.get_recommended_renderer_name(model)
    except Exception as e:  # ConfigurationError, KeyError or ValueError: the cookbook does not know it
        raise UsageError(
            f"no renderer known for model {model!r}: pass --renderer NAME (one of: {renderer_choices()})"
        ) from e


def train_on_what(records: list[dict[str, Any]]) -> str:
    """Which tokens get loss: every assistant message (the cookbook's SFT default).

    With one assistant message per record, "last" marks the same tokens and spares a warning the
    cookbook logs for every example when the renderer lacks the extension property.
    """
    single = all(sum(m["role"] == "assistant" for m in r["messages"]) == 1 for r in records)
    return "last_assistant_message" if single else "all_assistant_messages"


class _Once(logging.Filter):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def warn_once() -> None:
    """The renderers log the same warning per example (thousands per run): keep the first of each."""
    base = logging.getLogger("tinker_cookbook.renderers.base")
    if not any(isinstance(f, _Once) for f in base.filters):
        base.addFilter(_Once())


def register_local_tokenizer(model: str) -> None:
    """Load a local folder's tokenizer for the cookbook without running code shipped in the folder.

    The cookbook's own loader passes trust_remote_code=True for folders and splits names at ':';
    a registered factory replaces both. Cached, because the cookbook asks once per example.
    """
    from tinker_cookbook import tokenizer_utils

    tokenizer_utils.register_tokenizer(model, functools.cache(functools.partial(_load_tokenizer, model)))


def cookbook_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat record's messages as the cookbook's renderers take them.

    rlcli's JSONL keeps OpenAI's shape: a tool call is a plain dict, and a table built from the records
    (the cookbook's Arrow dataset) gives every message every key, absent ones as None. The renderers
    want `ToolCall` objects and no None-valued keys, else a conversation with tool calls cannot be
    rendered at all.
    """
    from tinker_cookbook.renderers import ToolCall

    out = []
    for message in messages:
        clean = {k: v for k, v in message.items() if v is not None}
        if "tool_calls" in clean:
            clean["tool_calls"] = [c if isinstance(c, ToolCall) else ToolCall.model_validate(_tool_call(c))
                                   for c in clean["tool_calls"]]
            if not clean["tool_calls"]:
                del clean["tool_calls"]
        out.append(clean)
    return out


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if not isinstance(function.get("arguments", ""), str):
        function["arguments"] = json.dumps(function["arguments"], ensure_ascii=False)
    body = {"function": function}
    if call.get("id"):
        body["id"] = call["id"]
    return body


def _load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(Path(model).expanduser()), trust_remote_code=False)


def render_lengths(records: list[dict[str, Any]], model: str, renderer_name: str, max_length: int | None,
                   train_on: str, lines: list[int] | None = None) -> list[tuple[int, int]]:
    """(tokens, trained tokens) per record, rendered exactly as the cookbook's SFT dataset does.

    Run before any server compute, so a renderer that cannot handle this tokenizer (missing special
    tokens) or these messages fails here with the record's number, not mid-run.
    """
    from tinker_cookbook import renderers
    from tinker_cookbook.supervised.data import conversation_to_datum
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    warn_once()
    tokenizer = get_tokenizer(model)
    try:
        renderer = renderers.get_renderer(renderer_name, tokenizer)
    except Exception as e:  # RendererError: an unknown name, or a vision renderer without images
        why = "unknown" if renderer_name not in BUILTIN_RENDERERS else f"unusable here ({e})"
        raise UsageError(f"renderer {renderer_name!r} is {why}: pass --renderer NAME (one of: "
                         f"{renderer_choices()})") from e
    out = []
    lines = lines or list(range(1, len(records) + 1))
    for line, record in zip(lines, records, strict=False):
        try:
            datum = conversation_to_datum(cookbook_messages(record["messages"]), renderer, max_length,
                                          renderers.TrainOnWhat(train_on))
        except Exception as e:
            raise UsageError(f"line {line} cannot be rendered with renderer {renderer_name!r} "
                             f"({type(e).__name__}: {e}): try another --renderer") from e
        weights = datum.loss_fn_inputs["weights"].tolist()
        out.append((datum.model_input.length, sum(1 for w in weights if w > 0)))
    return out
