"""The server's checkpoint folder full while an RL loop saves its unnamed per-step sampler snapshots
(runtime/rlcli_samplers.py): at K kept, the oldest goes before the new one is written, so the save succeeds on
a disk full to the last byte; below K a failed save leaves no partial file. Needs root (a tmpfs)."""

from __future__ import annotations

import pytest

from rlcli.client import unload_models
from rlcli.server.private import private_server
from tests.conftest import shared_server_venv
from tests.faults.conftest import fill, tmpfs
from tests.integration.test_sampler_snapshots import SNAPSHOT, _sample, _snapshots, _step

pytestmark = pytest.mark.server


def test_a_full_checkpoint_folder_still_takes_the_next_snapshot(embedded_model, tmp_path, monkeypatch):
    import tinker

    with (tmpfs(tmp_path / "ckpt-fs", "16m") as disk,
          private_server(embedded_model, "--slots", "2", "--sampler-snapshots", "2", "--checkpoints-base", str(disk),
                         venv=shared_server_venv()) as srv):
        monkeypatch.setenv("TINKER_API_KEY", "tml-f")
        service = tinker.ServiceClient(base_url=srv.url)
        first = service.create_lora_training_client(base_model=srv.model, rank=32, seed=0)
        second = service.create_lora_training_client(base_model=srv.model, rank=32, seed=1)
        folder, other = (disk / c.model_id / "sampler_weights" for c in (first, second))
        try:
            for _ in range(2):
                _step(first)
                first.save_weights_and_get_sampling_client()
            kept = _snapshots(folder)
            fill(disk)
            _step(first)
            _sample(first.save_weights_and_get_sampling_client())  # room made: the oldest went first
            assert len(_snapshots(folder)) == 2 and _snapshots(folder)[0] == kept[1], _snapshots(folder)

            (disk / "more").mkdir()
            fill(disk / "more")  # full to the last byte again (the first filler stays)
            with pytest.raises(Exception, match="No space left"):
                second.save_weights_and_get_sampling_client()  # nothing kept yet, so no room to make: it fails
            left = [p.name for p in other.iterdir()] if other.exists() else []
            assert not any(SNAPSHOT.match(name) for name in left), left  # no partial file, no probe
        finally:
            assert unload_models(srv.url, [first.model_id, second.model_id]) == []
