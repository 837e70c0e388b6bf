"""rlcli server extension (engine side of `--tenants`): the engine takes pending work round-robin between tenants.

Runs INSIDE the server venv (Python 3.12): standard library and skyrl only; never rlcli. rlcli_tenants.py
installs it when the launcher calls `register("engine")` in the engine process.

SkyRL 0.4.0's engine takes every pending request of a kind in arrival (request id) order each pass: all
batchable forward_backward / forward passes (then runs them model by model, the earliest model first), and
all single requests (optim_step, save_weights, ...) one after another. So a tenant that queues many requests
makes everyone behind it wait for all of them. Here, in each pass and for each kind (forward_backward,
forward, single requests), when more than one tenant has requests pending:
- each tenant contributes at most TAKE of its earliest requests (RLCLI_FAIR_TAKE, default 1; 0 turns this
  off); the rest stay
  pending for the next pass (rlcli_wake's loop goes round again at once while work is pending);
- tenants go in turn: the one served longest ago first, so its models' passes run and complete first.
With one tenant pending nothing changes. Order within a model is kept: a tenant's requests are taken as a
prefix in id order, and a single request (e.g. optim_step) never runs ahead of a pass of its model that this
pass deferred. A model's tenant comes from the gate's owners file (rlcli_tenants.OWNERS_FILE, read as it
grows); a model nobody owns (created before --tenants) is a tenant of its own.

The hook is TinkerEngine._load_requests, which each finder calls with its candidates, in id order, before it
reads their payloads: choosing there means deferred requests' payloads are not even read.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path

from tenant_owners import ModelTenants  # a sibling in runtime/ (the launcher's folder is on sys.path)

NAME = "rlcli_fair"
VERSION = "1.0"
TAKE_ENV = "RLCLI_FAIR_TAKE"
DEFAULT_TAKE = 1
PASS_FINDERS = ("find_batchable_model_passes",)
SINGLE_FINDERS = ("find_single_requests",)


def fair_pick(candidates: list[tuple], tenant_of, served: dict, take: int) -> tuple[list[tuple], dict[str, int]]:
    """Choose from candidates (request_id, model_id, ...), in id order, what one engine pass takes.

    Returns the chosen candidates (tenants in turn, the one served longest ago first; each tenant's requests
    in id order) and, per model, the smallest request id left for later. `served` maps tenant -> the pass
    number it was last served in, and is updated; tenants never served go first, by their earliest request.
    """
    lanes: dict[str, list[tuple]] = {}
    for item in candidates:
        lanes.setdefault(tenant_of(item[1]), []).append(item)
    if len(lanes) <= 1:
        return list(candidates), {}
    turn = served.get("", 0) + 1
    served[""] = turn  # the pass counter lives under a name no tenant has
    order = sorted(lanes, key=lambda t: (served.get(t, 0), lanes[t][0][0]))
    chosen, later = [], {}
    for tenant in order:
        chosen += lanes[tenant][:take]
        served[tenant] = turn
        for request_id, model_id, *_ in lanes[tenant][take:]:
            later[model_id] = min(later.get(model_id, request_id), request_id)
    return chosen, later


def check_targets():
    import pins  # a sibling in runtime/: the launcher's folder is on sys.path
    from skyrl.tinker import engine

    cls = engine.TinkerEngine
    found = {f"TinkerEngine.{n}": getattr(cls, n, None)
             for n in ("_load_requests", "process_pending_requests_once", *PASS_FINDERS, *SINGLE_FINDERS)}

    def calls_load(name: str) -> bool:  # SkyRL's own code, under any wrapper put around it first (rlcli_wake's)
        fn = inspect.unwrap(getattr(cls, name, None) or (lambda: None))
        return "_load_requests" in getattr(fn, "__code__", compile("", "", "exec")).co_names

    found.update({f"TinkerEngine.{n} calling self._load_requests": calls_load(n)
                  for n in (*PASS_FINDERS, *SINGLE_FINDERS)})
    pins.require(NAME, found)
    return cls


def install(owners_path: Path) -> None:
    cls = check_targets()
    take = int(os.environ.get(TAKE_ENV) or DEFAULT_TAKE)
    if take < 1:  # RLCLI_FAIR_TAKE=0: SkyRL's own arrival order (what benchmarks/tenant_fairness.py compares)
        print(f"[{NAME} {VERSION}] {TAKE_ENV}={take}: the engine keeps SkyRL's arrival order", file=sys.stderr)
        return
    tenant_of = ModelTenants(owners_path)
    served: dict[str, dict] = {"passes": {}, "single": {}}
    current = {"kind": None, "later": {}}  # the finder running now; passes deferred in this engine pass
    original_load = cls._load_requests

    @functools.wraps(original_load)
    def load_requests(self, session, requests):
        kind = current["kind"]
        if kind is None:
            return original_load(self, session, requests)
        later = current["later"]
        if kind == "single" and later:  # never ahead of a deferred pass of the same model
            requests = [r for r in requests if r[1] not in later or r[0] < later[r[1]]]
        tenant_of.refresh()
        chosen, deferred = fair_pick(list(requests), tenant_of, served[kind], take)
        for model_id, request_id in deferred.items():
            later[model_id] = min(later.get(model_id, request_id), request_id)
        return original_load(self, session, chosen)

    def finder(name: str, kind: str):
        original = getattr(cls, name)

        @functools.wraps(original)
        def wrapped(self, *args, **kwargs):
            current["kind"] = kind
            try:
                return original(self, *args, **kwargs)
            finally:
                current["kind"] = None
        setattr(cls, name, wrapped)

    original_once = cls.process_pending_requests_once

    @functools.wraps(original_once)
    def once(self):
        current["later"] = {}
        return original_once(self)

    for name in PASS_FINDERS:
        finder(name, "passes")
    for name in SINGLE_FINDERS:
        finder(name, "single")
    cls._load_requests = load_requests
    cls.process_pending_requests_once = once
    print(f"[{NAME} {VERSION}] the engine takes pending work round-robin between tenants, at most {take} "
          "request(s) of each per pass while others wait", file=sys.stderr, flush=True)


if __name__ == "__main__":
    check_targets()
    print(f"{NAME} {VERSION}: TinkerEngine._load_requests and the finders that call it present")
