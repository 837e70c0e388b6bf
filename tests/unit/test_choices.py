"""Fixed choices: declared once (Literal annotations), refused the same way by `rlcli` and by scripts/*.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli import choices, cli
from rlcli.errors import EXIT_USAGE, UsageError

REPO = Path(__file__).resolve().parents[2]
HARBOR_TASKS = str(REPO / "tests" / "fixtures" / "harbor")

# (rlcli words, script and its words, the flag, the bad value): each is refused before any work.
BAD = [
    (["export", "tinker://r/sampler_weights/1", "--format", "zip"], ["export.py", "tinker://r/sampler_weights/1",
                                                                     "--format", "zip"], "--format", "zip"),
    (["import", "-", "-f", "xml"], ["import.py", "--input=-", "--format", "xml"], "--format", "xml"),
    (["train", "rl", "--loss", "dro"], ["train_rl.py", "--loss", "dro"], "--loss", "dro"),
    (["train", "rl", "--passes", "3"], ["train_rl.py", "--passes", "3"], "--passes", "3"),
    (["train", "harbor", "--loss", "cross_entropy"], ["harbor.py", "train", "--loss", "cross_entropy"], "--loss",
     "cross_entropy"),
    (["eval", "--grader", "fuzzy"], ["eval.py", "--grader", "fuzzy"], "--grader", "fuzzy"),
    (["harbor", "run", HARBOR_TASKS, "--policy", "human"], ["harbor.py", "run", HARBOR_TASKS, "--policy", "human"],
     "--policy", "human"),
]


@pytest.mark.parametrize(("words", "flag", "value"), [(w, f, v) for w, _, f, v in BAD])
def test_rlcli_refuses_a_bad_choice_in_one_line(words, flag, value, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(words)
    err = capsys.readouterr().err
    assert exited.value.code == EXIT_USAGE and len(err.strip().splitlines()) == 1, err
    assert f"argument {flag}" in err and f"invalid choice: '{value}'" in err and "--help" in err


@pytest.mark.parametrize(("words", "flag", "value"), [(s, f, v) for _, s, f, v in BAD])
def test_scripts_refuse_the_same_choice_in_one_line(words, flag, value, tmp_path):
    env = {**os.environ, "RLCLI_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / words[0]), *words[1:]], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120, stdin=subprocess.DEVNULL)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == EXIT_USAGE and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith(f"rlcli: error: {flag} {value}: choose from "), lines


def test_choices_are_read_from_literal_annotations():
    from rlcli.data.import_cmd import import_cmd
    from rlcli.data.importers import IMPORTERS
    from rlcli.train.rl import train_rl

    assert choices.choices_of(import_cmd) == {"format": (*IMPORTERS, "otel")}  # one name per importer, and otel
    assert choices.choices_of(train_rl) == {"loss": ("gspo", "cispo", "dppo", "ppo", "importance_sampling"),
                                            "passes": ("auto", "1", "2"),
                                            "grader": ("auto", "gsm8k", "numeric", "exact"),
                                            "env": ("problems", "replay", "tools"),
                                            "reward": ("match", "verdict", "rubric", "judge"),
                                            "turn": ("last", "all")}


def test_fire_values_become_the_choice_they_spell():
    from rlcli.train.rl import train_rl

    bound = choices.checked(train_rl, (), {"passes": 2, "loss": "ppo", "grader": None})
    assert bound.arguments == {"passes": "2", "loss": "ppo", "grader": None}
    with pytest.raises(UsageError, match="--passes 3: choose from auto, 1, 2"):
        choices.checked(train_rl, (), {"passes": 3})


def test_fire_literals_for_text_flags_are_json_again_or_refused():
    from rlcli.data.import_cmd import import_cmd
    from rlcli.train.rl import train_rl

    config = {"clip_low_threshold": 0.9}
    assert choices.checked(train_rl, (), {"loss_config": config}).arguments["loss_config"] == json.dumps(config)
    with pytest.raises(UsageError, match="--input needs a value"):
        choices.checked(import_cmd, (True,), {})
    with pytest.raises(UsageError, match="--input: fire read 2024 as Python int, not text; quote it"):
        choices.checked(import_cmd, (2024,), {})
    assert choices.checked(import_cmd, ("-",), {"output": "-"}).arguments == {"input": "-", "output": "-"}
