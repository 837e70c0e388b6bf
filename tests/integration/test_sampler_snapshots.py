"""The RL loops' unnamed sampler snapshots do not pile up on the server's disk (runtime/rlcli_samplers.py).

`save_weights_and_get_sampling_client()` saves ss<N>_seq<M> under <checkpoints>/<model>/sampler_weights/ once
per RL step. On rlcli's server at most the newest 4 (the default) stay while the model lives, a sample of a
deleted one is refused in one line, named sampler checkpoints are never deleted, and unloading the model
deletes its snapshots (files, probes and listing rows). Stock SkyRL keeps every one, after unload too.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from rlcli.client import CAPABILITIES_ROUTE, parse_tinker_path, request_json, unload_models
from rlcli.server import commands
from tests.conftest import run_rlcli, shared_server_venv

pytestmark = pytest.mark.server

KEEP = 4  # the session server runs with the default (no --sampler-snapshots)
STEPS = 7
TOKENS = list(range(5, 21))
SNAPSHOT = re.compile(r"ss(\d+)_seq(\d+)\.tar\.gz")


def _service(url: str, monkeypatch):
    import tinker

    monkeypatch.setenv("TINKER_API_KEY", "tml-test")
    return tinker.ServiceClient(base_url=url)


def _folder(home: Path, model_id: str) -> Path:
    return home / "servers" / "default" / "checkpoints" / model_id / "sampler_weights"


def _snapshots(folder: Path) -> list[str]:
    """The unnamed snapshots on disk, oldest first (by the client's sampling-session counter N)."""
    found = [(int(m[1]), m[0]) for p in folder.glob("ss*") if (m := SNAPSHOT.fullmatch(p.name))]
    return [name.removesuffix(".tar.gz") for _, name in sorted(found)]


def _step(client) -> None:
    import tinker

    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(TOKENS[:-1]),
                         loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * (len(TOKENS) - 1)})
    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(tinker.AdamParams(learning_rate=1e-2)).result()


def _sample(sampler) -> list[int]:
    import tinker

    params = tinker.SamplingParams(max_tokens=2, temperature=0.0, seed=0)
    return list(sampler.sample(tinker.ModelInput.from_ints(TOKENS), 1, params).result().sequences[0].tokens)


def _listed(url: str, model_id: str) -> set[str]:
    answer = request_json(f"{url}/api/v1/training_runs/{model_id}/checkpoints")
    return {c["checkpoint_id"] for c in answer["checkpoints"] if c["checkpoint_type"] == "sampler"}


def test_only_the_newest_snapshots_stay_and_unload_removes_them(server, monkeypatch):
    assert f"newest {KEEP}" in request_json(server.url + CAPABILITIES_ROUTE)["rlcli_samplers"]["sampler_snapshots"]
    client = _service(server.url, monkeypatch).create_lora_training_client(base_model=server.model, rank=8,
                                                                           seed=0).result()
    folder = _folder(server.home, client.model_id)
    try:
        client.save_weights_for_sampler("named-first").result()
        samplers, counts = [], []
        for step in range(STEPS):
            _step(client)
            samplers.append(client.save_weights_and_get_sampling_client().result())
            _sample(samplers[-1])  # the one just saved: the RL loop's case
            counts.append(len(_snapshots(folder)))
            if step == STEPS // 2:
                client.save_weights_for_sampler("named-mid").result()
        kept = _snapshots(folder)
        assert counts == [min(i + 1, KEEP) for i in range(STEPS)], counts
        assert {p.name.removesuffix(".tar.gz.probe") for p in folder.glob("ss*.probe")} <= set(kept)
        assert {"named-first.tar.gz", "named-mid.tar.gz"} <= {p.name for p in folder.iterdir()}
        assert _listed(server.url, client.model_id) == {"named-first", "named-mid", *kept}

        # An older snapshot still kept samples (on a borrowed slot); a deleted one is refused in one line.
        assert _sample(samplers[-KEEP])
        with pytest.raises(Exception) as refused:
            _sample(samplers[0])
        assert "were deleted" in str(refused.value) and "--sampler-snapshots" in str(refused.value), refused.value
    finally:
        assert unload_models(server.url, [client.model_id]) == []
    left = {p.name for p in folder.iterdir()}
    assert not _snapshots(folder) and not any(SNAPSHOT.match(name) for name in left), left
    assert {"named-first.tar.gz", "named-mid.tar.gz"} <= left, left
    assert _listed(server.url, client.model_id) == {"named-first", "named-mid"}


