"""What the loop reads of one captured exchange and its feedback (rlcli.endpoint.capture.rows_for_loop)."""

from __future__ import annotations

from collections import Counter

from rlcli.endpoint.capture import DROPPED, rows_for_loop

ASK = [{"role": "user", "content": "Chest 512: how many coins?"}]


def openai_exchange(answer: str, finish: str) -> dict:
    return {"exchange": "chatcmpl-1", "api": "openai", "request": {"model": "champion", "messages": ASK},
            "response": {"id": "chatcmpl-1", "choices": [{"index": 0, "finish_reason": finish,
                                                          "message": {"role": "assistant", "content": answer}}]}}


def anthropic_exchange(answer: str, stop: str) -> dict:
    return {"exchange": "msg_1", "api": "anthropic", "request": {"model": "champion", "max_tokens": 8,
                                                                 "messages": ASK},
            "response": {"id": "msg_1", "type": "message", "role": "assistant", "stop_reason": stop,
                         "content": [{"type": "text", "text": answer}]}}


def test_a_cut_answer_without_a_correction_is_dropped_as_truncated():
    convs, pairs = rows_for_loop(openai_exchange("We start from 3, then", "length"), {"rating": -1}, Counter())
    assert convs == [{DROPPED: "truncated", "exchange": "chatcmpl-1"}] and pairs == []


def test_a_cut_answer_the_user_edited_is_trained_as_edited_and_rejected_in_the_pair():
    for exchange in (openai_exchange("We start from 3, then", "length"),
                     anthropic_exchange("We start from 3, then", "max_tokens")):
        convs, pairs = rows_for_loop(exchange, {"edited": "77"}, Counter())
        assert [m["content"] for m in convs[0]["messages"]] == [ASK[0]["content"], "77"]
        assert pairs[0]["chosen"]["content"] == "77"
        assert "We start from 3, then" in str(pairs[0]["rejected"]["content"])


def test_a_rating_scores_the_served_answer():
    convs, pairs = rows_for_loop(openai_exchange("77", "stop"), {"rating": 1}, Counter())
    assert convs[0]["score"] == 1.0 and convs[0]["messages"][-1]["content"] == "77" and pairs == []
