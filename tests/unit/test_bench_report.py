"""benchmarks/report.py renders the README's table of current figures from receipts, and touches nothing else."""

from __future__ import annotations

import json

import pytest

from benchmarks import common, report
from tests.conftest import REPO

LOAD = {"before": [1.2, 1.0, 0.9], "after": [1.6, 1.1, 0.9]}
EPYC = {"cpu": "AMD EPYC", "cpu_count": 2, "memory_gb": 23.5, "gpu": None}


def cpu(fms: str) -> dict:
    return {**EPYC, "cpu_detail": {"family_model_stepping": fms, "vector": ["avx2"]}}


def spread(median: float, n: int = 12) -> dict:
    return {"median": median, "min": median - 0.05, "max": median + 0.07, "stdev": 0.03, "n": n,
            "q1": median - 0.02, "q3": median + 0.01, "iqr": 0.03}


def fused_receipt(stamp: str, size: str, ratios: dict[str, float], hardware: dict = EPYC) -> dict:
    runs = {loss: {"summary": {"fused": spread(1.5), "two_pass": spread(1.5 / r), "ratio": spread(r)},
                   "batch": {"sequences": 8, "tokens_per_step": 1040},
                   "floor": {"floor_fb_over_fwd_plus_fb": 0.79}} for loss, r in ratios.items()}
    return {"benchmark": "fused-vs-2pass", "created_utc": stamp, "config": {"size": size},
            "model": {"params": 26_224_128 if size == "large" else 1_049_984}, "runs": runs,
            "hardware": hardware, "load_average_1_5_15": LOAD}


def path_receipt(stamp: str, label: str, idle: float = 0.4, hardware: dict = EPYC, **more) -> dict:
    results = {k: {"wall": {"p50": 0.05}, "overhead": {"p50": 0.012}} for k in ("forward", "optim_step")}
    return {"benchmark": f"request-path-{label}", "label": label, "created_utc": stamp, "hardware": hardware,
            "results": results | {"sft_step": {"wall": {"p50": 0.19}}}, "idle": {"percent_of_one_core": idle},
            "rlcli_tree_commit": "0123456789abcdef", "config": {"max_lora_adapters": 32}, **more}


def ab_receipt(stamp: str, label: str, **more) -> dict:
    """An --ab-env receipt: its two arms' figures under "pooled", no "results" of its own (no row)."""
    receipt = {**path_receipt(stamp, label, **more), "pooled": {"A": {}, "B": {}}}
    del receipt["results"]
    return receipt


def others() -> list[dict]:
    start = {"results": {k: {"ready_s": spread(30.0, 3), "health_s": spread(4.0, 3)} for k in ("cold", "warm")},
             "config": {"size": "tiny"}}
    overhead = {"results": {"cross_entropy": {"bare": spread(0.25), "rlcli": spread(0.251),
                                              "pair_diff_rlcli_minus_bare_s": spread(0.001)}},
                "without_server": {"cross_entropy": {"median_us": {"bare": 0.05, "rlcli": 0.09}}}}
    imports = {"benchmark": "rlcli import, openai request+response records", "date": "2026-11-29T18:47:02+00:00",
               "config": {"bytes": 100_002_385}, "ratio": {"inprocess_speedup_vs_json": 2.47,
                                                           "subprocess_speedup_vs_json_subprocess": 2.04}}
    return [{"benchmark": "server-start", "created_utc": "20261129T200000Z", "load_average_1_5_15": LOAD, **start},
            path_receipt("20261129T200200Z", "after"), path_receipt("20261129T190000Z", "after", idle=9.9),
            {"benchmark": "overhead", "created_utc": "20261129T200100Z", **overhead}, imports]


def write(folder, receipts: list[dict]) -> None:
    for i, receipt in enumerate(receipts):
        (folder / f"r{i}.json").write_text(json.dumps(receipt))
    (folder / "half-written.json").write_text('{"benchmark": ')


def rows(text: str, start: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"| {start}")]


