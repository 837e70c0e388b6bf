"""rlcli's structure holds: no import cycle and no import from a higher layer, lazy imports included (the layers
and the figures: tests/structure.py)."""

from __future__ import annotations

from tests import structure

GRAPH = structure.imports(structure.REPO)


def test_no_import_cycles():
    assert structure.cycles(GRAPH) == []


def test_every_module_imports_only_from_its_layer_or_lower_ones():
    assert structure.upward(GRAPH) == []


def test_the_graph_sees_lazy_and_type_checking_imports():
    # rlcli.train.rl imports the problem sets' builders inside a function, and Data for the type checker only
    assert {"rlcli.problems.envs", "rlcli.problems.heldout"} <= GRAPH["rlcli.train.rl"]
    assert structure.layer("rlcli.problems.envs") < structure.layer("rlcli.train.rl")


def test_a_cycle_and_an_upward_import_are_found():
    graph = {"rlcli.files": {"rlcli.train.run"}, "rlcli.train.run": {"rlcli.files"}}
    assert structure.cycles(graph) == [["rlcli.files", "rlcli.train.run"]]
    assert structure.upward(graph) == [("rlcli.files", "rlcli.train.run")]
    assert structure.upward({"rlcli.nowhere": set()}) == [("rlcli.nowhere", "?")]
