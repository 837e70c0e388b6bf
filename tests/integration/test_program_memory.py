"""A server's compiled programs past --program-memory are dropped and loaded again from the disk cache as used
(runtime/rlcli_memory.py): the engine's memory goes down, and what it computes after the drop is what it computed
before (greedy samples, a forward pass's logprobs)."""

from __future__ import annotations

import re
import time

import pytest

from rlcli.server.private import private_server
from tests.conftest import install_embedded_model, shared_compile_cache, shared_server_venv

pytestmark = pytest.mark.server

DROPPED = re.compile(r"dropped the compiled programs .*: RSS (\d+) -> (\d+) MB;")
TOKENS = list(range(5, 29))


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    """A server that drops its programs once they add 1 MB, looking every second (so at most every 10 s)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("RLCLI_MEMORY_EVERY_S", "1")
    mp.setenv("TINKER_API_KEY", "tml-test")
    try:
        home = shared_compile_cache(tmp_path_factory.mktemp("capped-home"))
        with private_server(install_embedded_model(), "--program-memory", "1", "--slots", "2", home=home,
                            venv=shared_server_venv(), timeout=600) as server:
            yield server
    finally:
        mp.undo()


def _wait_for_drop(server, offset: int, timeout: float = 60) -> tuple[int, int]:
    """RSS before and after the first drop logged past `offset` bytes of the server's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with server.log.open("rb") as f:
            f.seek(offset)
            if m := DROPPED.search(f.read().decode(errors="replace")):
                return int(m[1]), int(m[2])
        time.sleep(0.5)
    raise AssertionError(f"no drop in {timeout} s; log tail: {server.log.read_text()[-2000:]}")


def test_dropped_programs_give_the_same_results_and_free_memory(capped):
    import tinker

    service = tinker.ServiceClient(base_url=capped.url)
    trainer = service.create_lora_training_client(base_model=capped.model, rank=4).result()
    datum = tinker.Datum(model_input=tinker.ModelInput.from_ints(TOKENS[:-1]),
                         loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [1.0] * (len(TOKENS) - 1)})
    sampler = service.create_sampling_client(base_model=capped.model).result()
    params = tinker.SamplingParams(max_tokens=6, temperature=0.0, seed=0)
    prompt = tinker.ModelInput.from_ints(TOKENS[:9])

    def compute(rows: int = 2):
        logprobs = trainer.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
        samples = sampler.sample(prompt=prompt, num_samples=rows, sampling_params=params).result()
        return logprobs, [s.tokens for s in samples.sequences]

    before = compute()
    offset = capped.log.stat().st_size
    compute(rows=3)  # a new sampling shape: a new program (~25 MB) past the 1 MB, whatever dropped before
    rss_before, rss_after = _wait_for_drop(capped, offset)
    assert rss_after < rss_before
    assert compute() == before  # loaded again from the disk cache: the same programs
    print(f"dropped: RSS {rss_before} -> {rss_after} MB")
    assert len(before[1]) == 2 and all(len(t) == 6 for t in before[1])
