"""Already-shaped conversations: role names, LangChain and ShareGPT forms; and dataset validation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from rlcli.data.importers import from_messages
from rlcli.data.messages import Options, convert_message, finalize
from rlcli.errors import UsageError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "import"


def one(record, **flags):
    parts: Counter[str] = Counter()
    result = from_messages(record, parts)
    if isinstance(result, dict):
        result = finalize(result, Options(**flags))
    return result, parts


def lc(cls, **kwargs):
    return {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", cls], "kwargs": kwargs}


@pytest.mark.parametrize(
    ("given", "role"),
    [("human", "user"), ("ai", "assistant"), ("model", "assistant"), ("developer", "system"), ("gpt", "assistant")],
)
def test_role_names_are_normalized(given, role):
    msgs = [{"role": "user", "content": "q"}, {"role": given, "content": "x"}, {"role": "assistant", "content": "a"}]
    conv, _ = one({"messages": msgs})
    assert role in [m["role"] for m in conv["messages"]]


def test_bare_list_and_sharegpt():
    assert one([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])[0]["messages"][1] == {
        "role": "assistant",
        "content": "a",
    }
    sharegpt = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}
    assert one(sharegpt)[0] == {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}


def test_langchain_serialized_messages_with_tool_calls():
    record = {
        "messages": [
            lc("SystemMessage", content="sys"),
            lc("HumanMessage", content="weather?"),
            lc("AIMessage", content="", tool_calls=[{"name": "wx", "args": {"city": "Oslo"}, "id": "c1"}]),
            lc("ToolMessage", content="-3C", tool_call_id="c1", name="wx"),
            lc("AIMessageChunk", content="Cold: -3C.", additional_kwargs={"reasoning_content": "read tool"}),
        ]
    }
    conv, _ = one(record)
    assert conv["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "wx", "arguments": '{"city":"Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "-3C", "name": "wx"},
        {"role": "assistant", "content": "Cold: -3C.", "reasoning": "read tool"},
    ]


def test_langchain_anthropic_blocks_and_tool_calls_are_not_doubled():
    block = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    ai = lc(
        "AIMessage",
        content=[{"type": "text", "text": "calling"}, block],
        tool_calls=[{"name": "f", "args": {}, "id": "t1", "type": "tool_call"}],
    )
    conv, _ = one({"messages": [lc("HumanMessage", content="go"), ai]})
    assert len(conv["messages"][1]["tool_calls"]) == 1


def test_langchain_dict_form_and_chat_message():
    record = {
        "messages": [
            {"type": "human", "data": {"content": "q", "type": "human"}},
            {"type": "chat", "data": {"content": "a", "role": "assistant"}},
        ]
    }
    assert one(record)[0]["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


@pytest.mark.parametrize(
    ("raw", "role"),
    [("User", "user"), ("MODEL", "assistant"), (" Assistant ", "assistant"), ("Bot", "assistant"),
     ("gpt", "assistant"), ("human", "user"), ("AI", "assistant"), ("developer", "system"), ("CHATBOT", "assistant"),
     ("ipython", "tool"), ("observation", "tool"), ("Function", "tool")],
)  # fmt: skip
def test_role_names_are_matched_without_case_and_aliases_map_to_the_four_roles(raw, role):
    msg = {"role": raw, "content": "x", **({"tool_call_id": "c"} if role == "tool" else {})}
    assert convert_message(msg, Counter())[0]["role"] == role


def test_unmapped_roles_are_counted_by_name_and_odd_names_are_made_safe():
    assert one({"messages": [{"role": "Narrator", "content": "x"}]})[0] == "unknown_role:Narrator"
    assert one({"messages": [{"role": "a b\nc" * 9, "content": "x"}]})[0] == "unknown_role:" + ("a?b?c" * 9)[:24]
    assert one({"messages": [{"role": 7, "content": "x"}]})[0] == "unknown_role"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        ({"messages": [{"role": "narrator", "content": "x"}]}, "unknown_role:narrator"),
        ({"messages": [lc("MysteryMessage", content="x")]}, "unknown_role"),
        ({"messages": []}, "empty"),
        ({"text": "just text"}, "unrecognized"),
        ({"messages": [{"role": "assistant", "content": "a"}]}, "no_prompt"),
        (
            {
                "messages": [
                    {"role": "user", "content": {"type": "text", "text": "one block, not a list"}},
                    {"role": "assistant", "content": "a"},
                ]
            },
            "written",
        ),
        ({"messages": [{"role": "user", "content": 42}, {"role": "assistant", "content": "a"}]}, "bad_message"),
    ],
)
def test_drop_reasons(record, reason):
    result, _ = one(record)
    assert (result if isinstance(result, str) else "written") == reason


def test_consecutive_same_role_turns_merge_but_tool_results_stay_apart():
    record = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "1", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "2", "function": {"name": "g", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "1", "content": "x"},
            {"role": "tool", "tool_call_id": "2", "content": ""},
            {"role": "assistant", "content": "done"},
        ]
    }
    roles = [m["role"] for m in one(record)[0]["messages"]]
    assert roles == ["user", "assistant", "tool", "tool", "assistant"]


def test_fixture_file_outcomes():
    outcomes = Counter()
    for line in (FIXTURES / "messages.jsonl").read_text().splitlines():
        result, _ = one(json.loads(line))
        outcomes[result if isinstance(result, str) else "written"] += 1
    assert outcomes == Counter({"written": 6, "unknown_role:narrator": 1, "empty": 1})


# ---- what `train sl` checks before it loads a model ----


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "not valid JSON"),
        ('{"text": "x"}', '{"messages": [...]}'),
        ('{"messages": []}', "empty"),
        ('{"messages": [{"role": "bot", "content": "x"}]}', "role 'bot'"),
        ('{"messages": [{"role": "user", "content": "q"}]}', "no assistant message"),
        ('{"messages": [{"role": "user"}, {"role": "assistant", "content": "a"}]}', "no content"),
        (
            '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",'
            ' "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]}',
            "tool call",
        ),
    ],
)
def test_train_sl_names_the_first_bad_line(line, says):
    from rlcli.train.sl import parse_dataset

    good = '{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}]}'
    with pytest.raises(UsageError, match=r"f line 4: .*" + says.replace("[", r"\[").replace("]", r"\]")) as err:
        parse_dataset(iter([good, "", good, line, "{bad"]), "f")
    assert "\n" not in str(err.value)


def test_every_fixture_output_loads_as_one_arrow_table():
    """FromConversationFileBuilder loads rows with datasets.Dataset.from_list: one Arrow schema for all."""
    pa = pytest.importorskip("pyarrow")
    from rlcli.data import traces
    from rlcli.data.import_cmd import Run, langsmith
    from rlcli.data.importers import IMPORTERS

    rows: list[bytes] = []
    for fmt in ("openai", "anthropic", "messages"):
        Run().stream((FIXTURES / f"{fmt}.jsonl").read_bytes().splitlines(), IMPORTERS[fmt], rows.append)
    langsmith(Run(), (FIXTURES / "langsmith.jsonl").read_bytes().splitlines(), rows.append)
    Run().stream((FIXTURES / "responses.jsonl").read_bytes().splitlines(), IMPORTERS["openai"], rows.append)
    Run().stream((FIXTURES / "gemini.jsonl").read_bytes().splitlines(), IMPORTERS["gemini"], rows.append)
    run = Run()
    traces.stream(run, (FIXTURES / "otel.jsonl").read_bytes().splitlines(), run.emitter(rows.append))
    # Two tools whose schemas give the same field different types: fine as JSON-string parameters.
    clash = [
        {"type": "function", "function": {"name": "a", "parameters": {"default": 1}}},
        {"type": "function", "function": {"name": "b", "parameters": {"default": "x"}}},
    ]
    for tool in clash:
        messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        record = {"tools": [tool], "messages": messages}
        rows.append(json.dumps(finalize(from_messages(record, Counter()), Options())).encode())
    table = pa.Table.from_pylist([json.loads(r) for r in rows])
    assert table.num_rows == len(rows) == 3 + 6 + 4 + 6 + 7 + 4 + 6 + 2
