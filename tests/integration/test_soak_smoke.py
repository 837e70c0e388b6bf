"""The soak benchmark at its tiniest (benchmarks/soak.py; the full size is `make soak`): half a minute of the whole mix
against a server of its own, then its receipt and plot. What is asserted is completeness, never speed: every series
sampled, every job started, requests sent and counted, a trend and a verdict per resource."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from benchmarks import soak
from rlcli.server.private import private_server
from tests.conftest import popen_rlcli, shared_compile_cache

pytestmark = [pytest.mark.server, pytest.mark.slow]


@pytest.fixture(scope="module")
def receipt(tmp_path_factory):
    out = tmp_path_factory.mktemp("soak")
    home = shared_compile_cache(tmp_path_factory.mktemp("soak-server") / "home")

    def cached(*args, **kwargs):  # its server loads the programs earlier sessions compiled, as every test server does
        return private_server(*args, **{**kwargs, "home": home})

    def forked(args: list[str], env: dict[str, str], log):  # not ~4 s of CPU importing torch & co. for each job
        return popen_rlcli(*args, env=env, stdout=log.fileno(), stderr=subprocess.STDOUT)

    before = signal.getsignal(signal.SIGTERM)  # main makes SIGTERM exit: no later test on this worker inherits it
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(soak, "private_server", cached)
            mp.setattr(soak, "start_job", forked)
            soak.main(minutes=0.5, interval=3, rate=2, loop_every=5, out=str(out))
    finally:
        signal.signal(signal.SIGTERM, before)
    (path,) = out.glob("soak-*.json")
    return path


def test_every_series_is_sampled_and_judged(receipt):
    data = json.loads(receipt.read_text())
    series = data["series"]
    assert len(series) >= 5
    resources = [k for k in soak.EXPECTED if not k.startswith("latency")]
    for key in (*resources, "futures_pending", "sampler_snapshots_most_per_model", "requests", "failed"):
        assert all(row.get(key) is not None for row in series), key
    assert series[-1]["server_rss_mb_engine"] > 0 and series[-1]["server_rss_mb_api"] > 0
    assert series[-1]["endpoint_processes"] >= 1 and series[-1]["futures_rows"] > 0
    trends = data["verdict"]["trends"]
    assert set(trends) == set(soak.EXPECTED)
    for k in resources:  # each judged by what it is expected to do: a line, or a sawtooth's peaks
        allowed = ("bounded", "growing") if soak.EXPECTED[k].startswith("bounded") else ("flat", "growing", "falling")
        assert trends[k]["verdict"] in allowed, (k, trends[k])
    assert series[-1]["engine_arrays"] > 0 and series[-1]["futures_past_retention"] == 0
    assert receipt.with_suffix(".png").stat().st_size > 0


def test_every_job_ran_and_every_request_is_counted(receipt):
    data = json.loads(receipt.read_text())
    assert {"sl-a", "sl-b", "rl", "loop-run"} <= {j["job"] for j in data["jobs"]}
    requests = data["requests"]
    assert requests and all("ms" in r and "ok" in r for r in requests)
    assert data["verdict"]["requests"] == len(requests) == sum(row["requests"] for row in data["series"]) + sum(
        r["done_s"] > data["series"][-1]["t_s"] for r in requests)
    assert data["verdict"]["failed_requests"] == sum(not r["ok"] for r in requests)
