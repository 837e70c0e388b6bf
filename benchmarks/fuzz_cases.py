"""The fuzzer's hand-made cases (benchmarks/fuzz.py): what an OpenAPI schema cannot express. Each case class is a
function that sends its requests and returns {"sent", "statuses", "findings"}: a finding is a 500 (or any 5xx with a
traceback), a request left unanswered, or a class-specific failure (memory, another tenant's data).

Oversized bodies: BIG_WHY.
"""

from __future__ import annotations

import collections
import contextlib
import json
import random
import socket
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import requests

BIG_WHY = ("256 MB per body: 'hundreds of MB', sent once to a JSON route and once to forward_backward. Uvicorn reads "
           "a body whole before the route sees it and FastAPI then parses it, so the API process may briefly hold a "
           "few copies (~1 GB); on a 2-core 24 GB machine shared with other work that is safe, where 1 GB bodies "
           "could hold 4+ GB. The API's RSS is sampled during each body, and must stay under RSS_PER_BODY copies.")
RSS_PER_BODY = 6  # the body's size times this: far more than a few working copies, far less than a leak per chunk
TRACEBACK = "Traceback (most recent call last)"
PROTO = "application/x-protobuf"
FB = "/api/v1/forward_backward"


class Result:
    def __init__(self) -> None:
        self.statuses: collections.Counter[str] = collections.Counter()
        self.findings: list[dict] = []

    def saw(self, case: str, status: int | str, text: str = "", bad: str | None = None) -> None:
        self.statuses[str(status)] += 1
        if bad is None and isinstance(status, int) and (status == 500 or (status >= 500 and TRACEBACK in text)):
            bad = "500" if TRACEBACK not in text else "5xx with a traceback"
        if bad is None and status == "no answer":
            bad = "no answer"
        if bad:
            self.findings.append({"case": case, "status": status, "kind": bad, "detail": text[:300]})

    def body(self, **extra: Any) -> dict:
        return {"sent": sum(self.statuses.values()), "statuses": dict(sorted(self.statuses.items())),
                "findings": self.findings, **extra}


def call(result: Result, case: str, method: str, url: str, **kwargs: Any) -> requests.Response | None:
    """One request through `requests`; its answer judged into `result`."""
    try:
        r = requests.request(method, url, timeout=kwargs.pop("timeout", 120), **kwargs)
    except requests.RequestException as e:
        result.saw(case, "no answer", f"{type(e).__name__}: {e}")
        return None
    result.saw(case, r.status_code, r.text)
    return r


def host_port(url: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


def status_of(sock: socket.socket) -> int | str:
    """The status code of the answer on `sock` ("no answer" if it closes or times out first)."""
    data = b""
    with contextlib.suppress(OSError):
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else "no answer"


def stream_body(url: str, path: str, headers: dict[str, str], size: int, chunk: bytes) -> int | str:
    """POST `size` bytes of `chunk` repeated, written as it goes (the client never holds the body); a server that
    refuses early closes mid-body, and its status line is still read."""
    host, port = host_port(url)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((host, port), timeout=300) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {size}\r\n{head}\r\n".encode())
        sent = 0
        with contextlib.suppress(OSError):
            while sent < size:
                piece = chunk[:size - sent]
                s.sendall(piece)
                sent += len(piece)
        return status_of(s)


def rss_mb(pid: int | None) -> float | None:
    with contextlib.suppress(OSError, TypeError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0]) / 1024
    return None


class PeakRss:
    """The highest RSS of `pid` while the block runs, sampled every 50 ms from a thread."""

    def __init__(self, pid: int | None):
        self.pid, self.start, self.peak, self._done = pid, rss_mb(pid), 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, rss_mb(self.pid) or 0.0)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def growth(self) -> float | None:
        return None if self.start is None else round(max(self.peak - self.start, 0.0), 1)


