"""Property: every input record is accounted for, whatever the mix of good, bad and odd lines.

read == written + attached feedback + sum(dropped), nothing raises but a UsageError, and every
written line is a conversation `train sl` accepts.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlcli.data.import_cmd import Run, langsmith
from rlcli.data.importers import IMPORTERS
from rlcli.data.messages import Options
from rlcli.data.validate import conversation_problem

# Keys and words the importers look for, so that random records reach deep into their code.
KEYS = (
    "role content messages choices message request response type text tool_calls function name arguments id "
    "system run_type inputs outputs generations generation_info run_id key score lc kwargs data tool_use_id "
    "input output body error status_code finish_reason stop_reason prompts from value tool_call_id thinking "
    "refusal additional_kwargs extra invocation_params tools"
).split()
WORDS = (
    "user assistant system tool developer human ai model wizard text tool_use tool_result thinking "
    "redacted_thinking image_url llm chain message constructor HumanMessage AIMessage length max_tokens stop "
    "a@b.co { ["
).split() + ["sk-" + "x" * 24]

leaf = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=6) | st.sampled_from(WORDS)
odd = st.recursive(
    leaf,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.sampled_from(KEYS), kids, max_size=4),
    max_leaves=14,
)

part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=8)}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "image", "input_audio", "redacted_thinking"])}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": st.text(max_size=8)}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": st.sampled_from(["t1", "t2"]),
            "name": st.sampled_from(["f", ""]),
            "input": odd,
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_result"),
            "tool_use_id": st.just("t1"),
            "content": st.text(max_size=8) | st.lists(st.just({"type": "text", "text": "r"})),
        }
    ),
)
call = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["c1", "c2", ""]),
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": st.sampled_from(["f", "g"]), "arguments": st.text(max_size=8) | odd}
        ),
    }
)
# Mostly sound messages, so that plenty get written, with odd ones mixed in.
role = st.sampled_from(["user"] * 4 + ["assistant"] * 4 + ["system", "tool", "developer", "human", "ai", "wizard"])
message = st.fixed_dictionaries(
    {"role": role, "content": st.text(min_size=1, max_size=12) | st.none() | st.lists(part, max_size=3)},
    optional={
        "tool_calls": st.lists(call, max_size=2),
        "tool_call_id": st.just("c1"),
        "reasoning_content": st.text(max_size=6),
    },
)
messages = st.lists(message, max_size=5)
reply = message.map(lambda m: {**m, "role": "assistant"})
choices = st.lists(
    st.fixed_dictionaries({"message": reply, "finish_reason": st.sampled_from(["stop", "length"])}), max_size=2
)

words = st.text(st.characters(codec="utf-8"), min_size=1, max_size=10)
user = words.map(lambda t: {"role": "user", "content": t})
good = {
    "openai": st.builds(
        lambda u, a: {
            "request": {"messages": [u]},
            "response": {"choices": [{"message": {"role": "assistant", "content": a}}]},
        },
        user,
        words,
    ),
    "anthropic": st.builds(
        lambda u, a: {
            "request": {"messages": [u]},
            "response": {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "text", "text": a}],
                "stop_reason": "end_turn",
            },
        },
        user,
        words,
    ),
    "messages": st.builds(lambda u, a: {"messages": [u, {"role": "assistant", "content": a}]}, user, words),
    "langsmith": st.builds(
        lambda i, u, a: {
            "id": i,
            "run_type": "llm",
            "inputs": {"messages": [[u]]},
            "outputs": {"generations": [[{"text": a}]]},
        },
        st.sampled_from(["r1", "r2", "r3"]),
        user,
        words,
    ),
}
plausible = {
    "openai": st.one_of(
        st.builds(lambda m, c: {"messages": m, "choices": c}, messages, choices),
        st.builds(lambda m, c: {"request": {"messages": m}, "response": {"choices": c}}, messages, choices),
        st.builds(lambda m: {"model": "x", "messages": m}, messages),
    ),
    "anthropic": st.builds(
        lambda s, m, r, stop: {
            "request": {"system": s, "messages": m},
            "response": {"type": "message", "content": r, "stop_reason": stop},
        },
        st.none() | st.text(max_size=6),
        messages,
        st.lists(part, max_size=3),
        st.sampled_from(["end_turn", "max_tokens"]),
    ),
    "messages": st.one_of(messages.map(lambda m: {"messages": m}), messages),
    "langsmith": st.one_of(
        st.builds(
            lambda i, t, m, c: {"id": i, "run_type": t, "inputs": {"messages": [m]}, "outputs": {"choices": c}},
            st.sampled_from(["r1", "r2"]),
            st.sampled_from(["llm", "chain"]),
            messages,
            choices,
        ),
        st.builds(
            lambda i, s: {"run_id": i, "key": "k", "score": s},
            st.sampled_from(["r1", "r2", "r9"]),
            st.none() | st.floats(0, 1),
        ),
    ),
}


def lines_for(fmt: str):
    record = st.one_of(good[fmt], plausible[fmt], odd)
    line = st.one_of(
        record.map(lambda r: json.dumps(r).encode() + b"\n"),
        st.binary(max_size=12).map(lambda b: b.replace(b"\n", b" ") + b"\n"),  # mostly not JSON
        st.just(b"\n"),
    )
    return st.lists(line, max_size=12)


@pytest.mark.parametrize("fmt", sorted(IMPORTERS))
def test_every_record_is_written_or_counted(fmt):
    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(lines=lines_for(fmt), drop_tools=st.booleans(), redact=st.booleans(), min_score=st.none() | st.just(0.5))
    def check(lines, drop_tools, redact, min_score):
        out: list[bytes] = []
        run = Run(Options(drop_tools=drop_tools, redact=redact), skip_bad=True)
        if fmt == "langsmith":
            langsmith(run, lines, out.append, min_score)
        else:
            run.stream(lines, IMPORTERS[fmt], out.append)
        stats = run.stats
        assert stats.read == sum(1 for line in lines if not line.isspace())
        assert stats.read == stats.written + stats.attached + stats.dropped.total()
        assert stats.written == len(out)
        for line in out:
            conv = json.loads(line)
            assert conversation_problem(conv) is None, conv
            if drop_tools:
                assert all(m["role"] != "tool" and "tool_calls" not in m for m in conv["messages"])

    check()