def test_render_takes_the_newest_receipt_per_benchmark_and_model(tmp_path):
    write(tmp_path, [fused_receipt("20261129T100000Z", "large", {"gspo": 0.99, "ppo": 0.98}),
                     fused_receipt("20261129T120000Z", "large", {"gspo": 0.71}),
                     fused_receipt("20261129T110000Z", "tiny", {"gspo": 0.66, "ppo": 0.62}), *others()])
    text = report.render(report.load_receipts(tmp_path))
    fused = rows(text, "fused / 2-pass")
    assert len(fused) == 2, text  # one row per model: the newest receipt's losses
    large = next(r for r in fused if "large model (26.2M)" in r)
    assert "gspo **0.71**" in large and "0.99" not in text and "ppo" not in large
    assert "tiny model (1.0M)" in text and "gspo **0.66**" in text and "ppo **0.62**" in text
    assert "IQR 0.69–0.72" in large and "12 pairs" in large and "floor 0.79" in large
    assert "cold-ish 30.0 s (n=3)" in text and "+1.0 ms a step" in text and "2.5× a json loop" in text
    assert "| 2× AMD EPYC |" in large
    # The newer request-path receipt, with the table size it ran with.
    path = rows(text, "request path")
    assert len(path) == 1 and "tiny model, 31 slots" in path[0], path
    assert "forward 50 (12)" in path[0] and "SFT step 8 × 64 190" in path[0] and "0.4% of a core" in path[0]


def test_one_row_per_machine_and_none_for_a_label_or_an_unnamed_machine_superseded(tmp_path):
    """The table is the newest per benchmark, model and machine: a newer label replaces an older one on the same
    machine; another machine keeps its row; a receipt naming no CPU goes once a newer one names one."""
    write(tmp_path, [path_receipt("20261201T000000Z", "old-label", idle=7.7),
                     path_receipt("20261202T000000Z", "a", idle=1.1, hardware=cpu("25/17/1")),
                     path_receipt("20261203T000000Z", "b", idle=2.2, hardware=cpu("25/17/1")),
                     path_receipt("20261201T120000Z", "c", idle=3.3, hardware=cpu("26/2/1")),
                     ab_receipt("20261204T000000Z", "ab", hardware=cpu("26/2/1")),
                     ab_receipt("20261205T000000Z", "x")])
    text = report.render(report.load_receipts(tmp_path))
    path = rows(text, "request path")
    assert [r.split("idle server ")[1].split("%")[0] for r in path] == ["2.2", "3.3"], path
    assert "25/17/1" in path[0] and "26/2/1" in path[1]


def test_render_without_receipts_says_how_to_make_them():
    assert "run `make bench`" in report.render([])


def test_series_names_the_benchmark_without_its_label():
    receipt = path_receipt("20261201T000000Z", "32slots", hardware=cpu("25/17/1"))
    assert report.series(receipt) == report.Series("request-path", "tiny", "", "25/17/1 avx2", "32slots")
    assert report.series(receipt, by_label=False).label == ""
    imports = {"benchmark": "rlcli import, otel records", "config": {"format": "otel"}}
    assert report.series(imports)[:2] == ("import", "otel")


def test_replace_section_rewrites_only_between_the_markers():
    readme = f"# title\n\n## Benchmarks\n\n{report.START}\nold table\n{report.END}\n\nLicense: Apache-2.0.\n"
    once = report.replace_section(readme, "new table")
    assert once == f"# title\n\n## Benchmarks\n\n{report.START}\nnew table\n{report.END}\n\nLicense: Apache-2.0.\n"
    assert report.replace_section(once, "new table") == once
    with pytest.raises(SystemExit, match="bench:start"):
        report.replace_section("# no markers\n", "x")


def test_the_readme_has_the_markers():
    text = (REPO / "README.md").read_text()
    assert text.count(report.START) == 1 and text.count(report.END) == 1
    assert text.index(report.START) < text.index(report.END) < text.index("License:")


