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


@pytest.fixture(scope="session")
def rocketmq_cluster() -> Iterator[LocalCluster]:
    """One real RocketMQ NameServer and two brokers per test worker, started on first use,
    for the modules of xdist group "rocketmq" (so one worker starts it once): they use
    topics and groups of their own, and none stops, kills or pauses a broker."""
    with LocalCluster(brokers=2, engine="rocketmq") as cluster:
        yield cluster
