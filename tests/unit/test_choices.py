"""Fixed choices: declared once (a record field's Literal type), refused the same way by `rlcli`, by scripts/*.py
(the same parser under the script's name) and by a library caller that makes the record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcli import cli, options
from rlcli.errors import EXIT_USAGE, UsageError

REPO = Path(__file__).resolve().parents[2]
HARBOR_TASKS = str(REPO / "tests" / "fixtures" / "harbor")

# (rlcli words, script and its words, the flag, the bad value): each is refused before any work.
BAD = [
    (["export", "tinker://r/sampler_weights/1", "--format", "zip"], ["export.py", "tinker://r/sampler_weights/1",
                                                                     "--format", "zip"], "--format", "zip"),
    (["import", "-", "-f", "xml"], ["import.py", "-", "--format", "xml"], "--format", "xml"),
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
    assert lines[0].startswith(f"{words[0]}") and f"argument {flag}" in lines[0], lines
    assert f"invalid choice: '{value}'" in lines[0] and f"`{words[0]}" in lines[0], lines


def choices(record: type) -> dict[str, tuple[str, ...]]:
    return {spec.name: spec.choices for spec in options.specs(record) if spec.choices}


def test_choices_are_read_from_literal_annotations():
    from rlcli.data.import_cmd import ImportOptions
    from rlcli.data.importers import IMPORTERS
    from rlcli.train.rl import RlOptions

    assert choices(ImportOptions) == {"format": (*IMPORTERS, "otel")}  # one name per importer, and otel
    assert choices(RlOptions) == {"loss": ("gspo", "cispo", "dppo", "ppo", "importance_sampling"),
                                  "passes": ("auto", "1", "2"),
                                  "grader": ("auto", "gsm8k", "numeric", "exact"),
                                  "env": ("problems", "replay", "tools"),
                                  "reward": ("match", "verdict", "rubric", "judge"),
                                  "turn": ("last", "all")}


def test_a_library_caller_gets_the_same_refusal():
    from rlcli.train.rl import RlOptions

    assert RlOptions(passes="2", loss="ppo", grader="auto").passes == "2"
    with pytest.raises(UsageError, match="--passes 3: choose from auto, 1, 2"):
        RlOptions(passes="3")
    with pytest.raises(UsageError, match="--passes 2: choose from auto, 1, 2"):
        RlOptions(passes=2)  # a choice is its text: the number is not it


def test_a_value_of_the_wrong_type_is_refused_in_one_line():
    from rlcli.data.import_cmd import ImportOptions
    from rlcli.train.rl import RlOptions

    with pytest.raises(UsageError, match="input 2024: give text"):
        ImportOptions(input=2024)
    with pytest.raises(UsageError, match="--loss-config {'a': 1}: give text"):
        RlOptions(loss_config={"a": 1})
    with pytest.raises(UsageError, match="--batch-size True: give a whole number"):
        RlOptions(batch_size=True)
    assert RlOptions(lr=1).lr == 1.0 and isinstance(RlOptions(lr=1).lr, float)  # an int where a float goes
