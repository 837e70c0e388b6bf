"""Generated logs in the newer formats for benchmarks/import_bench.py, and the naive json loop for each.

Each generator turns one of import_bench's Chat Completions calls (same text, turns, tool calls and
images) into the shape that API or tracer logs:
- responses: OpenAI Responses {request, response} pairs; a quarter continue the previous call by
  previous_response_id with only the new user turn (so the importer joins chains), a third carry a
  reasoning summary;
- gemini: generateContent {request, response} pairs (systemInstruction, contents, functionCall /
  functionResponse, inlineData images, candidates);
- otel: OTLP/JSON exports as a collector's file exporter writes them, one call per line: an HTTP
  server span (not an LLM call) and a chat span carrying gen_ai.input.messages / output.messages.
BASELINES holds, per format, the plainest json-module loop that writes the same kind of output
(conversations of {role, content} messages with tool calls); PASSTHROUGH, the loop that only writes
each record's own message lists as they are (not training data, but what a first try often is).
"""

from __future__ import annotations

import json
import random

_BASE_HEAD = "import json, sys\nwith open(sys.argv[1]) as f, open(sys.argv[2], 'w') as out:\n    for line in f:\n"
# Like for like: each loop writes conversations of {role, content} messages with tool calls, as rlcli
# does, in the plainest code (no checks, no accounting; Responses chains joined through a dict that
# holds every conversation in memory, where rlcli keeps an index and re-reads lines).
BASELINES = {
    "responses": "history = {}\n"
    + _BASE_HEAD
    + """        rec = json.loads(line)
        req, resp = rec["request"], rec["response"]
        msgs = [{"role": "system", "content": req["instructions"]}] if req.get("instructions") else []
        turns = list(history.get(req.get("previous_response_id"), []))
        items = req["input"] if isinstance(req["input"], list) else [{"role": "user", "content": req["input"]}]
        for it in items + resp["output"]:
            kind = it.get("type", "message")
            if kind == "message":
                c = it["content"]
                c = c if isinstance(c, str) else "".join(p.get("text", "") for p in c)
                turns.append({"role": it["role"], "content": c})
            elif kind == "function_call":
                fn = {"name": it["name"], "arguments": it["arguments"]}
                turns.append({"role": "assistant", "content": "",
                              "tool_calls": [{"id": it["call_id"], "type": "function", "function": fn}]})
            elif kind == "function_call_output":
                turns.append({"role": "tool", "tool_call_id": it["call_id"], "content": it["output"]})
        history[resp["id"]] = turns
        out.write(json.dumps({"messages": msgs + turns}) + "\\n")
""",
    "gemini": _BASE_HEAD
    + """        rec = json.loads(line)
        req = rec["request"]
        msgs = [{"role": "system", "content": req["systemInstruction"]["parts"][0]["text"]}]
        for c in req["contents"] + [rec["response"]["candidates"][0]["content"]]:
            m = {"role": "assistant" if c["role"] == "model" else "user",
                 "content": "".join(p.get("text", "") for p in c["parts"])}
            calls = [p["functionCall"] for p in c["parts"] if "functionCall" in p]
            if calls:
                m["tool_calls"] = [{"id": "", "type": "function",
                                    "function": {"name": f["name"], "arguments": json.dumps(f["args"])}} for f in calls]
            msgs += [{"role": "tool", "content": json.dumps(p["functionResponse"]["response"])}
                     for p in c["parts"] if "functionResponse" in p] or [m]
        out.write(json.dumps({"messages": msgs}) + "\\n")
""",
    "otel": _BASE_HEAD
    + """        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: a["value"].get("stringValue") for a in span["attributes"]}
                    if "gen_ai.input.messages" not in attrs:
                        continue
                    system = json.loads(attrs["gen_ai.system_instructions"])[0]["content"]
                    msgs = [{"role": "system", "content": system}]
                    turns = json.loads(attrs["gen_ai.input.messages"])
                    for m in turns + json.loads(attrs["gen_ai.output.messages"])[:1]:
                        parts = m["parts"]
                        text = "".join(p["content"] for p in parts if p["type"] == "text")
                        msg = {"role": m["role"], "content": text}
                        calls = [{"id": p["id"], "type": "function", "function": {"name": p["name"],
                                  "arguments": json.dumps(p["arguments"])}} for p in parts if p["type"] == "tool_call"]
                        if calls:
                            msg["tool_calls"] = calls
                        if m["role"] == "tool":
                            msg = {"role": "tool", "tool_call_id": parts[0]["id"], "content": parts[0]["response"]}
                        msgs.append(msg)
                    out.write(json.dumps({"messages": msgs}) + "\\n")
""",
}
# What a first try often is: the records' own message lists written as they are (not training data).
PASSTHROUGH = {
    "responses": _BASE_HEAD
    + """        rec = json.loads(line)
        items = rec["request"]["input"] if isinstance(rec["request"]["input"], list) else []
        out.write(json.dumps({"messages": items + rec["response"]["output"]}) + "\\n")
""",
    "gemini": _BASE_HEAD
    + """        rec = json.loads(line)
        out.write(json.dumps({"messages": rec["request"]["contents"] + [rec["response"]["candidates"][0]["content"]]})
                  + "\\n")
""",
    "otel": _BASE_HEAD
    + """        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: a["value"].get("stringValue") for a in span["attributes"]}
                    if "gen_ai.input.messages" in attrs:
                        msgs = json.loads(attrs["gen_ai.input.messages"]) + json.loads(attrs["gen_ai.output.messages"])
                        out.write(json.dumps({"messages": msgs}) + "\\n")
""",
}


