"""rlcli/server/runtime/manifest.py: one list of the names rlcli changes in other people's code, the count the README
states, and the version specifiers the server processes check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlcli.server.runtime import manifest
from rlcli.train import hooks
from rlcli.train import metrics as keys

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_states_how_many_names_rlcli_overrides():
    """Wherever the README says it, the number is the manifest's: a new override changes both, or this fails."""
    stated = re.findall(r"rlcli overrides (\d+) names", (REPO / "README.md").read_text())
    assert stated, "README.md says nowhere how many names rlcli overrides (`rlcli overrides N names ...`)"
    assert {int(n) for n in stated} == {len(manifest.overridden())}, (stated, len(manifest.overridden()))


def test_every_entry_says_what_it_is_for_where_it_is_checked_and_overrides_say_when_they_go():
    kinds, places = {manifest.OVERRIDE, manifest.REBINDING, manifest.RELIED}, {
        manifest.API, manifest.ENGINE, manifest.JAX, manifest.RAY, manifest.WORKER, manifest.CLIENT}
    for entry in manifest.ENTRIES:
        assert ":" in entry.target and entry.why and entry.kind in kinds and entry.where in places, entry
        assert entry.kind == manifest.RELIED or entry.goes, entry
        assert not entry.check or entry.check[0] in ("fields", "calls", "param", "holds", "by"), entry
    upstream = {part.strip() for e in manifest.ENTRIES if e.goes.startswith(manifest.UP)
                for part in e.goes.removeprefix(manifest.UP).split(",")}
    missing = sorted(name for name in upstream if not (REPO / "docs" / "upstream" / name).is_file())
    assert missing == [], f"entries point at upstream descriptions that do not exist: {missing}"
    assert len({e.target for e in manifest.ENTRIES}) == len(manifest.ENTRIES)  # each name once


def test_the_client_hooks_are_the_manifests_entries():
    assert hooks.PINS == {"tinker": manifest.PINS["tinker"], "tinker-cookbook": manifest.PINS["tinker-cookbook"]}
    assert [f"{p.module}:{p.name}" for p in hooks.PATCHES] == [e.target for e in manifest.HOOKS]
    texts = {text for patch in hooks.PATCHES for text in patch.needs_text}
    assert f'"{keys.BATCH}"' in texts and f"{keys.TRAIN_NLL}=" in texts  # the metric keys the hooks rely on


@pytest.mark.parametrize(("version", "spec", "ok"), [
    ("0.4.0", "==0.4.0", True), ("0.4.1", "==0.4.0", False), ("0.12.0.1", "==0.12.*", True),
    ("0.13.0", "==0.12.*", False), ("0.25.3", ">=0.25,<0.26", True), ("0.26.0", ">=0.25,<0.26", False),
    ("0.24.9", ">=0.25,<0.26", False)])
def test_version_specifiers_are_read_as_pip_reads_them(version, spec, ok):
    assert manifest.satisfies(version, spec) is ok


def test_doctor_prints_the_manifest_with_its_count():
    from rlcli import doctor

    lines = doctor.manifest_lines()
    assert lines[0].startswith(f"rlcli overrides {len(manifest.overridden())} names")
    assert len(lines) == len(manifest.ENTRIES) + 1
    assert any("goes: upstream: docs/upstream/slot-gradients.md" in line for line in lines)


def test_entries_checked_where_they_act_are_not_imported_by_the_start_check(monkeypatch):
    """A "by" entry names something only its own code can check (torch's stand-in, the loss registry): resolving it
    at start would import what the stand-in keeps out."""
    assert all(isinstance(entry.check, tuple) for entry in manifest.ENTRIES)
    by = manifest.Entry("sys:modules['torch']", "a stand-in", manifest.REBINDING, "x", "", ("by", "its owner"))
    monkeypatch.setattr(manifest, "ENTRIES", (by,))
    assert manifest.problems({"x"}) == []
