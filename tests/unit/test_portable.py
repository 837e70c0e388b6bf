"""Files meant to be committed (receipts, notebook results) carry no paths of the machine that wrote them."""
import sys
from pathlib import Path

from rlcli.config import portable


def test_interpreter_tree_and_home_become_portable(tmp_path):
    tree = tmp_path / "checkout"
    text = f"{sys.executable} -m rlcli.cli --tree {tree} --log {tree}/runs/a --home {Path.home()}/.rlcli"
    out = portable(text, tree)
    assert out == "python -m rlcli.cli --tree . --log runs/a --home ~/.rlcli"
    assert sys.executable not in out and str(tmp_path) not in out
