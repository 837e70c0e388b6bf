"""Each notebook runs end to end with papermill at its smallest size, against the session's server, and
records a sane result; the results `make notebooks` recorded at full size are there and sane too.

The notebooks' own dependencies (env/notebooks.txt: papermill, ipykernel, matplotlib) are part of the
client venv `make venv` builds; a venv without them fails here with the line that says how to get them.
"""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from rlcli.train.folder import RUN_INFO
from tests import notebook_kernel
from tests.conftest import REPO

pytestmark = [pytest.mark.server, pytest.mark.slow]
NOTEBOOKS = REPO / "notebooks"
# At collection (a spec lookup, not an import: papermill's import costs ~1.6 s in every worker), so that a venv
# without them fails before the session's server is started for nothing.
_missing = [name for name in ("ipykernel", "matplotlib", "papermill") if importlib.util.find_spec(name) is None]
if _missing:
    raise ImportError(f"{_missing[0]} is missing: the notebook tests need env/notebooks.txt in .venv (make venv)")


@pytest.fixture(scope="module", autouse=True)
def kernels_fork_from_the_zygote(tmp_path_factory):
    """The notebooks' kernels run rlcli.lab's commands in this worker's zygote, as run_rlcli runs the other tests'
    (tests/notebook_kernel.py)."""
    with notebook_kernel.kernels_fork(tmp_path_factory.mktemp("kernel")):
        yield


