"""Lookup, cancel by id and reschedule on both engines, one test body each: qclient's
brokers and real Apache RocketMQ 5 brokers (recall and index queries; see
``engines/rocketmq/lifecycle.py`` for what cannot be atomic there). Each engine's
cluster (2 brokers) starts once for the module."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from qclient import AsyncProducer, LocalCluster, MessageState, Producer
from qclient.engines.rocketmq.local.runtime import TIMER_PRECISION_MS
from qclient.errors import InvalidMessageError, MessageNotScheduledError, UnsupportedByEngineError
from qclient.protocol import wire

from .helpers import drain, duplicates, engine_topic, not_early, now_ms, wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.shares_rocketmq_cluster]

QCLIENT = [sys.executable, "-m", "qclient"]


@pytest.fixture(scope="module", params=["qclient", "rocketmq"])
def cluster(request: pytest.FixtureRequest):
    if request.param == "rocketmq":
        yield request.getfixturevalue("rocketmq_cluster")
        return
    with LocalCluster(brokers=2) as c:
        yield c


def test_lookup_sync_and_async_from_another_producer(cluster):
    topic = engine_topic(cluster, "lc-lookup")
    # a 30 s budget: an attempt that timed out on a loaded host would leave a second copy
    # (on the broker that stored it late) for the clean-up to recall, which this test of
    # lookup is not about
    with Producer(cluster.namesrv, send_timeout=30.0) as sender:
        generated = sender.send_delayed(topic, b"x", delay=2 * 86_400)
        chosen = sender.send_delayed(topic, b"y", delay=3600, msg_id="order-42-close")
    with Producer(cluster.namesrv) as other:
        for r in (generated, chosen):
            info = other.lookup(topic, r.msg_id)
            assert info is not None
            assert (info.msg_id, info.topic, info.state) == (r.msg_id, topic, "scheduled")
            assert (info.broker_name, info.deliver_at_ms) == (r.broker_name, r.deliver_at_ms)
            assert info.fired_at_ms is None and info.copies == 1
        assert other.lookup(topic, "no-such-id") is None
        with pytest.raises(InvalidMessageError):
            other.lookup(topic, "has space")

    async def from_async() -> None:
        async with AsyncProducer(cluster.namesrv) as ap:
            info = await ap.lookup(topic, chosen.msg_id)
            assert info is not None and info.deliver_at_ms == chosen.deliver_at_ms
            moved = await ap.reschedule(topic, chosen.msg_id, delay=7200)
            assert moved.msg_id == chosen.msg_id and moved.deliver_at_ms > chosen.deliver_at_ms
            info = await ap.lookup(topic, chosen.msg_id)
            assert info.state == MessageState.SCHEDULED
            assert info.deliver_at_ms == moved.deliver_at_ms
            assert await ap.cancel(topic=topic, msg_id=chosen.msg_id) is True
            assert (await ap.lookup(topic, chosen.msg_id)).state == MessageState.CANCELLED

    asyncio.run(from_async())


def test_reschedule_earlier_and_later_delivers_once_at_the_new_time(cluster):
    topic = engine_topic(cluster, "lc-move")
    with Producer(cluster.namesrv) as p:
        early = p.send_delayed(topic, b"early", delay=3600)
        # "late" is moved first, straight after it is sent: its old time must not pass
        # before the move even on a loaded machine; "early" then lands between the two times
        # (3 s, then 5 and 10 s: "early" must be read before "late"'s new time, and on a
        # loaded host reading it took more than the 2 s between 3 and 5 s)
        late = p.send_delayed(topic, b"late", delay=3.0)
        moved_late = p.reschedule(topic, late.msg_id, delay=10.0)
        moved_early = p.reschedule(topic, early.msg_id, delay=5.0)
        assert moved_early.msg_id == early.msg_id and moved_late.msg_id == late.msg_id
        assert moved_late.deliver_at_ms > late.deliver_at_ms + 2000
        assert moved_early.deliver_at_ms > late.deliver_at_ms
        new_time = {early.msg_id: moved_early.deliver_at_ms, late.msg_id: moved_late.deliver_at_ms}
        # past the old time of "late", before its new one: only "early" arrived
        got = drain(cluster.namesrv, topic, "g", expected=1, timeout=15)
        assert [m.msg_id for m in got] == [early.msg_id]
        assert now_ms() < moved_late.deliver_at_ms, "too slow to check the old time"
        got += drain(cluster.namesrv, topic, "g", expected=1, timeout=15, settle=0.5)
        assert sorted(m.msg_id for m in got) == sorted(new_time) and duplicates(got) == 0
        for m in got:
            assert m.deliver_at_ms == new_time[m.msg_id] and not_early(m)
        info = p.lookup(topic, late.msg_id)
        ahead = wire.DEFAULT_FIRE_AHEAD_MS  # qclient's brokers fire that early (held)
        assert info.state == MessageState.FIRED
        assert info.fired_at_ms >= moved_late.deliver_at_ms - ahead
        with pytest.raises(MessageNotScheduledError) as err:
            p.reschedule(topic, late.msg_id, delay=5)
        assert err.value.state == MessageState.FIRED
        assert p.cancel(topic=topic, msg_id=late.msg_id) is False


def test_cancel_by_result_and_by_id_and_errors(cluster):
    topic = engine_topic(cluster, "lc-cancel")
    with Producer(cluster.namesrv) as p:
        # cancelled long before their time, even on a loaded machine; by its SendResult
        # straight after the send (the broker may not have indexed it yet), and by id
        r = p.send_delayed(topic, b"never", delay=2.0)
        by_result = p.send_delayed(topic, b"never either", delay=2.0)
        assert p.cancel(by_result) is True
        assert p.cancel(topic=topic, msg_id=r.msg_id) is True
        assert p.cancel(topic=topic, msg_id=r.msg_id) is False
        info = p.lookup(topic, r.msg_id)
        assert info.state == MessageState.CANCELLED and info.fired_at_ms is None
        with pytest.raises(MessageNotScheduledError) as err:
            p.reschedule(topic, r.msg_id, delay=1)
        assert err.value.state == MessageState.CANCELLED
        with pytest.raises(MessageNotScheduledError) as err:
            p.reschedule(topic, "never-sent", delay=1)
        assert err.value.state is None
        with pytest.raises(InvalidMessageError):
            p.reschedule(topic, r.msg_id, delay=1, deliver_at=time.time() + 5)
        assert p.cancel(topic=topic, msg_id="never-sent") is False
        kept = p.send_delayed(topic, b"kept", delay=2.0)
    wait_until(lambda: now_ms() > r.deliver_at_ms + 500, 10, "the cancelled time to pass")
    got = drain(cluster.namesrv, topic, "g", expected=1, timeout=10, settle=1.0)
    assert [m.msg_id for m in got] == [kept.msg_id]


def test_rocketmq_refuses_a_later_time_inside_the_timer_slot(cluster):
    """RocketMQ's reschedule is a new copy plus a recall of the old slot, and a recall
    drops every copy of the id in its slot: a later time in the same slot cannot be had
    (UnsupportedByEngineError), an earlier one keeps the message as it is (it fires with
    the slot, never early). qclient's brokers move it to any time."""
    topic = engine_topic(cluster, "lc-slot")
    precision = TIMER_PRECISION_MS
    at_ms = (now_ms() + 30_000) // precision * precision + precision // 2
    with Producer(cluster.namesrv) as p:
        r = p.send_delayed(topic, b"x", deliver_at=at_ms / 1000)
        assert r.deliver_at_ms == at_ms
        if cluster.engine == "rocketmq":
            with pytest.raises(UnsupportedByEngineError) as err:
                p.reschedule(topic, r.msg_id, deliver_at=(at_ms + 10) / 1000)
            assert "rocketmq" in str(err.value) and "timerPrecisionMs" in str(err.value)
            kept = p.reschedule(topic, r.msg_id, deliver_at=(at_ms - 10) / 1000)
            assert kept.deliver_at_ms == at_ms
        else:
            moved = p.reschedule(topic, r.msg_id, deliver_at=(at_ms + 10) / 1000)
            assert moved.deliver_at_ms == at_ms + 10
        info = p.lookup(topic, r.msg_id)
        assert info.state == MessageState.SCHEDULED and info.copies == 1
        assert p.cancel(topic=topic, msg_id=r.msg_id) is True


