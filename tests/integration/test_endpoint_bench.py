"""The endpoint benchmark at its tiniest size against the real SkyRL server on CPU: the endpoint started over the
session's server, the overhead rounds, 1/8/32 clients and the champion moving under load, and its receipt
(benchmarks/endpoint.py; the full size is `python -m benchmarks.endpoint`). What is asserted is what must hold at
any speed: the same tokens both ways, no failed request, every answer from weights the ledger named."""

from __future__ import annotations

import json

import pytest

from benchmarks import endpoint
from benchmarks.common import write_receipt

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def results(server, tmp_path_factory):
    root = tmp_path_factory.mktemp("endpoint-bench")
    with pytest.MonkeyPatch.context() as mp:  # the benchmark's own tinker clients: the server's home and key
        mp.setenv("RLCLI_HOME", server.env["RLCLI_HOME"])
        mp.setenv("TINKER_API_KEY", server.env.get("TINKER_API_KEY", "tml-self-hosted"))
        return endpoint.measure(server, root / "run", requests=2, seconds=0.5)


def test_both_arms_sample_the_same_tokens(results):
    o = results["overhead"]
    assert o["same_tokens"], o["completion_tokens"]
    assert len(o["raw_ms"]["endpoint"]) == len(o["raw_ms"]["bare"]) == 2


def test_every_client_count_is_served_without_errors(results):
    t = results["throughput"]["endpoint"]
    for k in endpoint.CLIENTS:
        assert t[str(k)]["errors"] == 0, t[str(k)]["first_errors"] or t[str(k)]["warm_up"]["first_errors"]
        assert t[str(k)]["warm_up"]["requests"] >= k  # one request of each client at least


def test_no_request_fails_while_the_champion_moves(results, tmp_path):
    p = results["promotions"]
    assert p["failures"] == 0, [one["first_failures"] for one in p["passes"]]
    assert p["iteration_header_mismatches"] == 0
    assert all(set(one["answers_by_weights"]) <= {"base", "A", "B"} for one in p["passes"])
    receipt = write_receipt("endpoint", {"headline": endpoint.headline(results), "results": results}, tmp_path)
    assert json.loads(receipt.read_text())["headline"]["failures_during_promotions"] == 0