def test_the_readmes_table_is_what_the_receipts_in_the_tree_render():
    """A receipt added or removed without `python -m benchmarks.report` leaves the README's figures stale."""
    text = (REPO / "README.md").read_text()
    table = text.split(report.START + "\n", 1)[1].split("\n" + report.END, 1)[0]
    expected = report.render(report.load_receipts(report.RECEIPTS), report.load_results(REPO / "notebooks" / "results"))
    assert table == expected, "run `python -m benchmarks.report` and commit README.md"


def test_render_adds_the_rl_notebooks_recorded_result():
    rl = {"dataset": "arithmetic (x and y in 0..9)", "params": {"loss": "gspo"}, "steps": 60,
          "heldout_correct_before": 0.215, "heldout_correct_after": 0.424, "heldout_problems": 18, "eval_samples": 8,
          "eval_temperature": 1.0, "reward_first_fifth": 0.19, "reward_last_fifth": 0.51, "minutes": 3.7}
    text = report.render([], {"gsm8k": rl})
    assert "held-out correct 0.21 → 0.42 (18 problems × 8 answers, temperature 1)" in text
    assert "`notebooks/results/gsm8k.json`" in text and "60 steps" in text
    assert "held-out correct" not in report.render([])


def test_import_rows_take_the_newest_receipt_of_each_log_format(tmp_path):
    def receipt(fmt, date, ratio):
        return {"benchmark": f"rlcli import, {fmt} records", "date": date,
                "config": {"bytes": 100_000_000, "format": fmt}, "peak_rss_mb": {"import_subprocess": 31.0},
                "ratio": {"inprocess_speedup_vs_json": ratio, "subprocess_speedup_vs_json_subprocess": 1.9,
                          "inprocess_speedup_vs_json_passthrough": 1.4},
                "ratio_cpu": {"inprocess": 2.3, "subprocess": 2.1}}  # fmt: skip

    day = "2026-11-{}T10:00:00+00:00"
    write(tmp_path, [receipt("otel", day.format(30), 2.2), receipt("otel", day.format(29), 9.9),
                     receipt("gemini", day.format(30), 2.6)])  # fmt: skip
    found = rows(report.render(report.load_receipts(tmp_path)), "`rlcli import`")
    assert len(found) == 2 and "9.9×" not in "".join(found)
    otel = next(r for r in found if "OpenTelemetry traces" in r)
    assert "2.2× a json loop's speed in-process" in otel and "peak RSS 31 MB" in otel
    assert "(CPU time 2.3×, 2.1×)" in otel


def test_the_gpu_check_row_gives_the_ratio_and_the_exactness(tmp_path):
    pairs = {"fused_median_s": 0.218, "two_pass_median_s": 0.332, "ratio_median": 0.669, "floor": 0.77}
    write(tmp_path, [{"benchmark": "gpu-check", "created_utc": "20261130T210229Z",
                      "hardware": {"gpu": "NVIDIA H200, 143771 MiB", "cpu_count": 16},
                      "model": {"params": 1_413_604_352, "dtype": "bfloat16"},
                      "headline": {"pairs": pairs, "exactness": {"fused_loss_vs_float64": 3.9e-9}}}])
    row = rows(report.render(report.load_receipts(tmp_path)), "GPU check")[0]
    assert "1.41B-param bfloat16" in row and "**0.67**" in row and "3.9e-09" in row and "| NVIDIA H200 |" in row


