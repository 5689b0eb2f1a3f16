"""Project-wide pytest configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qclient import LocalCluster


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[LocalCluster]:
    """One name server and one broker for the whole session, started on first use, for
    tests that add messages on topics of their own and read back deltas; a test that
    pauses the broker resumes it before it ends, none stops it."""
    with LocalCluster(brokers=1) as cluster:
        yield cluster
