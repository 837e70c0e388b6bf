"""runtime/rlcli_samplers.py's snapshot bookkeeping on real files, without SkyRL, and --sampler-snapshots'
checks (the real server runs it in tests/integration/test_sampler_snapshots.py)."""

from __future__ import annotations

import pytest

from rlcli.errors import UsageError
from rlcli.server import commands
from rlcli.server.runtime.shared import SAMPLER_CACHE_ENV, SNAPSHOTS_ENV
from tests.unit.test_tenant_fair_unit import runtime


def _samplers():
    return runtime("rlcli_samplers")


def _save(snapshots, folder, model: str, name: str, persist: bool, fails: bool = False):
    """What rlcli_backend's save_sampler_checkpoint does around SkyRL's write (which writes a probe file too)."""
    path = folder / f"{name}.tar.gz"
    with snapshots.saving(model, path, persist):
        path.with_name(path.name + ".probe").write_text("write_probe")
        if fails:
            raise OSError("No space left on device")
        path.write_bytes(b"weights")


def _on_disk(folder) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_the_newest_unnamed_snapshots_stay_and_named_ones_are_never_deleted(tmp_path):
    samplers = _samplers()
    snapshots = samplers.Snapshots(keep=2, records_rows=True)
    _save(snapshots, tmp_path, "m", "named", persist=True)
    for n in range(4):
        _save(snapshots, tmp_path, "m", f"ss{n}_seq{n}", persist=False)
        assert len([f for f in _on_disk(tmp_path) if f.startswith("ss") and f.endswith(".tar.gz")]) <= 2
    assert _on_disk(tmp_path) == {"named.tar.gz", "named.tar.gz.probe", "ss2_seq2.tar.gz", "ss2_seq2.tar.gz.probe",
                                  "ss3_seq3.tar.gz", "ss3_seq3.tar.gz.probe"}
    assert snapshots.rows == [("m", "ss0_seq0"), ("m", "ss1_seq1")]
    refusal = snapshots.refusal("m", "ss0_seq0")
    assert "tinker://m/sampler_weights/ss0_seq0 were deleted" in refusal and SNAPSHOTS_ENV in refusal
    assert snapshots.refusal("m", "ss3_seq3") is None and snapshots.refusal("m", "named") is None

    _save(snapshots, tmp_path, "m", "ss3_seq3", persist=True)  # a user's name that was a snapshot's: kept now
    snapshots.model_gone("m")
    assert _on_disk(tmp_path) == {"named.tar.gz", "named.tar.gz.probe", "ss3_seq3.tar.gz", "ss3_seq3.tar.gz.probe"}
    assert snapshots.refusal("m", "ss0_seq0") is None  # the model is gone: SkyRL says "not loaded" itself


def test_each_model_keeps_its_own_and_workers_record_no_rows(tmp_path):
    samplers = _samplers()
    worker = samplers.Snapshots(keep=1, records_rows=False)
    for model in ("a", "b"):
        (tmp_path / model).mkdir()
        for n in range(3):
            _save(worker, tmp_path / model, model, f"ss{n}_seq{n}", persist=False)
    assert _on_disk(tmp_path / "a") == _on_disk(tmp_path / "b") == {"ss2_seq2.tar.gz", "ss2_seq2.tar.gz.probe"}
    assert worker.rows == []
    worker.delete("a", "ss9_seq9", tmp_path / "a" / "ss9_seq9.tar.gz")  # a file another process removed already
    with pytest.raises(OSError):  # room first (keep=1: ss2 goes), then a save that fails leaves nothing behind
        _save(worker, tmp_path / "a", "a", "ss3_seq3", persist=False, fails=True)
    assert _on_disk(tmp_path / "a") == set() and worker.refusal("a", "ss3_seq3") is not None
    worker.model_gone("a")
    assert _on_disk(tmp_path / "a") == set()
    assert _on_disk(tmp_path / "b") == {"ss2_seq2.tar.gz", "ss2_seq2.tar.gz.probe"}


@pytest.mark.parametrize(("variable", "value"), [*((SNAPSHOTS_ENV, v) for v in ("0", "-1", "two", "1.5")),
                                               *((SAMPLER_CACHE_ENV, v) for v in ("-1", "two", "1.5"))])
def test_a_bad_sampler_setting_is_one_line(variable, value, monkeypatch):
    """Refused by the engine at its start, and by `serve start` before one (the kept count names its flag)."""
    monkeypatch.setenv(variable, value)
    samplers = _samplers()
    snapshots = variable == SNAPSHOTS_ENV
    with pytest.raises(SystemExit, match=variable):
        samplers.keep_count() if snapshots else samplers.cache_size()
    with pytest.raises(UsageError, match="--sampler-snapshots" if snapshots else variable):
        commands._snapshots_env(None)


def test_the_flag_wins_over_the_environment_and_the_default_is_the_extensions(monkeypatch):
    monkeypatch.setenv("RLCLI_SAMPLER_SNAPSHOTS", "7")
    assert commands._snapshots_env(2) == {"RLCLI_SAMPLER_SNAPSHOTS": "2"}
    assert commands._snapshots_env(None) == {"RLCLI_SAMPLER_SNAPSHOTS": "7"}
    monkeypatch.delenv("RLCLI_SAMPLER_SNAPSHOTS")
    assert commands._snapshots_env(None) == {}
    samplers = _samplers()
    assert samplers.keep_count() == samplers.DEFAULT_KEEP
    # Every process of one server compares what it runs: the kept count is part of it.
    assert runtime("distributed").identity({"rlcli"}).endswith(f"keep={samplers.DEFAULT_KEEP}")


def test_kept_sampler_weights_follow_their_file_and_the_newest_stay(tmp_path):
    samplers = _samplers()
    kept = samplers.Sampled(size=2)
    files = {}
    for name in ("s1", "s2", "s3"):
        files[name] = tmp_path / f"{name}.tar.gz"
        files[name].write_bytes(name.encode())
    kept.put("m", "s1", files["s1"], "w1")
    kept.put("m", "s2", files["s2"], "w2")
    assert kept.get("m", "s1", files["s1"]) == "w1"  # s1 is now the newest used
    kept.put("n", "s3", files["s3"], "w3")  # over the size: the least recently used (s2) goes
    assert kept.get("m", "s2", files["s2"]) is None and kept.get("n", "s3", files["s3"]) == "w3"
    replacement = tmp_path / "new"
    replacement.write_bytes(b"other weights")
    replacement.replace(files["s1"])  # the file behind the name is another one now
    assert kept.get("m", "s1", files["s1"]) is None and ("m", "s1") not in kept.entries
    kept.put("m", "s1", files["s1"], "w1b")
    files["s1"].unlink()
    assert kept.get("m", "s1", files["s1"]) is None  # gone
    kept.put("n", "s3", "gs://bucket/s3.tar.gz", "cloud")  # not a file of this machine: never kept
    assert kept.get("n", "s3", "gs://bucket/s3.tar.gz") is None
    kept.put("m", "s2", files["s2"], "w2")
    kept.drop("m")
    assert kept.get("m", "s2", files["s2"]) is None
    assert samplers.Sampled(size=0).put("m", "s2", files["s2"], "w2") is None and not samplers.Sampled(0).entries