def execute(name: str, tmp_path, parameters: dict) -> dict:
    """Run notebooks/<name>.ipynb (results into tmp_path) and return the JSON its last cell printed, after
    checking it is the result the notebook recorded."""
    out = tmp_path / f"{name}.ipynb"
    parameters = {**parameters, "results_dir": str(tmp_path / "results")}
    import papermill

    papermill.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(out), parameters=parameters,
                               cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False,
                               execution_timeout=900)
    book = json.loads(out.read_text())
    last = [c for c in book["cells"] if c["cell_type"] == "code"][-1]
    # A stream's text is a string or a list of strings; joining handles both.
    text = "".join("".join(o.get("text", "")) for o in last["outputs"] if o.get("output_type") == "stream")
    images = [o for c in book["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images, "the notebook drew no plot"
    result = json.loads(text.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "results" / f"{name}.json").read_text())
    return result


def assert_finite(result: dict, keys: tuple[str, ...]) -> None:
    missing = [k for k in keys if k not in result]
    assert not missing, f"result lacks {missing}: {result}"
    assert all(math.isfinite(result[k]) for k in keys), result


@pytest.mark.timeout(900)
def test_fused_vs_2pass_notebook_records_its_medians(server, tmp_path):
    result = execute("fused_vs_2pass", tmp_path, dict(size="tiny", loss="gspo", prompts=2, samples=2, max_tokens=8,
                                                      warmup=1, pairs=2, floor_reps=1, base_url=server.url,
                                                      receipt_dir=str(tmp_path / "receipts")))
    assert_finite(result, ("fused_median_s", "two_pass_median_s", "ratio_median", "floor"))
    receipt = json.loads(open(result["receipt"]).read())
    assert receipt["command"].startswith("python -m benchmarks.fused_vs_2pass --losses gspo")  # as `make bench` runs it
    assert len(receipt["runs"]["gspo"]["raw_s"]["fused"]) == 2 and receipt["headline"]["gspo"] == {
        k: result[k] for k in ("fused_median_s", "two_pass_median_s", "ratio_median", "floor")}


@pytest.mark.timeout(900)
def test_learning_curve_notebook_plots_metrics_jsonl(server, tmp_path):
    result = execute("learning_curve", tmp_path, dict(sl_steps=2, rl_steps=1, base_url=server.url,
                                                      run_dir=str(tmp_path / "run")))
    assert_finite(result, ("sl_first_nll", "sl_last_nll", "rl_first_reward", "rl_last_reward"))
    assert result["sl_steps"] == 2 and result["rl_steps"] == 1
    assert result["run_folder"] == str(tmp_path / "run")


@pytest.mark.timeout(900)
def test_gsm8k_notebook_evaluates_before_and_after_training(server, tmp_path):
    result = execute("gsm8k", tmp_path, dict(steps=2, batch_size=2, group_size=2, eval_size=4, eval_samples=1,
                                             eval_every=0, base_url=server.url, run_dir=str(tmp_path / "run")))
    assert_finite(result, ("heldout_correct_before", "heldout_correct_after", "reward_first_fifth", "minutes"))
    assert result["steps"] == 2 and result["heldout_problems"] == 4 and result["eval_temperature"] == 1.0
    assert result["checkpoint"].startswith("tinker://") and "0..9" in result["dataset"]
    assert all(0 <= result[k] <= 1 for k in ("heldout_correct_before", "heldout_correct_after"))


@pytest.mark.timeout(900)
def test_distill_notebook_records_both_skills_and_the_retained_gain(server, tmp_path):
    result = execute("distill", tmp_path, dict(new_chats=8, sft_epochs=1, steps=2, batch_size=2, group_size=2,
                                               max_tokens=4, eval_size=2, eval_every=1, eval_samples=2,
                                               door_prompts=2, keep_batch_size=2, base_url=server.url,
                                               run_dir=str(tmp_path / "run"), rl_steps=1, rl_batch_size=2,
                                               rl_group_size=2, compress_steps=1, compress_batch_size=2,
                                               compress_group_size=2))
    assert_finite(result, ("teacher_kl_first_fifth", "teacher_kl_last_fifth", "heldout_kl_first", "heldout_kl_last"))
    assert result["steps"] == 2 and result["heldout_problems"] == 2 and result["new_skill_prompts"] == 2
    scores = [result[f"{kind}_{model}"] for kind in ("heldout_correct", "heldout_greedy", "new_skill",
                                                     "new_skill_greedy") for model in ("base", "sft", "distilled")]
    assert all(0 <= v <= 1 for v in scores), result
    # distilled - SFT on each skill, within the interval of the two sampled scores
    for change, kind in ((result["retained_gain"], "heldout_correct"), (result["new_skill_change"], "new_skill")):
        assert change["low"] <= change["gain"] <= change["high"]
        assert change["gain"] == pytest.approx(result[f"{kind}_distilled"] - result[f"{kind}_sft"])
    assert result["eval_samples"] == 2 and result["params"]["keep"]
    # --keep: the door chats' prompts went into every distillation step beside the sums, toward the SFT weights
    info = json.loads((tmp_path / "run" / "distill" / RUN_INFO).read_text())
    assert info["keep"].endswith("doors-train.jsonl") and info["keep_batch_size"] == 2
    assert result["compress"]["steps"] == 1 and 0 <= result["compress"]["heldout_correct_student"] <= 1


@pytest.mark.timeout(900)
def test_continual_loop_notebook_records_three_iterations(server, tmp_path):
    result = execute("continual_loop", tmp_path, dict(chats=16, steps=2, max_tokens=8, eval_limit=4,
                                                      base_url=server.url, run_dir=str(tmp_path / "run")))
    assert result["iterations"] == 3 and len(result["decisions"]) == 3
    assert all(d in ("promoted", "rejected", "skipped") for d in result["decisions"])
    scores = [v for k in ("heldout_champion", "heldout_candidate", "regression_champion", "regression_candidate")
              for v in result[k] if v is not None]
    assert scores and all(0 <= v <= 1 for v in scores)
    per_slice = [x for iteration in result["slices"] for x in iteration]  # champion -> candidate per slice
    assert per_slice and all(x["low"] - 1e-3 <= x["candidate"] - x["champion"] <= x["high"] + 1e-3 and x["n"]
                             for x in per_slice)  # rounded to 4 places in the result
    bench = result["benchmark"]  # the continual-learning benchmark's newest receipt, read and plotted
    assert bench["receipt"].startswith("continual-") and "default" in bench["strategies"] and bench["targets"]
    assert all(len(x["average_seen"]) == bench["skills"] for x in bench["strategies"].values())


@pytest.mark.timeout(900)
def test_served_loop_notebook_serves_asks_and_runs_the_loop_on_the_capture(server, tmp_path):
    result = execute("served_loop", tmp_path, dict(questions=8, steps=2, regression_size=8, base_url=server.url,
                                                   run_dir=str(tmp_path / "run")))
    phases = result["phases"]
    assert list(phases) == ["before (asked)", "after (not asked before)", "after (asked again)"]
    assert all(p["n"] == 8 and p["low"] <= p["accuracy"] <= p["high"] for p in phases.values()), phases
    assert phases["before (asked)"]["weights"] == ["base"] and phases["before (asked)"]["champion_iterations"] == [0]
    # one iteration on the drained capture (at this size too few held-out chests to promote); what answered after
    # is what it decided
    assert result["iterations"] == 1 and result["decisions"][0] in ("promoted", "rejected", "skipped")
    promoted = result["decisions"][0] == "promoted"
    assert phases["after (asked again)"]["champion_iterations"] == [1 if promoted else 0]
    assert result["params"]["questions"] == 8
