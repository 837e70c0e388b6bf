"""How long one tenant waits while another floods the queue (`serve start --tenants`).

    .venv/bin/python -m benchmarks.tenant_fairness [--size large] [--flood 24] [--reps 3]

One private server with tenants `flood` and `quiet`. Each rep: `quiet` times one forward_backward
(8 x 64 tokens) on an idle server (alone), then `flood` submits --flood forward_backwards of the same
size as raw requests, each queued (answered with its id) before `quiet` submits its one, timed until its
result (flooded).
The engine takes pending work round-robin between tenants (runtime/rlcli_engine.py's FairEngine). SkyRL's own
arrival order (receipts taken with RLCLI_FAIR_TAKE=0, a switch since retired, measured it) takes
every pending pass and runs them model by model, earliest first, so quiet waited for the whole flood once each
pass costs real compute (--size large: benchmarks/models.py's ~26M model).
Writes benchmarks/receipts/tenant-fairness-<time>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.common import summary, versions, write_receipt
from benchmarks.models import describe_model, model_dir
from benchmarks.tenant_overhead import sdk_forward_backward
from rlcli.server.private import PACKAGE_PARENT, RLCLI, private_server


def post(url: str, key: str, payload: dict | bytes) -> dict:
    proto = isinstance(payload, bytes)  # forward_backward: the SDK's protobuf body
    req = urllib.request.Request(url, data=payload if proto else json.dumps(payload).encode(), headers={
        "Content-Type": "application/x-protobuf" if proto else "application/json", "X-API-Key": key})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.loads(resp.read())


def result(base: str, key: str, request_id: str) -> bytes:
    """The future's answer, as bytes (SkyRL answers forward_backward's in protobuf)."""
    req = urllib.request.Request(f"{base}/api/v1/retrieve_future", data=json.dumps({"request_id": request_id}).encode(),
                                 headers={"Content-Type": "application/json", "X-API-Key": key})
    while True:
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if e.code != 408:
                raise


_seq = itertools.count(1)


def step_body(model_id: str) -> bytes:
    """A new forward_backward each call: SkyRL answers a repeated (model, seq_id) with the first one's future."""
    return sdk_forward_backward(model_id, seq_id=next(_seq))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--flood", type=int, default=24)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--size", choices=("tiny", "large"), default="tiny")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="rlcli-fairness-home-"))
    alone, flooded, flood_total = [], [], []
    try:  # the keys and the server's state go with the home, however the run ends
        env = dict(os.environ, RLCLI_HOME=str(home))
        keys = {name: subprocess.run([*RLCLI, "tenant", "add", name], env=env, capture_output=True, text=True,
                                     check=True, cwd=PACKAGE_PARENT).stdout.strip() for name in ("flood", "quiet")}
        model = str(model_dir(args.size))
        run(args, home, keys, model, alone, flooded, flood_total)
    except Exception:
        for log in home.glob("servers/*/server.log"):  # why, before the home goes
            print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:]), file=sys.stderr)
        raise
    finally:
        shutil.rmtree(home, ignore_errors=True)
    ratio = summary(flooded)["median"] / summary(alone)["median"]
    path = write_receipt("tenant-fairness", {
        "versions": versions("tinker"), "model": describe_model(Path(model)), "size": args.size,
        "fair_take": 1, "flood_requests": args.flood,
        "batch": "8 x 64 tokens", "train_micro_batch_size": 8,
        "quiet_alone_s": summary(alone), "quiet_flooded_s": summary(flooded), "flood_total_s": summary(flood_total),
        "flooded_over_alone": ratio, "raw": {"alone": alone, "flooded": flooded, "flood_total": flood_total}})
    print(f"quiet waits {ratio:.1f}x its idle time behind {args.flood} flood requests (take 1); "
          f"receipt {path}")


def run(args, home: Path, keys: dict, model: str, alone: list, flooded: list, flood_total: list) -> None:
    import tinker

    # A micro-batch of one request's 8 sequences: every pass, however many requests it takes, runs the one
    # compiled shape (unset, SkyRL fuses a pass into one batch and compiles each new request count anew).
    backend = json.dumps({"train_micro_batch_size": 8})
    with private_server(model, "--tenants", "--slots", "3", "--backend-config", backend, home=home) as srv:
        api = srv.url + "/api/v1"
        models = {name: tinker.ServiceClient(base_url=srv.url, api_key=key).create_lora_training_client(
            base_model=model, rank=4, seed=0).result().model_id for name, key in keys.items()}
        for name, key in keys.items():  # compile once, outside the timings
            result(srv.url, key, post(f"{api}/forward_backward", key, step_body(models[name]))["request_id"])

        def timed_quiet() -> float:
            t0 = time.perf_counter()
            queued = post(f"{api}/forward_backward", keys["quiet"], step_body(models["quiet"]))
            result(srv.url, keys["quiet"], queued["request_id"])
            return time.perf_counter() - t0

        for rep in range(args.reps):
            alone.append(timed_quiet())
            t_flood = time.perf_counter()
            # every flood request is in the server's queue (it answered with its id) before quiet's arrives
            ids = [post(f"{api}/forward_backward", keys["flood"], step_body(models["flood"]))["request_id"]
                   for _ in range(args.flood)]
            flooded.append(timed_quiet())
            for request_id in ids:
                result(srv.url, keys["flood"], request_id)
            flood_total.append(time.perf_counter() - t_flood)
            print(f"rep {rep + 1}/{args.reps}: quiet alone {alone[-1]:.2f}s, behind {args.flood} flood requests "
                  f"{flooded[-1]:.2f}s (the flood took {flood_total[-1]:.2f}s)", flush=True)


if __name__ == "__main__":
    main()