def big_bodies(url: str, pid: int | None, big_mb: int, routes: list[tuple[str, dict]]) -> dict:
    """Each route gets one body of `big_mb` MB; the API's RSS is sampled meanwhile (peak over the start)."""
    result, peaks = Result(), {}
    chunk = b"A" * (1 << 20)
    for path, headers in routes:
        with PeakRss(pid) as rss:
            status = stream_body(url, path, headers, big_mb << 20, chunk)
        grown = rss.growth()
        peaks[path] = {"status": status, "rss_start_mb": rss.start, "rss_peak_growth_mb": grown}
        too_much = grown is not None and grown > RSS_PER_BODY * big_mb
        result.saw(f"{big_mb} MB to {path}", status, bad=f"RSS grew {grown} MB" if too_much else None)
    return result.body(size_mb=big_mb, why=BIG_WHY, memory=peaks)


def truncated(url: str, paths: list[str], rounds: int = 10) -> dict:
    """A client that sends half a body and closes, and one whose chunked body stops mid-chunk; then a whole request
    must still be answered."""
    result = Result()
    host, port = host_port(url)
    body = json.dumps({"session_id": "x" * 200, "model_id": "y" * 200}).encode()
    for i in range(rounds):
        for path in paths:
            with socket.create_connection((host, port), timeout=30) as s:
                if i % 2:
                    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n"
                              "Content-Type: application/json\r\n\r\n".encode() + b"400\r\n" + body[:50])
                else:
                    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
                              "Content-Type: application/json\r\n\r\n".encode() + body[:len(body) // 2])
            result.statuses["closed half-way"] += 1
    call(result, "a whole request after", "GET", url + paths[-1].replace("POST ", ""), timeout=60)
    return result.body()


def storm(url: str, n: int, probe: str) -> dict:
    """n raw connections open at once: a third send nothing, a third half a request line and headers, a third a
    whole request they never read; all dropped (some with a reset). Then `probe` must be answered."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 200), hard))
    host, port = host_port(url)
    result, socks, refused = Result(), [], 0
    for i in range(n):
        try:
            s = socket.create_connection((host, port), timeout=10)
        except OSError:
            refused += 1
            continue
        if i % 3 == 1:
            s.sendall(f"GET {probe} HTTP/1.1\r\nHost: {host}\r\nX-Half: ".encode())
        elif i % 3 == 2:
            s.sendall(f"GET {probe} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        socks.append(s)
    for i, s in enumerate(socks):
        if i % 2:  # SO_LINGER 0: the close is a reset, as from a client that crashed
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.close()
    result.statuses["opened and dropped"] = len(socks)
    time.sleep(1)
    call(result, "probe after the storm", "GET", url + probe, timeout=60)
    return result.body(connections=n, refused_at_connect=refused)


def protobuf(url: str, headers: dict, model_id: str) -> dict:
    """forward_backward bodies that are not the proto the tinker client sends: random bytes, a real request cut at
    every tenth of its length, a real one naming no model, a zstd header over garbage, a zstd bomb."""
    import tinker
    import zstandard
    from tinker.proto.request_conv import forward_backward_request_to_proto

    from tests import sdk_scenario

    result, rng = Result(), random.Random(49)
    h = {**headers, "Content-Type": PROTO}
    real = forward_backward_request_to_proto(tinker.types.ForwardBackwardRequest(
        model_id=model_id, seq_id=1, forward_backward_input=tinker.types.ForwardBackwardInput(
            data=[sdk_scenario.datum(tinker)], loss_fn="cross_entropy"))).SerializeToString()
    bodies = {f"random {n} bytes #{i}": rng.randbytes(n) for i, n in enumerate([1, 7, 64, 1000, 65536] * 4)}
    bodies |= {f"real cut at {k}/10": real[:len(real) * k // 10] for k in range(10)}
    bodies["real, an unknown model"] = real.replace(model_id.encode(), b"z" * len(model_id))
    bodies["real with bytes flipped"] = bytes(b ^ 0x5A if i % 7 == 3 else b for i, b in enumerate(real))
    for case, data in bodies.items():
        call(result, case, "POST", url + FB, data=data, headers=h)
    zstd = {**h, "Content-Encoding": "zstd"}
    call(result, "zstd header, garbage", "POST", url + FB, data=rng.randbytes(4096), headers=zstd)
    packer, zeros = zstandard.ZstdCompressor(level=1).compressobj(), b"\0" * (64 << 20)
    bomb = b"".join(packer.compress(zeros) for _ in range(16)) + packer.flush()  # 1 GiB of zeros in ~100 KB
    call(result, "zstd bomb (1 GiB)", "POST", url + FB, data=bomb, headers=zstd)
    return result.body()


def content_types(url: str, headers: dict) -> dict:
    """JSON routes given other content types, and forward_backward given JSON."""
    result = Result()
    body = json.dumps({"session_id": "s", "model_id": "m", "request_id": "1", "tags": []}).encode()
    kinds = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", PROTO,
             "application/json; charset=latin-1", "", "application/json"]
    for path in ("/api/v1/create_session", "/api/v1/create_model", "/api/v1/retrieve_future", "/api/v1/asample",
                 FB):
        for kind in kinds:
            h = {**headers, **({"Content-Type": kind} if kind else {})}
            call(result, f"{kind or 'none'} to {path}", "POST", url + path, data=body, headers=h)
        call(result, f"invalid UTF-8 to {path}", "POST", url + path, data=b"\xff\xfe{\"a\": \x80}",
             headers={**headers, "Content-Type": "application/json"})
    return result.body()


def hostile_names(root: Path, model_id: str) -> list[str]:
    canary = root / "canary"
    return ["..", "../..", "../../canary", f"../../../..{canary}", str(canary), str(canary / "keep.txt"),
            "/etc/passwd", "a/../../b", "x" * 10_000, "çheckpoint-ü", "检查点", "ckpt-🙂", "nul\0byte", "%2e%2e",
            "..%2F..%2Fcanary", " ", "CON", model_id + "/../" + model_id]


def hostile_paths(root: Path, model_id: str) -> list[str]:
    names = hostile_names(root, model_id)
    canary = root / "canary"
    return ([f"tinker://{model_id}/weights/{n}" for n in names] + [f"tinker://{model_id}/sampler_weights/{n}"
                                                                    for n in names]
            + ["tinker://../../weights/x", f"tinker://{'a' * 10_000}/weights/x", f"file://{canary}/keep.txt",
               str(canary / "keep.txt"), "tinker://", "tinker:///weights/", f"tinker://{model_id}/../../../etc",
               f"tinker://{model_id}/weights"])


def paths_and_names(url: str, headers: dict, root: Path, model_id: str, session_id: str) -> dict:
    """`tinker://` paths with `..`, absolute paths and 10k-character names; unicode checkpoint names: saved,
    loaded, sampled from, asked about and deleted. Every future they make is waited for, so whatever the engine
    would write is written before the file tree is compared."""
    result, futures = Result(), []
    h = {**headers, "Content-Type": "application/json"}

    def post(case: str, path: str, body: dict) -> None:
        r = call(result, case, "POST", url + path, data=json.dumps(body), headers=h)
        if r is not None and r.status_code == 200 and "request_id" in r.text:
            futures.append((case, r.json()["request_id"]))

    for name in hostile_names(root, model_id):
        post(f"save_weights {name[:30]!r}", "/api/v1/save_weights", {"model_id": model_id, "path": name})
        post(f"save_weights_for_sampler {name[:30]!r}", "/api/v1/save_weights_for_sampler",
             {"model_id": model_id, "path": name})
        quoted = urllib.parse.quote(name, safe="")
        for method, route in (("DELETE", f"/api/v1/training_runs/{model_id}/checkpoints/{quoted}"),
                              ("GET", f"/api/v1/training_runs/{model_id}/checkpoints/{quoted}/download"),
                              ("GET", f"/api/v1/training_runs/{model_id}/checkpoints/{quoted}/archive")):
            call(result, f"{method} {name[:30]!r}", method, url + route, headers=headers, allow_redirects=False)
    for path in hostile_paths(root, model_id):
        post(f"load_weights {path[:40]!r}", "/api/v1/load_weights", {"model_id": model_id, "path": path})
        post(f"weights_info {path[:40]!r}", "/api/v1/weights_info", {"tinker_path": path})
        post(f"create_sampling_session {path[:40]!r}", "/api/v1/create_sampling_session",
             {"session_id": session_id, "sampling_session_seq_id": len(futures) + 1000, "model_path": path})
        post(f"asample {path[:40]!r}", "/api/v1/asample", {"model_path": path, "num_samples": 1, "prompt": {
            "chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}, "sampling_params": {"max_tokens": 1}})
    for case, request_id in futures:  # the engine's answer to each: an error is fine, a 500 is not
        post(f"result of {case}", "/api/v1/retrieve_future", {"request_id": request_id})
    return result.body(futures=len(futures))


def a_model(url: str, key: str) -> tuple[str, str]:
    """(model id, session id) of a new LoRA, for the cases that need a real model behind their ids."""
    import tinker

    from tests.conftest import install_embedded_model

    service = tinker.ServiceClient(base_url=url, api_key=key)
    trainer = service.create_lora_training_client(base_model=install_embedded_model(), rank=2, seed=1).result()
    return trainer.model_id, service.holder.get_session_id()


def all_cases(url: str, root: Path, pid: int | None, big_mb: int, connections: int, key: str = "tml-self-hosted"
              ) -> dict:
    headers = {"X-API-Key": key}
    model_id, session_id = a_model(url, key)
    json_h = {**headers, "Content-Type": "application/json"}
    return {"malformed_protobuf": protobuf(url, headers, model_id),
            "content_types": content_types(url, headers),
            "paths_and_names": paths_and_names(url, headers, root, model_id, session_id),
            "truncated_streams": truncated(url, ["/api/v1/create_session", FB, "/api/v1/healthz"]),
            "big_bodies": big_bodies(url, pid, big_mb, [("/api/v1/create_session", json_h),
                                                        (FB, {**headers, "Content-Type": PROTO})]),
            "connections": storm(url, connections, "/api/v1/healthz")}


def endpoint_cases(url: str, root: Path, connections: int) -> dict:
    """The endpoint's: hostile model names (a tinker:// name is sampled as given), wrong content types, bodies
    past aiohttp's 1 MiB limit, truncated requests and the connection storm."""
    result = Result()
    chat = url + "/v1/chat/completions"
    for name in hostile_paths(root, "someone") + hostile_names(root, "someone"):
        call(result, f"model {name[:40]!r}", "POST", chat, json={"model": name, "max_tokens": 1,
                                                                  "messages": [{"role": "user", "content": "hi"}]})
    for kind in ("text/plain", "application/x-www-form-urlencoded", PROTO, ""):
        h = {"Content-Type": kind} if kind else {}
        call(result, f"{kind or 'none'} chat", "POST", chat, data=b'{"messages": []}', headers=h)
        call(result, f"{kind or 'none'} feedback", "POST", url + "/v1/feedback", data=b"\x00\xff", headers=h)
    return {"hostile_models_and_types": result.body(),
            "big_bodies": big_bodies(url, None, 64, [("/v1/chat/completions", {"Content-Type": "application/json"}),
                                                     ("/v1/messages", {"Content-Type": "application/json"})]),
            "truncated_streams": truncated(url, ["/v1/chat/completions", "/v1/feedback", "/healthz"]),
            "connections": storm(url, connections, "/healthz")}


def tenant_data(url: str, model: str, key: str) -> dict:
    """Bob's things: a model with a saved state and sampler weights, his session and sampling session."""
    import tinker

    service = tinker.ServiceClient(base_url=url, api_key=key)
    trainer = service.create_lora_training_client(base_model=model, rank=2, seed=2).result()
    state = trainer.save_state("bob-secret-state").result().path
    sampler_path = trainer.save_weights_for_sampler("bob-secret-sampler").result().path
    sampler = service.create_sampling_client(model_path=sampler_path)
    session = service.holder.get_session_id()
    sampling = getattr(sampler, "_sampling_session_id", None) or ""
    return {"model_id": trainer.model_id, "unique_id": trainer.model_id, "session_id": session,
            "sampling_session_id": sampling, "sampler_id": sampling, "state": state, "sampler_path": sampler_path,
            "checkpoint": "bob-secret-state"}


def other_tenant(url: str, key: str, bob: dict) -> dict:
    """Alice's key, naming each of bob's things by hand: every answer must be a refusal, none may carry them."""
    result = Result()
    h = {"X-API-Key": key, "Content-Type": "application/json"}
    m = bob["model_id"]
    alice_model, alice_session = a_model(url, key)
    asks = [("GET", f"/api/v1/training_runs/{m}", None), ("GET", f"/api/v1/training_runs/{m}/checkpoints", None),
            ("GET", f"/api/v1/models/{m}/checkpoints", None), ("POST", "/api/v1/get_info", {"model_id": m}),
            ("GET", f"/api/v1/training_runs/{m}/checkpoints/bob-secret-sampler/archive", None),
            ("POST", "/api/v1/weights_info", {"tinker_path": bob["state"]}),
            ("POST", "/api/v1/load_weights", {"model_id": alice_model, "path": bob["state"]}),
            ("POST", "/api/v1/load_weights", {"session_id": alice_session, "model_seq_id": 7, "path": bob["state"]}),
            ("POST", "/api/v1/create_sampling_session", {"session_id": alice_session, "sampling_session_seq_id": 9,
                                                         "model_path": bob["sampler_path"]}),
            ("POST", "/api/v1/asample", {"model_path": bob["sampler_path"], "num_samples": 1, "prompt": {
                "chunks": [{"type": "encoded_text", "tokens": [1, 2]}]}, "sampling_params": {"max_tokens": 1}}),
            ("POST", "/api/v1/session_heartbeat", {"session_id": bob["session_id"]}),
            ("GET", f"/api/v1/samplers/{bob['sampler_id']}", None),
            ("POST", "/api/v1/optim_step", {"model_id": m, "adam_params": {"learning_rate": 0.1}}),
            ("POST", "/api/v1/save_weights", {"model_id": m, "path": "alice-was-here"}),
            ("DELETE", f"/api/v1/training_runs/{m}/checkpoints/weights/bob-secret-state", None),
            ("POST", "/api/v1/unload_model", {"model_id": m})]
    for method, path, body in asks:
        r = call(result, f"{method} {path}", method, url + path, headers=h, allow_redirects=False,
                 data=None if body is None else json.dumps(body))
        if r is not None and r.status_code < 300:
            result.findings.append({"case": f"{method} {path}", "status": r.status_code,
                                    "kind": "another tenant's data", "detail": r.text[:300]})
    r = call(result, "GET /api/v1/training_runs", "GET", url + "/api/v1/training_runs", headers=h)
    if r is not None and m in r.text:
        result.findings.append({"case": "listing", "status": r.status_code, "kind": "another tenant's data",
                                "detail": "bob's model in alice's listing"})
    return result.body()


def gate_inputs(url: str, key: str, pid: int | None) -> dict:
    """What rlcli's tenant gate itself parses: the listing's query, bodies it reads whole, odd keys."""
    result = Result()
    h = {"X-API-Key": key}
    for query in ("offset=abc", "limit=x", "offset=1e3", "limit=99999999999999999999", "offset=-1&limit=-1",
                  "limit=%00"):
        call(result, f"training_runs?{query}", "GET", f"{url}/api/v1/training_runs?{query}", headers=h)
    for bad in ("tml-" + "x" * 10_000, "tml-\u00e9", "Bearer", ""):
        call(result, f"key {bad[:12]!r}", "GET", url + "/api/v1/training_runs",
             headers={"X-API-Key": bad.encode("utf-8").decode("latin-1")})
    t0 = time.monotonic()
    status = stream_body(url, "/api/v1/create_session", {**h, "Content-Type": "application/json"}, 80 << 20,
                         b"A" * 65536)
    result.saw("80 MB body through the gate", status)
    return result.body(gate_80mb_seconds=round(time.monotonic() - t0, 1))
