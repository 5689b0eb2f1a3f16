"""A broker whose data directory runs out of space: it refuses new messages with a clear
retryable error (the producer moves to another broker), keeps firing and serving
consumers, loses and corrupts nothing, and accepts again once space returns.

The size-limited data directory is a tmpfs mounted with ``size=`` (needs root; skipped
otherwise)."""

from __future__ import annotations

import time

import httpx
import msgspec
from tests.integration.helpers import drain, not_early, wait_until
from tests.server.conftest import fill

from qclient import LocalCluster, Producer
from qclient.protocol import wire

FS_MB = 24
RESERVE_MB = 8
TOPIC = "diskfull"


def _post_send(addr: str, msg_id: str) -> httpx.Response:
    m = wire.WireMessage(TOPIC, 0, msg_id, b"direct", delay_ms=500)
    return httpx.post(
        f"http://{addr}{wire.BROKER_SEND}",
        content=msgspec.json.encode(wire.SendRequest([m])),
        headers={"content-type": wire.JSON},
        timeout=5,
    )


def test_disk_full_refuses_fails_over_keeps_firing_and_recovers(tmp_path, small_fs) -> None:
    mnt = small_fs(tmp_path / "broker-a", FS_MB)  # broker-a's data dir
    with LocalCluster(
        brokers=2, data_dir=str(tmp_path), broker_args=["--min-free-mb", str(RESERVE_MB)]
    ) as cluster:
        a = cluster.broker("broker-a")
        acked: dict[str, str] = {}
        with Producer(cluster.namesrv, retry_times=2) as p:
            # before: both brokers take messages; broker-a's fire while its disk is full
            for i in range(40):
                r = p.send_delayed(TOPIC, f"before-{i}", delay=1.5, msg_id=f"before-{i}")
                acked[r.msg_id] = r.broker_name
            assert "broker-a" in acked.values()

            ballast = fill(mnt, (RESERVE_MB - 2) << 20)
            time.sleep(0.1)  # the guard re-reads free space at most every 50 ms
            refused = _post_send(a.addr, "direct-full")
            assert refused.status_code == 507
            err = msgspec.json.decode(refused.content, type=wire.ErrorResponse).error
            assert err.code == wire.ErrorCode.DISK_FULL
            assert err.code in wire.RETRYABLE_CODES
            assert "disk full" in err.message and "\n" not in err.message

            # during: every send is acknowledged, by the broker that has space
            for i in range(60):
                r = p.send_delayed(TOPIC, f"full-{i}", delay=0.5, msg_id=f"full-{i}")
                assert r.broker_name == "broker-b"
                acked[r.msg_id] = r.broker_name
            assert p.stats()["retried"] > 0

            # broker-a keeps firing and serving its consumers on a full disk
            got = drain(cluster.namesrv, TOPIC, "g", expected=len(acked), timeout=20)
            delivered = {m.msg_id: m for m in got}
            assert set(delivered) == set(acked)
            assert {m.broker_name for m in got} == {"broker-a", "broker-b"}
            assert all(not_early(m) for m in got)

            # after: space returns, broker-a accepts again
            ballast.unlink()
            ok = wait_until(
                lambda: (r := _post_send(a.addr, "direct-after")).status_code == 200 and r,
                timeout=5,
                what="broker-a accepting again",
            )
            res = msgspec.json.decode(ok.content, type=wire.SendResponse).results[0]
            assert res.status == wire.SEND_OK
        disk = httpx.get(f"http://{a.addr}{wire.BROKER_STATS}", timeout=5).json()["disk"]
        assert disk["refusals"] >= 1 and disk["free_bytes"] > RESERVE_MB << 20
        stats = httpx.get(f"http://{a.addr}{wire.BROKER_STATS}", timeout=5).json()["store"]
        assert stats.get("corrupt_records", 0) == 0 and stats.get("sync_errors", 0) == 0
        # nothing was half-written: a restart replays broker-a's log without cutting
        a.stop()
        a.start()
        stats = httpx.get(f"http://{a.addr}{wire.BROKER_STATS}", timeout=5).json()["store"]
        assert stats.get("torn_bytes_cut", 0) == 0 and stats.get("corrupt_records", 0) == 0
