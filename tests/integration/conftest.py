"""Fixtures the integration tests share beyond tests/conftest.py's servers."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def docker_client():
    """A client of the local Docker daemon that has the offline base image; skips with the reason otherwise."""
    from rlcli.errors import RlcliError
    from rlcli.harbor import sandbox

    try:
        client = sandbox.connect()
    except RlcliError as e:
        pytest.skip(f"no Docker daemon: {e}")
    if not client.images.list(name="debian:bookworm-slim"):
        pytest.skip("no debian:bookworm-slim image: build it offline with `scripts/base_image.sh` (make base-image)")
    return client
