"""The SFT dataset builder: conversations with tool calls render, and batches come in the cookbook's order.

Uses the shipped model's tokenizer (a folder inside the package): no server, no model build.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli.model import shipped
from rlcli.train import renderers

REPO = Path(__file__).resolve().parents[2]
TOOLS_TRACE = REPO / "tests" / "fixtures" / "import" / "openai.jsonl"


@pytest.fixture(scope="module")
def tokenizer_folder():
    renderers.go_offline()
    folder = str(shipped())
    renderers.register_local_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> list[dict]:
    """rlcli import's output for the OpenAI fixture: it holds tool calls, tool results and plain chats."""
    out = subprocess.run([sys.executable, "-m", "rlcli.cli", "import", str(TOOLS_TRACE), "-f", "openai"],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert any(m.get("tool_calls") for r in records for m in r["messages"])  # the case under test
    return records


def builder(folder: str, path: Path, renderer: str, batch_size: int, cookbook: bool = False):
    from tinker_cookbook.renderers import TrainOnWhat
    from tinker_cookbook.supervised.data import FromConversationFileBuilder
    from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

    from rlcli.train.sl_data import ConversationFileBuilder

    common = ChatDatasetBuilderCommonConfig(model_name_for_tokenizer=folder, renderer_name=renderer,
                                            max_length=512, batch_size=batch_size,
                                            train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES)
    kind = FromConversationFileBuilder if cookbook else ConversationFileBuilder
    return kind(common_config=common, file_path=str(path), test_size=0)


@pytest.mark.parametrize("renderer", ["qwen3", "qwen3_disable_thinking"])
def test_tool_call_conversations_render_and_the_calls_are_trained(tokenizer_folder, imported, tmp_path, renderer):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in imported))
    train, test = builder(tokenizer_folder, path, renderer, batch_size=len(imported))()
    assert test is None
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    tok = get_tokenizer(tokenizer_folder)
    texts = [tok.decode(d.model_input.to_ints()) for d in train.get_batch(0)]
    assert len(texts) == len(imported)
    calls = [c for r in imported for m in r["messages"] for c in m.get("tool_calls") or []]
    for call in calls:  # every logged call is in the rendered tokens, as the renderer writes a call
        assert any(f'"name": "{call["function"]["name"]}"' in t and "<tool_call>" in t for t in texts)


def test_dry_render_takes_tool_calls(tokenizer_folder, imported):
    lengths = renderers.render_lengths(imported, tokenizer_folder, "qwen3", 512, "all_assistant_messages")
    assert len(lengths) == len(imported) and all(trained > 0 for _, trained in lengths)


def test_batches_come_in_the_cookbooks_order(tokenizer_folder, tmp_path):
    """Same shuffle as the cookbook's own builder: runs and resumes from before this builder see the same
    batches."""
    chats = [{"messages": [{"role": "user", "content": f"{i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]}
             for i in range(12)]
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in chats))
    ours = builder(tokenizer_folder, path, "qwen3_disable_thinking", 4)()[0]
    theirs = builder(tokenizer_folder, path, "qwen3_disable_thinking", 4, cookbook=True)()[0]
    for ds in (ours, theirs):
        ds.set_epoch(seed=1)
    for index in range(3):
        assert ([d.model_input.to_ints() for d in ours.get_batch(index)]
                == [d.model_input.to_ints() for d in theirs.get_batch(index)])