def test_receipts_tell_cpus_of_one_name_apart(tmp_path, monkeypatch):
    """Two machines named "AMD EPYC" ran the same step at 48 and 133 ms: receipts keep family/model and the vector
    features, read from /proc/cpuinfo's first processor."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 17\nstepping\t: 1\ncpu MHz\t\t: 2400.000\n"
                       "flags\t\t: fpu sse4_2 avx avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t\t: avx2\n")
    real = common.Path

    def fake_path(name, *rest):
        return cpuinfo if str(name) == "/proc/cpuinfo" else real(name, *rest)

    monkeypatch.setattr(common, "Path", fake_path)
    assert common.cpu_detail() == {"family_model_stepping": "25/17/1", "mhz": "2400.000",
                                   "vector": ["avx2", "avx512f", "avx512_bf16"]}


def test_a_receipt_records_how_to_run_it_again(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/somewhere/benchmarks/request_path.py", "--label", "x"])
    main = type("Main", (), {"__spec__": type("Spec", (), {"name": "benchmarks.request_path"})()})()
    monkeypatch.setitem(__import__("sys").modules, "__main__", main)
    assert common.command_line() == "python -m benchmarks.request_path --label x"


def test_server_start_row_shows_the_compare_tree_of_an_ab_run(tmp_path):
    results = {k: {"ready_s": spread(17.0 if k != "warm_compare" else 25.0, 3), "health_s": spread(3.0, 3)}
               for k in ("cold", "warm", "warm_compare")}
    write(tmp_path, [{"benchmark": "server-start", "created_utc": "20261202T120000Z", "label": "ab",
                      "config": {"size": "tiny"}, "compare_tree_commit": "a3453c3159ca", "results": results,
                      "load_average_1_5_15": LOAD}])
    row = rows(report.render(report.load_receipts(tmp_path)), "`rlcli serve start`")[0]
    assert "warm 17.0 s (n=3" in row and "the compare tree (a3453c3): warm 25.0 s" in row


def breakdown_receipt(stamp: str, model: str, ratio: float) -> dict:
    figures = {"rlcli_over_hf_request": ratio, "rlcli_decode_over_bound": 6.0}
    return {"benchmark": "sampling-breakdown", "created_utc": stamp, "config": {"model": model}, "hardware": EPYC,
            "hf": {"runs": {}}, "breakdown": {"8x32": figures, "64x32": {**figures, "rlcli_over_hf_request": 1.5}},
            "exactness": {"distinct_prompts": {"identical": 7, "of": 8}}}


def test_each_models_sampling_breakdown_has_its_own_row_and_an_arm_without_hf_has_none():
    receipts = [breakdown_receipt("20261205T010000Z", "embedded", 0.83),
                breakdown_receipt("20261205T020000Z", "26m", 0.65),
                {**breakdown_receipt("20261205T030000Z", "embedded", 9.9), "hf": None}]  # an A/B of servers
    rows = report.receipt_rows([{**r, "_file": f"r{i}.json"} for i, r in enumerate(receipts)])
    assert len(rows) == 2 and not any("9.90" in row for row in rows)
    embedded = next(row for row in rows if "embedded model" in row)
    assert "**0.83** / **1.50** (8 × 32, 64 × 32)" in embedded and "identical to HF's on 7 of 8" in embedded


def test_a_receipt_never_holds_a_tenant_key(tmp_path):
    from benchmarks.common import write_receipt
    from rlcli import tenants

    key = tenants.KEY_PREFIX + "k" * 43
    path = write_receipt("keys", {"made": key, "placeholder": "tml-bench"}, folder=tmp_path)
    body = json.loads(path.read_text())
    assert (body["made"], body["placeholder"]) == ("<API_KEY>", "tml-bench") and key not in path.read_text()


def test_the_trust_receipts_have_rows_that_count_what_they_ran():
    surface = {"surface": "skyrl", "requests": 468, "findings": [{"what": "500"}],
               "hand_made": {"protobuf": {"sent": 34}, "bodies": {"sent": 6}}}
    fuzz = {"benchmark": "fuzz", "created_utc": "20261205T050000Z", "hardware": EPYC, "surfaces": [surface],
            "must_hold": False, "_file": "fuzz.json"}
    trend = {"per_hour": 386.0}
    soak = {"benchmark": "soak", "created_utc": "20261205T050000Z", "hardware": EPYC, "_file": "soak.json",
            "config": {"minutes": 30}, "verdict": {"failed_requests": 2, "requests": 3575, "trends": {
                "server_rss_mb": {**trend, "verdict": "growing"}, "server_fds": {**trend, "verdict": "flat"}}}}
    kill = {"benchmark": "kill-loop", "created_utc": "20261205T050000Z", "hardware": EPYC, "_file": "kill.json",
            "seed": 3, "summary": {"landed": 52, "survived": 51, "by_stage": {"ingest": {}, "export": {}},
                                   "rounds_with_broken_invariants": [4]}}
    rows = "\n".join(report.receipt_rows([fuzz, soak, kill]))
    assert "; rounds with a broken invariant 1 |" in rows  # a receipt from before server kills were counted
    kill["summary"] |= {"server_kills": 7}
    assert "invariant 1; 7 of them kill -9 of the server |" in "\n".join(report.receipt_rows([kill]))
    assert "skyrl 468 generated + 40 hand-made; **1** findings in this run, **a must-hold broke**" in rows
    assert "**2** failed of 3,575 requests; flat after warm-up: 1 of 2 series; growing: server_rss_mb +386/h" in rows
    assert "**51** of 52 kill points survived across 2 stages; rounds with a broken invariant 1" in rows
    soak["verdict"]["trends"] |= {"disk_mb_checkpoints_loop": {**trend, "verdict": "growing", "expected": "grows by "
                                                               "design"},
                                  "disk_mb_capture": {**trend, "verdict": "flat", "expected": "flat: a retention"}}
    rows = "\n".join(report.receipt_rows([soak]))
    assert ("flat after warm-up: 2 of 4 series; growing: server_rss_mb +386/h; growing as expected (bounded or by "
            "design): disk_mb_checkpoints_loop +386/h") in rows


def test_a_soak_judged_by_trend_and_peak_names_what_grew():
    trends = {"server_rss_mb": {"verdict": "flat", "per_hour": 12.0, "expected": "flat"},
              "server_fds": {"verdict": "growing", "per_hour": 30.0, "expected": "flat"},
              "disk_mb_capture": {"verdict": "bounded", "trend_per_hour": 90.0, "expected": "bounded: a retention"},
              "futures_rows": {"verdict": "growing", "per_hour": 500.0, "expected": "bounded: a retention"},
              "disk_mb_checkpoints_loop": {"verdict": "growing", "per_hour": 40.0, "expected": "grows by design"}}
    soak = {"benchmark": "soak", "created_utc": "20261205T120000Z", "hardware": EPYC, "_file": "soak.json",
            "config": {"minutes": 60, "warmup_share": 0.25, "peak_rule": "..."},
            "verdict": {"failed_requests": 0, "requests": 7000, "trends": trends}}
    rows = "\n".join(report.receipt_rows([soak]))
    assert ("**0** failed of 7,000 requests; after 15 min of warm-up **2 of 4** judged series flat or within their "
            "retention; growing: server_fds +30/h, futures_rows +500/h; grows by design: disk_mb_checkpoints_loop "
            "+40/h") in rows


def test_the_steady_soak_has_a_row_of_its_own():
    base = {"benchmark": "soak", "created_utc": "20261205T120000Z", "hardware": EPYC,
            "verdict": {"failed_requests": 0, "requests": 10, "trends": {
                "server_rss_mb": {"verdict": "flat", "per_hour": 1.0, "expected": "flat"}}}}
    full = {**base, "_file": "full.json", "config": {"minutes": 75, "peak_rule": "...", "size": "full"}}
    steady = {**base, "_file": "steady.json", "created_utc": "20261205T130000Z",
              "config": {"minutes": 30, "peak_rule": "...", "size": "steady"}}
    old = {**base, "_file": "old.json", "created_utc": "20261205T090000Z", "config": {"minutes": 45}}
    rows = report.receipt_rows([old, full, steady])
    assert len(rows) == 2  # the full mix's newest (the old receipt, of the same mix, superseded) and the steady one
    assert any("steady mix: trainers, RL and endpoint, no loop" in r and "steady.json" in r for r in rows)
    assert any("trainers, RL, endpoint, loop and rollback" in r and "full.json" in r for r in rows)