def _text(content) -> str:
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if p.get("type") == "text")
    return content or ""


def _images(content) -> int:
    return sum(1 for p in content if p.get("type") == "image_url") if isinstance(content, list) else 0


def responses(chat: dict, i: int, rng: random.Random, state: dict) -> dict:
    req, resp = chat["request"], chat["response"]
    system, *turns = req["messages"]
    items: list = []
    for m in turns:
        if m.get("tool_calls"):
            for c in m["tool_calls"]:
                fn = c["function"]
                items.append({"type": "function_call", "call_id": c["id"], "name": fn["name"],
                              "arguments": fn["arguments"]})  # fmt: skip
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m["role"] == "user":
            parts = [{"type": "input_text", "text": _text(m["content"])}]
            parts += [{"type": "input_image", "image_url": "https://img.example.com/x.png"}] * _images(m["content"])
            items.append({"type": "message", "role": "user", "content": parts})
        else:
            items.append({"role": m["role"], "content": m["content"]})
    request = {"model": "gpt-4.1", "instructions": system["content"], "input": items, "store": True}
    if state.get("last") and rng.random() < 0.25:  # continue the previous call with one new turn
        request["previous_response_id"] = state["last"]
        request["input"] = [i for i in items if i.get("role") == "user"][-1:]
    if "tools" in req:
        request["tools"] = [{"type": "function", **t["function"]} for t in req["tools"]]
    output: list = []
    if rng.random() < 0.33:
        output.append({"type": "reasoning", "id": f"rs_{i}", "summary": [{"type": "summary_text", "text": "Plan."}]})
    reply = resp["choices"][0]["message"]["content"]
    output.append({"type": "message", "id": f"msg_{i}", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": reply, "annotations": []}]})  # fmt: skip
    state["last"] = f"resp_{i:012x}"
    response = {"id": state["last"], "object": "response", "status": "completed", "model": "gpt-4.1",
                "output": output, "usage": resp["usage"]}  # fmt: skip
    return {"request": request, "response": response}


def gemini(chat: dict, i: int, rng: random.Random, state: dict) -> dict:
    req, resp = chat["request"], chat["response"]
    system, *turns = req["messages"]
    contents: list = []
    for m in turns:
        if m.get("tool_calls"):
            calls = [{"functionCall": {"name": c["function"]["name"], "args": json.loads(c["function"]["arguments"])}}
                     for c in m["tool_calls"]]  # fmt: skip
            contents.append({"role": "model", "parts": calls})
        elif m["role"] == "tool":
            response = {"name": "lookup_order", "response": json.loads(m["content"])}
            contents.append({"role": "user", "parts": [{"functionResponse": response}]})
        else:
            parts = [{"text": _text(m["content"])}]
            parts += [{"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}}] * _images(m["content"])
            contents.append({"role": "user" if m["role"] == "user" else "model", "parts": parts})
    request = {"systemInstruction": {"parts": [{"text": system["content"]}]}, "contents": contents,
               "generationConfig": {"temperature": 0.7}}  # fmt: skip
    if "tools" in req:
        request["tools"] = [{"functionDeclarations": [t["function"] for t in req["tools"]]}]
    candidates = [{"content": {"role": "model", "parts": [{"text": c["message"]["content"]}]}, "finishReason": "STOP",
                   "index": c["index"]} for c in resp["choices"]]  # fmt: skip
    usage = {"promptTokenCount": 900, "candidatesTokenCount": 200, "totalTokenCount": 1100}
    response = {"candidates": candidates, "usageMetadata": usage, "modelVersion": "gemini-2.5-flash"}
    return {"key": f"req-{i}", "request": request, "response": response}


def _kv(key: str, value) -> dict:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": value}}


def _parts(m: dict) -> dict:
    if m.get("tool_calls"):
        parts = [{"type": "tool_call", "id": c["id"], "name": c["function"]["name"],
                  "arguments": json.loads(c["function"]["arguments"])} for c in m["tool_calls"]]  # fmt: skip
    elif m["role"] == "tool":
        parts = [{"type": "tool_call_response", "id": m["tool_call_id"], "response": m["content"]}]
    else:
        parts = [{"type": "text", "content": _text(m["content"])}]
        parts += [{"type": "uri", "modality": "image", "uri": "https://img.example.com/x.png"}] * _images(m["content"])
    return {"role": m["role"], "parts": parts}


def otel(chat: dict, i: int, rng: random.Random, state: dict) -> dict:
    """One export line: the call's HTTP server span and its chat span (a collector batches by line)."""
    req, resp = chat["request"], chat["response"]
    system, *turns = req["messages"]
    trace, start = f"{rng.getrandbits(128):032x}", 1764460800000000000 + i * 10**9
    outputs = [{**_parts(c["message"]), "finish_reason": "stop"} for c in resp["choices"]]
    attrs = [_kv("gen_ai.operation.name", "chat"), _kv("gen_ai.provider.name", "openai"),
             _kv("gen_ai.request.model", "gpt-4.1"), _kv("gen_ai.usage.input_tokens", 900),
             _kv("gen_ai.system_instructions", json.dumps([{"type": "text", "content": system["content"]}])),
             _kv("gen_ai.input.messages", json.dumps([_parts(m) for m in turns], ensure_ascii=False)),
             _kv("gen_ai.output.messages", json.dumps(outputs, ensure_ascii=False))]  # fmt: skip
    http = [_kv("http.request.method", "POST"), _kv("url.path", "/v1/chat"), _kv("http.response.status_code", 200)]
    spans = [
        {"traceId": trace, "spanId": f"{2 * i:016x}", "name": "POST /v1/chat", "kind": 2,
         "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 2 * 10**9), "attributes": http},
        {"traceId": trace, "spanId": f"{2 * i + 1:016x}", "parentSpanId": f"{2 * i:016x}", "name": "chat gpt-4.1",
         "kind": 3, "startTimeUnixNano": str(start), "endTimeUnixNano": str(start + 10**9), "attributes": attrs,
         "status": {}},
    ]  # fmt: skip
    resource = {"attributes": [_kv("service.name", "support-bot")]}
    scope = {"name": "opentelemetry.instrumentation.openai_v2", "version": "2.1b0"}
    return {"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": scope, "spans": spans}]}]}


GENERATORS = {"responses": responses, "gemini": gemini, "otel": otel}
