"""Issue 6: per-request work stays bounded; a pull answer is capped in bytes, not only in
messages (1024 messages of 4 MiB would otherwise be a 4 GiB answer)."""

from __future__ import annotations

import os

import httpx
import pytest
from tests.integration.helpers import wait_until

from qclient import LocalCluster, Message, Producer
from qclient.protocol import wire

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024


def _pull(addr: str, commits: dict[int, int]) -> wire.PullResponse:
    body = wire.encode(wire.PullRequest("big", "g", max_messages=32, commits=commits), wire.MSGPACK)
    resp = httpx.post(
        wire.base_url(addr) + wire.BROKER_PULL,
        content=body,
        headers={"Content-Type": wire.MSGPACK},
        timeout=30.0,
        trust_env=False,
    )
    assert resp.status_code == 200, resp.text
    return wire.decode(resp.content, wire.PullResponse, wire.MSGPACK)


def test_pull_answer_is_capped_in_bytes(tmp_path):
    with LocalCluster(brokers=1, data_dir=str(tmp_path / "c")) as cluster:
        addr = cluster.brokers[0].addr
        with Producer(cluster.namesrv, start_detector_enable=False, send_timeout=30.0) as p:
            # Random bodies do not compress. A pull reads every queue of the topic.
            p.send("big", b"x", msg_id="warm")
            for i in range(5):
                p.send_batch([Message("big", os.urandom(3 * MIB + MIB // 2), msg_id=f"big-{i}")])

        # The 16 MiB default fits four 3.5 MiB bodies (and the 1-byte one), not five.
        def five_fired() -> wire.PullResponse | None:
            answer = _pull(addr, {})
            return answer if len(answer.messages) >= 5 else None

        first = wait_until(five_fired, 15.0, "the big messages to fire")
        assert len(first.messages) == 5
        assert sum(len(m.body) for m in first.messages) <= 16 * MIB
        rest = _pull(addr, dict(first.next_offsets))
        got = {m.msg_id for m in first.messages} | {m.msg_id for m in rest.messages}
        assert got == {"warm", *(f"big-{i}" for i in range(5))}