def test_train_rl_with_no_saves_leaves_no_snapshots(server, tmp_path):
    """`rlcli train rl --save-every 0`, 6 steps: never more than KEEP snapshots on disk, none once it ended."""
    checkpoints = server.home / "servers" / "default" / "checkpoints"
    earlier = {p.name for p in checkpoints.iterdir()} if checkpoints.exists() else set()
    seen: dict[str, int] = {}  # model -> most snapshots seen at once while the run trained
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.1):
            for folder in checkpoints.glob("*/sampler_weights"):
                if folder.parent.name not in earlier:
                    seen[folder.parent.name] = max(seen.get(folder.parent.name, 0), len(_snapshots(folder)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run = tmp_path / "run"
    try:
        proc = run_rlcli("train", "rl", "--dataset", "arithmetic", "--loss", "importance_sampling", "--batch-size",
                         "2", "--group-size", "2", "--max-tokens", "4", "--max-steps", "6", "--save-every", "0",
                         "--eval-every", "0", "--base-url", server.url, "--log-path", str(run), env=server.env,
                         timeout=300)
    finally:
        done.set()
        watcher.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = [json.loads(line) for line in (run / "checkpoints.jsonl").read_text().splitlines()][-1]
    model, _, name = parse_tinker_path(final["sampler_path"])
    assert 1 <= seen.get(model, 0) <= KEEP, seen
    folder = _folder(server.home, model)
    assert not _snapshots(folder) and (folder / f"{name}.tar.gz").exists(), sorted(p.name for p in folder.iterdir())


def test_stock_skyrl_keeps_every_snapshot(stock_server, embedded_model, monkeypatch):
    """The fault the extension removes: stock SkyRL keeps each unnamed snapshot, after unload too."""
    url, env = stock_server
    client = _service(url, monkeypatch).create_lora_training_client(base_model=embedded_model, rank=8, seed=0).result()
    folder = _folder(Path(env["RLCLI_HOME"]), client.model_id)
    try:
        for _ in range(3):
            _step(client)
            _sample(client.save_weights_and_get_sampling_client().result())
    finally:
        assert unload_models(url, [client.model_id]) == []
    assert len(_snapshots(folder)) == 3, sorted(p.name for p in folder.iterdir())


SWEEP = """
import json, sys, types as plain
from pathlib import Path
runtime, base = sys.argv[1], Path(sys.argv[2])
sys.path.insert(0, runtime)
import rlcli_samplers
from skyrl.tinker import types
from skyrl.tinker.db_models import CheckpointDB, CheckpointStatus, FutureDB
from sqlmodel import Session, SQLModel, create_engine, select

db = create_engine(f"sqlite:///{base / 'db.sqlite'}")
SQLModel.metadata.create_all(db)
saves = [("old", "ss0_seq1", 0), ("old", "kept-name", None), ("old", "ss1_seq3", 1), ("old", "ss1_seq3", None),
         ("live", "ss0_seq1", 0)]  # (model, name, sampling_session_seq_id): None is a named save
with Session(db) as session:
    for model, name, seq in saves:
        data = {"path": name, "sampling_session_seq_id": seq, "seq_id": 1}
        kind = types.RequestType.SAVE_WEIGHTS_FOR_SAMPLER
        session.add(FutureDB(request_type=kind, model_id=model, request_data=data))
        if session.get(CheckpointDB, (model, name, types.CheckpointType.SAMPLER)) is None:
            session.add(CheckpointDB(model_id=model, checkpoint_id=name, checkpoint_type=types.CheckpointType.SAMPLER,
                                     status=CheckpointStatus.COMPLETED))
        folder = base / model / "sampler_weights"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.tar.gz").write_text("weights")
        (folder / f"{name}.tar.gz.probe").write_text("write_probe")
    session.commit()
engine = plain.SimpleNamespace(db_engine=db, config=plain.SimpleNamespace(checkpoints_base=base),
                               backend=plain.SimpleNamespace(has_model=lambda model: model == "live"))
deleted = rlcli_samplers.sweep(engine)
with Session(db) as session:
    rows = sorted(f"{c.model_id}/{c.checkpoint_id}" for c in session.exec(select(CheckpointDB)).all())
files = sorted(str(p.relative_to(base)) for p in base.glob("*/sampler_weights/*"))
print(json.dumps({"deleted": deleted, "again": rlcli_samplers.sweep(engine), "rows": rows, "files": files}))
"""


def test_a_start_deletes_the_snapshots_an_earlier_server_left(tmp_path):
    """rlcli_samplers.sweep on SkyRL's real database tables: only unnamed snapshots of models not loaded go."""
    python = shared_server_venv() / "bin" / "python"
    proc = subprocess.run([str(python), "-c", SWEEP, str(commands.RUNTIME_DIR), str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["deleted"] == 1 and result["again"] == 0, result
    assert result["rows"] == ["live/ss0_seq1", "old/kept-name", "old/ss1_seq3"], result
    kept = {f"{m}/sampler_weights/{n}.tar.gz{p}" for m, n in [("live", "ss0_seq1"), ("old", "kept-name"),
                                                              ("old", "ss1_seq3")] for p in ("", ".probe")}
    assert set(result["files"]) == kept, result
