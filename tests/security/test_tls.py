"""Issue 6: a cluster served over HTTPS with a self-signed certificate made here; the SDK
verifies it with ``verify=<CA path>`` and refuses it without."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from qclient import LocalCluster, Message, Producer
from qclient.errors import QClientError
from qclient.protocol import wire

from ._support import APP_KEY, APP_SECRET, broker_stats, drain_signed, write_auth_file

pytestmark = pytest.mark.timeout(120)


def make_self_signed(directory: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 (its own CA) and its key, via the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = make_self_signed(d)
    with LocalCluster(
        brokers=2, data_dir=str(d / "c"), auth_file=write_auth_file(d), tls_cert=cert, tls_key=key
    ) as c:
        yield c, cert


def test_send_and_consume_over_https(tls_cluster):
    cluster, ca = tls_cluster
    assert cluster.namesrv.startswith("https://")
    assert all(b.addr.startswith("https://") for b in cluster.brokers)
    creds = {"access_key": APP_KEY, "secret_key": APP_SECRET}
    with Producer(cluster.namesrv, verify=ca, start_detector_enable=False, **creds) as p:
        results = [
            p.send("orders", b"now", msg_id="tls-now"),
            p.send_delayed("orders", b"later", delay=0.3, msg_id="tls-later"),
            *p.send_batch([Message("orders", f"b{i}", msg_id=f"tls-b{i}") for i in range(20)]),
        ]
        assert {r.status.value for r in results} == {"SEND_OK"}
    want = {r.msg_id for r in results}
    got = drain_signed(cluster.namesrv, "orders", "g-tls", want, 15.0, verify=ca, **creds)
    assert want <= {m.msg_id for m in got}
    # The brokers registered their https:// addresses (heartbeats verified the name server).
    route = httpx.get(
        wire.base_url(cluster.namesrv) + "/v1/routes/orders",
        verify=ssl.create_default_context(cafile=ca),
        trust_env=False,
    ).json()
    addrs = [a for b in route["broker_datas"] for a in b["addrs"].values()]
    assert addrs and all(a.startswith("https://") for a in addrs)


def test_unknown_certificate_is_refused(tls_cluster):
    cluster, _ = tls_cluster
    with (
        Producer(
            cluster.namesrv,
            start_detector_enable=False,
            retry_times=0,
            access_key=APP_KEY,
            secret_key=APP_SECRET,
        ) as p,
        pytest.raises(QClientError, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        p.send("orders", b"x")
    with pytest.raises(httpx.ConnectError):
        broker_stats(cluster.brokers[0].addr)  # the system CAs do not know it either
    # Plain HTTP to an HTTPS port gets no answer a client could mistake for success.
    plain = "http://" + cluster.brokers[0].addr.removeprefix("https://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(plain + wire.HEALTH, timeout=5.0, trust_env=False).raise_for_status()
