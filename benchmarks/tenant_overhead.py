"""What checking a tenant's key costs per request (target: under 1 ms): runtime/rlcli_tenants.py's gate.

    .venv/bin/python -m benchmarks.tenant_overhead [--requests 20000] [--rounds 7]

The real gate, loaded in the server venv as the launcher loads it, is timed in-process around an ASGI app that
answers at once, against that app alone, on the requests a training loop sends most: a forward_backward POST
naming its model (key hash, tenants-file stat, body read and parsed, ownership lookup, the answer parsed and its
new future appended to the owners file) and a retrieve_future POST. The difference per request is the gate's
whole cost; the network and SkyRL's own work are the same with and without it. The app behind the gate is the
control of that difference, not a stand-in for something measured: behind SkyRL's real app each request would
also pay a database commit, whose jitter (milliseconds on a shared machine) would bury a cost of microseconds.
What the gate does to requests on a real server under load is benchmarks/tenant_fairness.py's measure.
Writes benchmarks/receipts/tenant-overhead-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, summary, versions, write_receipt

# The gate runs inside the server venv as the launcher loads it: its folder on the path, so that it finds its
# siblings (tenant_owners.py) by their plain names.
RUNTIME = REPO / "rlcli" / "server" / "runtime"
GATE = "rlcli_tenants"


def load_gate():
    return importlib.import_module(GATE)


def sdk_forward_backward(model_id: str, seq_id: int = 1) -> bytes:
    """forward_backward's body exactly as the tinker SDK encodes it: 8 sequences of 64 tokens. SkyRL answers a
    repeated (model, seq_id) with the future it recorded first: a server-bound body needs a new seq_id each."""
    import tinker
    from tinker.proto.request_conv import forward_backward_request_to_proto
    from tinker.types import ForwardBackwardInput, ForwardBackwardRequest

    tokens = list(range(5, 70))
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                         loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 64})
    request = ForwardBackwardRequest(model_id=model_id, seq_id=seq_id, forward_backward_input=ForwardBackwardInput(
        data=[datum] * 8, loss_fn="cross_entropy"))
    return forward_backward_request_to_proto(request).SerializeToString()


def requests(fb_body: bytes) -> dict[str, tuple[dict, bytes, bytes]]:
    return {"forward_backward": ({"path": "/api/v1/forward_backward"}, fb_body, b"application/x-protobuf"),
            "retrieve_future": ({"path": "/api/v1/retrieve_future"}, json.dumps({"request_id": "7"}).encode(),
                                b"application/json")}


async def one_batch(app, scope: dict, body: bytes, n: int) -> float:
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        pass

    t0 = time.perf_counter()
    for _ in range(n):
        await app(scope, receive, send)
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--inner", help=argparse.SUPPRESS)  # the server venv's run: a folder to report into
    args = parser.parse_args()
    if args.inner:
        return inner(args, Path(args.inner))
    from rlcli.config import server_venv_dir

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "fb.bin").write_bytes(sdk_forward_backward("model_a"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(RUNTIME), str(REPO)]))
        python = str(server_venv_dir() / "bin" / "python")
        subprocess.run([python, "-m", "benchmarks.tenant_overhead", "--inner", folder, "--requests", str(args.requests),
                        "--rounds", str(args.rounds)], check=True, env=env, cwd=REPO)
        measured = json.loads((Path(folder) / "results.json").read_text())
    worst = max(r["overhead_s"]["median"] for r in measured["results"].values())
    path = write_receipt("tenant-overhead", {
        "versions": versions("tinker"), "server_python": measured["python"], "requests_per_round": args.requests,
        "rounds": args.rounds, "tenants": 51, "results": measured["results"], "worst_case_per_request_s": worst,
        "under_1ms": worst < 1e-3})
    print(f"worst case {worst * 1e6:.1f} us per request (target < 1000 us); receipt {path}")


def inner(args, folder: Path) -> None:
    import platform

    gate_mod = load_gate()
    answer = json.dumps({"request_id": "8", "model_id": "model_a"}).encode()

    async def answers_at_once(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})

    with tempfile.TemporaryDirectory() as scratch:
        key = "tml-" + "k" * 43
        tenants = {f"t{i}": {"key_sha256": gate_mod._hash(f"tml-other-{i}")} for i in range(50)}
        tenants["alice"] = {"key_sha256": gate_mod._hash(key)}
        (Path(scratch) / "tenants.json").write_text(json.dumps({"tenants": tenants}))
        owners = gate_mod.Owners(Path(scratch) / "owners.jsonl")
        owners.owner.update({"model_a": "alice", "7": "alice"})
        gate = gate_mod.TenantGate(answers_at_once, gate_mod.Keys(Path(scratch) / "tenants.json", None), owners)
        results = {}
        for name, (extra, body, content_type) in requests((folder / "fb.bin").read_bytes()).items():
            scope = {"type": "http", "method": "POST", "headers": [(b"x-api-key", key.encode()),
                     (b"content-type", content_type)], "query_string": b"", **extra}
            bare, gated = [], []
            for _ in range(args.rounds):
                bare.append(asyncio.run(one_batch(answers_at_once, scope, body, args.requests)))
                gated.append(asyncio.run(one_batch(gate, scope, body, args.requests)))
            over = [g - b for g, b in zip(gated, bare, strict=True)]
            results[name] = {"body_bytes": len(body), "bare_s": summary(bare), "gated_s": summary(gated),
                             "overhead_s": summary(over)}
            print(f"{name:18s} gate overhead median {summary(over)['median'] * 1e6:.1f} us per request")
    (folder / "results.json").write_text(json.dumps({"results": results, "python": platform.python_version()}))


if __name__ == "__main__":
    main()
