"""runtime/rlcli_warmup.py's shape file and runtime/pins.py's check, without SkyRL (the replay itself runs in
tests/integration/test_serve.py, on a real restart)."""

from __future__ import annotations

import importlib.util

import pytest

from rlcli.server import commands


def _runtime(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", commands.RUNTIME_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_a_missing_target_stops_the_extension_naming_it():
    pins = _runtime("pins")
    pins.require("x", {"here": len, "checked": True})
    with pytest.raises(RuntimeError, match=r"x: this SkyRL lacks gone, fact; it is not the version rlcli pins"):
        pins.require("x", {"here": len, "gone": None, "fact": False})


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


class _Backend:
    def __init__(self, cap: int = 0, fsdp: int = 1):
        self.config = type("Config", (), {"sample_max_num_sequences": cap})()
        self.mesh = type("Mesh", (), {"shape": {"fsdp": fsdp}})()

    def sample(self, prepared_batch):
        return prepared_batch  # what SkyRL's sample was given


def _sampled(backend: _Backend, count: int) -> _Batch:
    batch = _Batch(all_model_inputs=[f"prompt{i}" for i in range(count)],
                   all_sampling_params=[{"seed": i} for i in range(count)],
                   all_model_ids=["m"] * count, needs_prompt_logprobs=False,
                   request_batch_slices=[("r", "m", 0, count, False, 0)])
    return type(backend).sample(backend, batch)


def test_a_sampling_batch_is_padded_with_copies_of_its_first_sequence():
    warmup = _runtime("rlcli_warmup")

    class Impl(_Backend):
        pass

    warmup.pad_sampling_batches(Impl)
    warmup.pad_sampling_batches(Impl)  # once only
    got = _sampled(Impl(), 5)
    assert got.all_model_inputs == [f"prompt{i}" for i in range(5)] + ["prompt0"] * 3
    assert got.all_sampling_params[5:] == [{"seed": 0}] * 3 and got.all_model_ids == ["m"] * 8
    assert got.request_batch_slices == [("r", "m", 0, 5, False, 0)]  # the copies belong to no request
    assert len(_sampled(Impl(), 4).all_model_inputs) == 4  # already a size: untouched
    assert len(_sampled(Impl(fsdp=2), 1).all_model_inputs) == 2
    assert len(_sampled(Impl(cap=3), 5).all_model_inputs) == 5  # the user's cap: SkyRL's own padding


def test_exact_sampling_batches_is_a_different_version_and_says_so(monkeypatch):
    """RLCLI_EXACT_SAMPLING_BATCHES=1 keeps SkyRL's batches; the processes of one server compare versions, so a
    worker started without it cannot join an engine started with it."""
    padded = _runtime("rlcli_warmup")
    monkeypatch.setenv("RLCLI_EXACT_SAMPLING_BATCHES", "1")
    exact = _runtime("rlcli_warmup")
    assert padded.VERSION != exact.VERSION and "exact" in exact.VERSION
    assert "RLCLI_EXACT_SAMPLING_BATCHES=1" in exact.describe()["sampling_batches"]
    monkeypatch.delenv("RLCLI_EXACT_SAMPLING_BATCHES")
    assert "copies of the first" in exact.describe()["sampling_batches"]
