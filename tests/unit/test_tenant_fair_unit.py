"""The engine's round-robin between tenants (runtime/rlcli_tenants.py's fair_pick) and the owners record's compaction
(runtime/tenant_owners.py): pure pieces, no server."""

from __future__ import annotations

import importlib.util
import json
import sys

from rlcli.server import commands


def runtime(name: str):
    if str(commands.RUNTIME_DIR) not in sys.path:  # siblings import each other, as in the launcher
        sys.path.insert(0, str(commands.RUNTIME_DIR))
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", commands.RUNTIME_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OWNER = {"fa": "flood", "fb": "flood", "q": "quiet"}.get


def test_one_tenant_keeps_everything_in_arrival_order():
    fair = runtime("rlcli_tenants")
    pending = [(1, "fa"), (2, "fb"), (3, "fa")]
    assert fair.fair_pick(pending, OWNER, {}, take=1) == (pending, {})


def test_a_flood_is_capped_and_the_quiet_tenant_goes_in_turn():
    fair = runtime("rlcli_tenants")
    served: dict = {}
    flood = [(i, "fa" if i % 2 else "fb") for i in range(1, 25)]
    chosen, later = fair.fair_pick([*flood, (25, "q")], OWNER, served, take=1)
    # flood's earliest request first (never served, earliest arrival), then quiet's; the rest waits
    assert chosen == [(1, "fa"), (25, "q")]
    assert later == {"fb": 2, "fa": 3}
    # next pass: quiet was served as recently as flood; with a tie the earliest request goes first
    chosen, _ = fair.fair_pick([*flood[1:], (26, "q")], OWNER, served, take=2)
    assert chosen == [(2, "fb"), (3, "fa"), (26, "q")]


def test_the_tenant_served_longest_ago_goes_first():
    fair = runtime("rlcli_tenants")
    served = {"": 5, "flood": 5, "quiet": 3}
    chosen, _ = fair.fair_pick([(1, "fa"), (2, "q"), (3, "x")], OWNER, served, take=1)
    # an unknown model is a tenant of its own, never served: first; then quiet (3) before flood (5)
    assert chosen == [(3, "x"), (2, "q"), (1, "fa")]


def test_owners_compaction_keeps_what_isolation_needs(tmp_path):
    owners_mod = runtime("tenant_owners")
    path = tmp_path / "owners.jsonl"
    owners = owners_mod.Owners(path, keep_futures=3)
    owners.record("session", "s1", "alice")
    owners.record("model", "m1", "alice")
    owners.record("model", "m2", "bob")
    owners.record("unload", "m2", "bob")
    owners.queued["alice"] = {"1"}  # not yet retrieved: kept however old
    for i in range(1, 8):  # the 7th future passes 2 x keep: compacted in place
        owners.record("future", str(i), "alice" if i < 5 else "bob")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 3 + 1 + 4 and path.stat().st_mode & 0o777 == 0o600
    assert ["future", "2", "alice"] not in lines and ["future", "1", "alice"] in lines
    for i in range(8, 12):
        owners.record("future", str(i), "bob")
    again = owners_mod.Owners(path, keep_futures=3)  # a restart compacts too
    assert again.owner.get("m2") == "bob" and again.models == {"alice": {"m1"}, "bob": set()}
    assert again.owner.get("s1") == "alice" and "2" not in again.owner and "5" not in again.owner
    assert list(again.futures) == ["9", "10", "11"]  # a restart forgets what was waiting, so 1 goes too
    assert len(path.read_text().splitlines()) == 3 + 1 + 3


def test_the_engine_reads_the_owners_file_as_it_grows_and_after_compaction(tmp_path):
    owners_mod = runtime("tenant_owners")
    path = tmp_path / "owners.jsonl"
    owners = owners_mod.Owners(path, keep_futures=1)
    tenant_of = owners_mod.ModelTenants(path)
    assert tenant_of("m1") == "model:m1"  # no file yet: every model its own tenant
    owners.record("model", "m1", "alice")
    with open(path, "a") as f:
        f.write('["model", "m2", "bo')  # a line still being written is not read
    tenant_of.refresh()
    assert tenant_of("m1") == "alice" and tenant_of("m2") == "model:m2"
    owners = owners_mod.Owners(path, keep_futures=1)  # the torn line is dropped by a restart's compaction
    owners.record("model", "m3", "bob")
    tenant_of.refresh()
    assert tenant_of("m1") == "alice" and tenant_of("m3") == "bob"


def test_the_readiness_probe_the_server_forgets_is_the_internal_keys_alone():
    """serve start's probe tag and the route that forgets it are written once (runtime/shared.py); with --tenants
    no tenant's key reaches that route."""
    from rlcli.server import process
    from rlcli.server.runtime import shared

    assert (process.READINESS_TAG, process.FORGET_ROUTE) == (shared.READINESS_TAG, shared.FORGET_ROUTE)
    assert shared.FORGET_ROUTE in runtime("rlcli_tenants").ADMIN
