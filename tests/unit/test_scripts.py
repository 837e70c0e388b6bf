"""Every scripts/*.py answers --help and runs one real call: it launches the same command as `rlcli`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (REPO / "scripts").glob("*.py"))
DEAD_URL = "http://127.0.0.1:9"  # the discard port: nothing listens
DEMO_TRACES = REPO / "rlcli" / "data" / "demo" / "demo-traces.openai.jsonl"


def script(name: str, *args: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLCLI_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("TINKER_BASE_URL", None)
    return subprocess.run([sys.executable, str(REPO / "scripts" / name), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, input=stdin, timeout=120)


@pytest.mark.parametrize("name", SCRIPTS)
def test_help(name, tmp_path):
    proc = script(name, "--help", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {name}"), proc.stdout  # rlcli's own parser, under the script's name


def test_every_command_family_has_a_script():
    from rlcli.cli import COMMANDS

    families = {"train": {"train_sl.py", "train_rl.py", "train_distill.py", "harbor.py"}, "chat": {"sample.py"}}
    for family in COMMANDS:
        assert families.get(family, {f"{family}.py"}) <= set(SCRIPTS), f"no script for `rlcli {family}`"


# name: (arguments, exit code, text on stdout or stderr). Each reaches its function and does real work,
# or stops at the function's own one-line error, offline.
CALLS = {
    "demo.py": (["--base-url", DEAD_URL], 1, "cannot reach a Tinker server at " + DEAD_URL),
    "doctor.py": (["--base-url", DEAD_URL], 1, "server"),
    "eval.py": (["--dataset", "arithmetic", "--max-operand", "3"], 2, "--max-operand must be 5 to 1000000, got 3"),
    "export.py": (["not-a-checkpoint"], 2, "is not a checkpoint path"),
    "harbor.py": (["train"], 2, "pass --dataset DIR"),
    "import.py": ([str(DEMO_TRACES), "--format", "openai", "--output", "{tmp}/out.jsonl"], 0, "wrote 64"),
    "loop.py": (["status", "{tmp}/no-loop"], 2, "is not a loop folder"),
    "endpoint.py": (["status"], 3, "endpoint for server 'default': not running"),
    "model.py": (["install"], 0, "rlcli-tiny-qwen3-v1"),
    "sample.py": (["sample", "--checkpoint", "tinker://x", "--prompt", "hi", "--base-url", DEAD_URL], 2,
                  "is not a checkpoint path"),
    "serve.py": (["status"], 3, "no server 'default' has been started"),
    "synth.py": (["qa", str(REPO / "tests" / "fixtures" / "traces" / "demo.jsonl"), "--output", "{tmp}/qa.jsonl"], 0,
                 "64 replies -> 63 problems"),
    "tenant.py": (["revoke", "nobody"], 2, "no tenant 'nobody'"),
    "train_distill.py": (["--prompts", "arithmetic", "--teacher", "base", "--kl-coef", "0"], 2,
                         "--kl-coef must be positive"),
    "train_dpo.py": (["--dataset", "{tmp}/none.jsonl", "--beta", "0"], 2, "--beta must be positive"),
    "train_rl.py": (["--loss", "gspo", "--passes", "2", "--dataset", "arithmetic", "--base-url", DEAD_URL], 1,
                    "which losses it serves"),
    # The dry run itself (tokenizer, renderer: ~9 s of imports) is test_train_sl_unit's, in-process.
    "train_sl.py": (["--dataset", "{tmp}/none.jsonl", "--model", "{model}", "--base-url", DEAD_URL, "--dry-run"], 2,
                    "no dataset file at"),
}


def test_every_script_has_a_call():
    assert set(CALLS) == set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_one_real_call(name, tmp_path, embedded_model):
    args, code, text = CALLS[name]
    args = [a.format(tmp=tmp_path, model=embedded_model) for a in args]
    proc = script(name, *args, home=tmp_path / "home")
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert text in proc.stdout + proc.stderr
