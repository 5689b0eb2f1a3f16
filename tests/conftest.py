"""Project-wide pytest configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from tests._budget import OneAtATime, shares_rocketmq_cluster

from qclient import LocalCluster

#: the resource budget: every JVM test in one xdist group, the peak of JVMs reported
pytest_plugins = ["tests._budget"]

# RocketMQ's JVMs in tests keep the default JIT (no C1-only flag): every second an idle
# broker's timer thread compares its whole 38.7 MB wheel with the mapped file
# (TimerWheel.flush), which C1's code does at ~30 % of a core per broker and C2's at ~3 %;
# a 2-broker cluster's CPU is even by its 15th second and half after a minute

# Property tests judge results, never speed: no per-example deadline and no "too slow"
# health check, which a loaded host fails by chance (one draw took 2.2 s at load 18 in a
# fresh-clone run beside the suite's JVMs)
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")


@pytest.fixture(scope="session")
def shared_cluster() -> Iterator[LocalCluster]:
    """One name server and one broker for the whole session, started on first use, for
    tests that add messages on topics of their own and read back deltas; a test that
    pauses the broker resumes it before it ends, none stops it."""
    with LocalCluster(brokers=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def _rocketmq_slot() -> Iterator[OneAtATime[LocalCluster]]:
    """The one RocketMQ cluster of the modules that stop, kill and pause no broker: two
    brokers, started once for all of them, stopped before any other module (it may start
    JVMs of its own: the budget, docs/TESTING.md)."""
    slot = OneAtATime(
        lambda: LocalCluster(brokers=2, engine="rocketmq").start(), lambda c: c.stop()
    )
    try:
        yield slot
    finally:
        slot.release()


@pytest.fixture(scope="module", autouse=True)
def _one_rocketmq_cluster(
    request: pytest.FixtureRequest, _rocketmq_slot: OneAtATime[LocalCluster]
) -> None:
    """Before a module none of whose tests shares the cluster, stop the shared one: the
    module may start a cluster or a Spark JVM of its own, and an idle RocketMQ broker
    still takes a sixth of a core (its timer and store services wake every few ms). A
    module whose fixture asks for ``rocketmq_cluster`` only for its ``[rocketmq]`` tests
    (``request.getfixturevalue``) says so with ``pytest.mark.shares_rocketmq_cluster``."""
    if not shares_rocketmq_cluster(request.node):
        _rocketmq_slot.release()


@pytest.fixture(scope="module")
def rocketmq_cluster(_rocketmq_slot: OneAtATime[LocalCluster]) -> LocalCluster:
    """A real RocketMQ NameServer and two brokers shared by the modules whose tests stop,
    kill and pause no broker (each test uses topics and groups of its own)."""
    return _rocketmq_slot.get()
