"""Every served exchange and its feedback, recorded in tinker-cookbook's capture store, and read back for the loop.

The store (`tinker_cookbook.capture.store`: a sqlite file behind a loopback daemon) holds two kinds of rows.
Its token rows come from the cookbook's instrumented tinker SDK (one per sampled sequence: prompt tokens,
sampled tokens, logprobs, tagged with the exchange id). rlcli adds annotations on the same cursor, one per
exchange (kind `rlcli.exchange`: the request and the response as the API shapes them, after redaction when on,
the answering weights, the token record of each choice) and one per feedback (kind `rlcli.feedback`).

`drain` is the loop's reader: the annotations after a cursor become one JSONL file of conversations in the
loop's folder (rlcli's messages shape; a rating becomes the conversation's `score`, a preferred or edited answer
a preference pair in a sibling `.pairs.jsonl`), and the cursor moves only after the file is written. The file's
name is its cursor range, so a drain repeated after a crash writes the same file again (the ledger takes a
file's content once): nothing is read twice, nothing is skipped.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from rlcli.config import private_dir
from rlcli.endpoint import retention
from rlcli.errors import UsageError

RUN = retention.RUN  # the store's run every exchange of rlcli's endpoints is recorded under
EXCHANGE, FEEDBACK = "rlcli.exchange", "rlcli.feedback"
CAPTURE_PREFIX = "capture:"  # loop init --traces capture:DIR
PAGE = 1000  # the store's largest page
FEEDBACK_KEYS = ("rating", "preferred", "edited", "comment")
DROPPED = "dropped"  # rlcli.data.importers.DROPPED: a line the messages import counts as dropped


def new_exchange_id(api: str) -> str:
    """The response id the client sees (non-streamed bodies carry it as `id`) and feedback names."""
    return ("msg_" if api == "anthropic" else "chatcmpl-") + uuid.uuid4().hex




def redacted(value: Any, on: bool) -> Any:
    if not on:
        return value
    from rlcli.data.redact import redact_value

    return redact_value(value)


def exchange_record(exchange_id: str, api: str, request: dict[str, Any], response: dict[str, Any],
                    answerer: dict[str, Any], samples: list[dict[str, Any]], redact: bool) -> dict[str, Any]:
    return {"kind": EXCHANGE, "event_id": exchange_id, "scope": {"run_id": RUN}, "created_at": time.time(),
            "exchange": exchange_id, "api": api, "answerer": answerer, "redacted": redact,
            "request": redacted(request, redact), "response": redacted(response, redact), "samples": samples}


def check_feedback(body: Any) -> dict[str, Any]:
    """A feedback body: {"id": response id, "rating"?: number in [-1, 1] or [0, 1]..., "preferred"?: text,
    "edited"?: text, "comment"?: text}; at least one of rating, preferred, edited."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object: {\"id\": ..., \"rating\"|\"preferred\"|\"edited\": ...}")
    exchange = body.get("id") or body.get("response_id")
    if not isinstance(exchange, str) or not exchange:
        raise ValueError("'id' must name a served response (the response's id, or its x-rlcli-exchange-id header)")
    unknown = sorted(set(body) - {"id", "response_id", *FEEDBACK_KEYS})
    if unknown:
        raise ValueError(f"unknown feedback keys {unknown}: give rating, preferred, edited or comment")
    rating = body.get("rating")
    if rating is not None and (isinstance(rating, bool) or not isinstance(rating, int | float)
                               or not -1 <= rating <= 1):
        raise ValueError("'rating' must be a number from -1 (bad) to 1 (good)")
    for key in ("preferred", "edited", "comment"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ValueError(f"'{key}' must be a string")
    if rating is None and not body.get("preferred") and not body.get("edited"):
        raise ValueError("give a 'rating', a 'preferred' answer or an 'edited' answer")
    return {"exchange": exchange, **{k: body[k] for k in FEEDBACK_KEYS if body.get(k) is not None}}


def feedback_record(fb: dict[str, Any], redact: bool) -> dict[str, Any]:
    return {"kind": FEEDBACK, "event_id": "fb-" + uuid.uuid4().hex, "scope": {"run_id": RUN},
            "created_at": time.time(), **redacted(fb, redact)}


# --- the loop's reader -----------------------------------------------------------------------------------


def store_dir(spec: str) -> Path:
    """`capture:DIR` -> DIR (an endpoint's --capture folder)."""
    return Path(spec.removeprefix(CAPTURE_PREFIX)).expanduser().resolve()


def read_all(data_dir: Path, cursor: int = 0) -> list[dict[str, Any]]:
    """Every annotation after cursor, in cursor order, as {"cursor", "kind", "payload"}: read from the store's
    sqlite file (WAL: beside a running daemon) with the cookbook's own reader, so no daemon is started."""
    from tinker_cookbook.capture.store.db import CaptureDB

    path = data_dir / "capture.sqlite"
    if not path.is_file():
        raise UsageError(f"{data_dir}: no capture store there yet; an endpoint started with --capture {data_dir} "
                         "makes it at its first request")
    db = CaptureDB(path)
    out: list[dict[str, Any]] = []
    try:
        while True:
            rows = db.query_annotations(RUN, cursor=cursor, limit=PAGE)
            out += [{"cursor": a["cursor"], "kind": a.get("kind"), "payload": a.get("payload") or {}} for a in rows]
            if len(rows) < PAGE:
                return out
            cursor = rows[-1]["cursor"]
    finally:
        db.close()


def conversation_of(payload: dict[str, Any], parts: Counter[str]) -> dict[str, Any] | str:
    """The exchange as rlcli's conversation ({"messages", "tools"?}) through the importer of its API, or the
    importer's reason to drop it (e.g. "truncated": the answer ran into max_tokens)."""
    from rlcli.data import importers

    convert = importers.from_anthropic if payload.get("api") == "anthropic" else importers.from_openai
    conv = convert({"request": payload.get("request"), "response": payload.get("response")}, parts)
    return conv if isinstance(conv, dict) else str(conv)


def _merge(feedback: list[dict[str, Any]]) -> dict[str, Any]:
    """An exchange's feedback, later entries winning; ratings averaged."""
    out: dict[str, Any] = {}
    ratings = [f["rating"] for f in feedback if "rating" in f]
    for f in feedback:
        out.update({k: v for k, v in f.items() if k in ("preferred", "edited")})
    if ratings:
        out["rating"] = sum(ratings) / len(ratings)
    return out


def _uncut(payload: dict[str, Any]) -> dict[str, Any]:
    """The exchange with its answer's cut at max_tokens (OpenAI finish_reason, Anthropic stop_reason) unmarked."""
    response = payload.get("response")
    if not isinstance(response, dict):
        return payload
    if isinstance(response.get("choices"), list):
        choices = [{**c, "finish_reason": "stop"} if isinstance(c, dict) and c.get("finish_reason") == "length"
                   else c for c in response["choices"]]
        return {**payload, "response": {**response, "choices": choices}}
    if response.get("stop_reason") == "max_tokens":
        return {**payload, "response": {**response, "stop_reason": "end_turn"}}
    return payload


def rows_for_loop(payload: dict[str, Any], fb: dict[str, Any], parts: Counter[str]) -> tuple[list, list]:
    """(conversations, preference pairs) of one exchange with its feedback. A rating is the conversation's
    score (0..1: (rating + 1) / 2, the replay env's verdict reads it). An edited or preferred answer replaces the
    served one in the conversation, scored 1 (the user's own answer), and makes the pair (it chosen, the served
    one rejected): the served answer's rating is then the pair's to carry, not the conversation's."""
    better = fb.get("edited") or fb.get("preferred")
    # A served answer cut at max_tokens is no reply to train on, but a user's better one is: the cut answer is
    # then only the pair's rejected side, so its cut does not drop the exchange.
    conv = conversation_of(_uncut(payload) if better else payload, parts)
    if isinstance(conv, str):  # kept as a line the import counts as dropped, for this reason
        return [{DROPPED: conv, "exchange": payload.get("exchange")}], []
    served = conv["messages"][-1]
    convs, pairs = [], []
    if better:
        prompt = conv["messages"][:-1]
        pairs.append({"messages": prompt, "chosen": {"role": "assistant", "content": better},
                      "rejected": served, "exchange": payload.get("exchange")})
        conv = {**conv, "messages": [*prompt, {"role": "assistant", "content": better}], "score": 1.0}
    elif "rating" in fb:
        conv = {**conv, "score": (float(fb["rating"]) + 1) / 2}
    convs.append({**conv, "exchange": payload.get("exchange")})
    return convs, pairs


def drain(data_dir: Path, out_dir: Path) -> Path | None:
    """Write the exchanges and feedback recorded since the last drain into out_dir (a file per drain) and move
    the cursor; None when nothing is new. out_dir/cursor.json holds the cursor and the exchanges drained so far
    (late feedback on one of them writes that conversation again, scored by all its ratings so far)."""
    from rlcli.files import staged_file

    private_dir(out_dir)
    state_file = out_dir / "cursor.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {"cursor": 0}
    rows = read_all(data_dir, state["cursor"])
    if not rows:
        return None
    exchanges = {r["payload"].get("exchange"): r["payload"] for r in rows if r["kind"] == EXCHANGE}
    feedback: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] == FEEDBACK:
            feedback.setdefault(r["payload"].get("exchange"), []).append(r["payload"])
    late = {e for e in feedback if e not in exchanges}
    if late:  # feedback on exchanges an earlier drain took: them again, with all their feedback so far
        for r in read_all(data_dir):
            e = r["payload"].get("exchange")
            if e in late and r["kind"] == EXCHANGE:
                exchanges[e] = r["payload"]
            elif e in late and r["kind"] == FEEDBACK and r["cursor"] <= state["cursor"]:
                feedback[e].insert(0, r["payload"])
    parts: Counter[str] = Counter()
    convs, pairs = [], []
    for exchange, payload in exchanges.items():
        c, p = rows_for_loop(payload, _merge(feedback.get(exchange, [])), parts)
        convs += c
        pairs += p
    span = f"{state['cursor'] + 1:09d}-{rows[-1]['cursor']:09d}"
    path = out_dir / f"capture-{span}.jsonl"
    for target, items in ((path, convs), (out_dir / f"capture-{span}.pairs.jsonl", pairs)):
        if items:
            with staged_file(target, shared=False) as f:
                f.write("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in items).encode())
    with staged_file(state_file, shared=False) as f:
        f.write(json.dumps({"cursor": rows[-1]["cursor"]}).encode())
    retention.note_reader(data_dir, out_dir, rows[-1]["cursor"])  # the endpoint may now drop what it drained
    return path if convs else None
