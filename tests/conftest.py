"""Project-wide pytest configuration."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from qclient import LocalCluster

# RocketMQ's JVMs in tests compile with C1 only: the suite's brokers need to start and
# answer, not to reach peak speed, and C2 compiling for the first minute of every JVM took
# a core; benchmarks (make bench) run without it
os.environ.setdefault("QCLIENT_ROCKETMQ_JVM_OPTS", "-XX:TieredStopAtLevel=1")


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[LocalCluster]:
    """One name server and one broker for the whole session, started on first use, for
    tests that add messages on topics of their own and read back deltas; a test that
    pauses the broker resumes it before it ends, none stops it."""
    with LocalCluster(brokers=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def rocketmq_cluster() -> Iterator[LocalCluster]:
    """A real RocketMQ NameServer and two brokers for a module whose tests stop, kill and
    pause no broker. Module-scoped on purpose: an idle RocketMQ broker takes a sixth of a
    core (its timer and store services wake every few ms), so none may outlive its module."""
    with LocalCluster(brokers=2, engine="rocketmq") as cluster:
        yield cluster
