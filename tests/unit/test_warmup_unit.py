"""runtime/rlcli_warmup.py's shape file and padded batches, and runtime/manifest.py's checks, without SkyRL (the
replay itself runs in tests/integration/test_serve.py, on a real restart)."""

from __future__ import annotations

import pytest

from rlcli.server import commands
from rlcli.server.runtime import manifest
from tests.unit.test_tenant_fair_unit import runtime as _runtime


def test_recorded_shapes_survive_a_restart_and_the_least_used_are_dropped(tmp_path):
    warmup = _runtime("rlcli_warmup")
    path = tmp_path / "shapes.json"
    shapes = {f"forward_backward:{b}:64": b for b in range(1, warmup.MAX_RECORDED + 6)}
    warmup.save(path, shapes)
    kept = warmup.load(path)
    assert len(kept) == warmup.MAX_RECORDED and "forward_backward:1:64" not in kept
    assert kept[f"forward_backward:{warmup.MAX_RECORDED + 5}:64"] == warmup.MAX_RECORDED + 5
    assert not list(tmp_path.glob(".*tmp"))  # written through a temporary file, renamed into place


def test_an_unreadable_or_foreign_shape_file_means_no_warm_up(tmp_path):
    warmup = _runtime("rlcli_warmup")
    assert warmup.load(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert warmup.load(tmp_path / "bad.json") == {}
    (tmp_path / "odd.json").write_text('{"shapes": {"sample:1:32": 3, "forward:2:32": 1}}')
    assert warmup.load(tmp_path / "odd.json") == {"forward:2:32": 1}  # only kinds it knows how to replay


def test_each_model_and_config_has_its_own_shape_file(monkeypatch, tmp_path):
    monkeypatch.setenv("RLCLI_HOME", str(tmp_path))
    a = commands.warmup_file("/m", "jax", {"max_lora_adapters": 5})
    assert a == commands.warmup_file("/m", "jax", {"max_lora_adapters": 5})
    assert a != commands.warmup_file("/m", "jax", {"max_lora_adapters": 8})
    assert a != commands.warmup_file("/other", "jax", {"max_lora_adapters": 5})
    assert a.parent == tmp_path / "cache" / "warmup" and oct(a.parent.stat().st_mode & 0o777) == "0o700"


def test_a_moved_target_or_another_version_stops_a_server_process_in_one_line(monkeypatch):
    here = manifest.Entry("json:dumps", "why it matters", manifest.RELIED, "x", check=("param", "indent"))
    gone = manifest.Entry("json:no_such_name", "a feature", manifest.OVERRIDE, "x")
    lost = manifest.Entry("json:loads", "another", manifest.RELIED, "x", check=("param", "no_such_param"))
    monkeypatch.setattr(manifest, "ENTRIES", (here, gone, lost))
    monkeypatch.setattr(manifest, "version_drift", lambda: [])
    assert manifest.problems({"x"}) == ["json:no_such_name is gone (a feature)",
                                        "json:loads no longer param 'no_such_param' (another)"]
    assert manifest.problems({"y"}) == []  # another process's targets are checked there
    with pytest.raises(SystemExit) as caught:
        manifest.check({"x"})
    assert "json:no_such_name is gone" in str(caught.value) and "\n" not in str(caught.value)
    monkeypatch.setattr(manifest, "version_drift", lambda: ["skyrl 0.5.0 (rlcli expects skyrl==0.4.0)"])
    with pytest.raises(SystemExit, match=r"skyrl 0.5.0 \(rlcli expects skyrl==0.4.0\): rebuild it"):
        manifest.check({"x"})


def test_sampling_batch_sizes_are_few_and_never_more_than_double():
    warmup = _runtime("rlcli_warmup")
    sizes = {n: warmup.sampling_batch(n) for n in range(1, 200)}
    assert all(n <= size < 2 * n or size == n for n, size in sizes.items())
    assert sorted(set(sizes.values())) == [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert all(size <= 1.5 * n for n, size in sizes.items() if n > 8)
    assert [warmup.sampling_batch(n, fsdp=4) for n in (1, 3, 5, 9, 13)] == [4, 4, 8, 12, 16]
    assert [warmup.sampling_batch(n, fsdp=3) for n in (1, 5, 9)] == [3, 9, 12]


class _Batch:
    """Stands in for SkyRL's PreparedSampleBatch (a pydantic model): iterates as (name, value), copies with update."""

    def __init__(self, **fields):
        self.fields = fields

    def __iter__(self):
        return iter(self.fields.items())

    def __getattr__(self, name):
        return self.__dict__["fields"][name]

    def model_copy(self, update):
        return _Batch(**{**self.fields, **update})


def test_a_sampling_batch_is_padded_with_copies_of_its_first_sequence():
    warmup = _runtime("rlcli_warmup")

    def padded(count: int, cap: int = 0, fsdp: int = 1) -> _Batch:
        batch = _Batch(all_model_inputs=[f"prompt{i}" for i in range(count)],
                       all_sampling_params=[{"seed": i} for i in range(count)],
                       all_model_ids=["m"] * count, needs_prompt_logprobs=False,
                       request_batch_slices=[("r", "m", 0, count, False, 0)])
        return warmup.padded(batch, fsdp, cap)

    got = padded(5)
    assert got.all_model_inputs == [f"prompt{i}" for i in range(5)] + ["prompt0"] * 3
    assert got.all_sampling_params[5:] == [{"seed": 0}] * 3 and got.all_model_ids == ["m"] * 8
    assert got.request_batch_slices == [("r", "m", 0, 5, False, 0)]  # the copies belong to no request
    assert len(padded(4).all_model_inputs) == 4  # already a size: untouched
    assert len(padded(1, fsdp=2).all_model_inputs) == 2
    assert len(padded(5, cap=3).all_model_inputs) == 5  # the user's cap: SkyRL's own padding


def test_shapes_are_recorded_where_a_file_is_named_and_not_while_replaying(tmp_path, monkeypatch):
    warmup = _runtime("rlcli_warmup")
    monkeypatch.delenv("RLCLI_WARMUP_FILE", raising=False)
    assert warmup.Shapes.from_env().path is None  # a worker or Ray actor: nothing recorded
    monkeypatch.setenv("RLCLI_WARMUP_FILE", str(tmp_path / "shapes.json"))
    shapes = warmup.Shapes.from_env()
    monkeypatch.setattr(warmup, "save", lambda path, recorded: setattr(shapes, "saved", dict(recorded)))
    import sys
    import types

    models = types.ModuleType("skyrl.tx.utils.models")
    models.round_up_seq_len = lambda n: -(-n // 32) * 32
    for name in ("skyrl", "skyrl.tx", "skyrl.tx.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "skyrl.tx.utils.models", models)
    chunk = types.SimpleNamespace(tokens=list(range(40)))
    batch = types.SimpleNamespace(all_model_inputs=[types.SimpleNamespace(chunks=[chunk])] * 3)
    shapes.record("forward_backward", batch)
    assert shapes.saved == {"forward_backward:3:64": 1}
    shapes.replaying = True
    shapes.record("forward", batch)
    assert shapes.recorded == {"forward_backward:3:64": 1}
