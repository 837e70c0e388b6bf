"""The sampling breakdown at its tiniest size against the real SkyRL server on CPU (benchmarks/sampling_breakdown.py;
the full size is `python -m benchmarks.sampling_breakdown`): one shape of 2 x 4 tokens, one round, two prompts, then
HF's generate and the roofline. What is asserted holds at any speed: every request was split with the engine's own
time, both arms made the same token counts, every figure of the breakdown is there, the receipt is written."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import sampling_breakdown as bench
from benchmarks.common import write_receipt

pytestmark = [pytest.mark.server, pytest.mark.slow]
SHAPES = ((2, 4),)


@pytest.fixture(scope="module")
def results(server):
    with pytest.MonkeyPatch.context() as mp:  # the benchmark's own tinker clients: the server's home and key
        mp.setenv("RLCLI_HOME", server.env["RLCLI_HOME"])
        mp.setenv("TINKER_API_KEY", server.env.get("TINKER_API_KEY", "tml-self-hosted"))
        measured = bench.measure(server, Path(server.model), rounds=1, shapes=SHAPES, exact_prompts=2)
    return bench.finish(measured, Path(server.model), rounds=1, shapes=SHAPES)


def test_every_request_is_split_with_the_engines_own_time(results):
    base = results["rlcli"]["base"]["2x4"]
    for run in (base["first_t1"], base["first_tn"], *base["t1"], *base["tn"]):
        assert run["engine_s"] is not None and 0 < run["engine_s"] <= run["wall_s"] + 0.05, run
    saves = results["rlcli"]["lora"]["save_weights_and_get_sampling_client"]
    assert len(saves) == 2 and all(s["engine_s"] is not None for s in saves), saves


def test_both_arms_make_the_same_token_counts(results):
    assert [len(t) for t in results["rlcli"]["base"]["2x4"]["tn"][0]["tokens"]] == [4, 4]
    assert len(results["hf"]["runs"]["2x4"]["tokens_row0"]) == 4
    for arm in ("distinct_greedy", "lora_distinct_greedy"):
        assert [len(t) for t in results["rlcli"][arm]["tokens"]] == [4, 4]
    assert [len(t) for t in results["hf"]["distinct_greedy_tokens"]] == [4, 4]
    assert results["exactness"]["distinct_prompts"]["of"] == 2


def test_the_breakdown_and_roofline_are_complete(results, tmp_path):
    figures = results["breakdown"]["2x4"]
    for name in ("compile_tn_s", "prefill_s", "decode_per_token_s", "overhead_s", "handover_s", "hf_generate_s",
                 "rlcli_decode_over_bound", "hf_decode_over_bound"):
        assert math.isfinite(figures[name]), (name, figures)
    roof = results["roofline"]["2x4"]  # 32 + 4 tokens: SkyRL's round_up_seq_len gives 48
    assert roof["attended_length"] == 48 and roof["weight_bytes"] == 4 * results["model"]["params"]
    assert results["machine"]["copy_bandwidth_bytes_per_s"] > 0 and results["machine"]["gemm_flops_per_s"]["peak"] > 0
    receipt = write_receipt("sampling-breakdown", results, tmp_path)
    assert json.loads(receipt.read_text())["breakdown"]["2x4"]["decode_per_token_s"] == figures["decode_per_token_s"]


def test_a_receipt_compares_with_itself_exactly(results):
    same = bench.against(results, results)
    assert same["distinct_greedy"] == {"identical_sequences": 2, "of": 2, "max_logprob_difference": 0.0}