def _cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*QCLIENT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )


def _done(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, out, err


def test_cli_lookup_cancel_reschedule(cluster):
    ns, topic = cluster.namesrv, engine_topic(cluster, "lc-cli")
    with Producer(cluster.namesrv) as p:
        r = p.send_delayed(topic, b"x", delay=3600, msg_id="cli-1")
        for mid in ("cli-2", "cli-3", "cli-4"):
            p.send_delayed(topic, b"x", delay=3600, msg_id=mid)
        p.cancel(topic=topic, msg_id="cli-4")
    # every command at once, each on its own id (a process start costs ~1 s here)
    procs = {
        "lookup": _cli("lookup", "--namesrv", ns, "--topic", topic, "cli-1"),
        "reschedule": _cli(
            "reschedule", "--namesrv", ns, "--topic", topic, "--delay", "2h", "cli-2"
        ),
        "cancel": _cli("cancel", "--namesrv", ns, "--topic", topic, "cli-3"),
        "cancelled": _cli("cancel", "--namesrv", ns, "--topic", topic, "cli-4"),
        "unknown": _cli("lookup", "--namesrv", ns, "--topic", topic, "nope"),
    }
    done = {name: _done(proc) for name, proc in procs.items()}
    code, out, err = done["lookup"]
    assert code == 0 and '"state": "scheduled"' in out and r.msg_id in out, err
    code, out, err = done["reschedule"]
    assert code == 0 and '"msg_id": "cli-2"' in out, err
    code, out, err = done["cancel"]
    assert code == 0 and '"cancelled": true' in out, err
    for name, says in (("cancelled", "it is cancelled"), ("unknown", "unknown to every broker")):
        code, out, err = done[name]
        assert code == 1 and says in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
