"""Issue 6: fuzz the broker's HTTP API with hypothesis (bounded) against running brokers.

Bodies are raw bytes, arbitrary JSON/MessagePack values, and schema-shaped objects whose
fields are sometimes valid and sometimes anything; content types, paths and methods vary
too. Every answer must be below 500 and, for errors, our one-line error body; the broker
must stay up and log no internal error. A second broker with an auth file is fuzzed on
its signature headers (always 401) and with correctly signed random bodies (never 5xx).
The hand-written hostile cases live in tests/integration/test_bad_input.py.
"""

from __future__ import annotations

import string
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qclient import LocalCluster
from qclient.protocol import auth, wire

from ._support import OTHER_KEY, OTHER_SECRET, write_auth_file

pytestmark = pytest.mark.timeout(240)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)

# --- strategies ----------------------------------------------------------------------

ASCII = string.ascii_letters + string.digits + string.punctuation
ints = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, -1, 1, 3, 4, 255, 256, 2**31, 2**63 - 1, -(2**63)]),
)
nasty_text = st.sampled_from(
    [
        "",
        ".",
        "..",
        "../../etc/passwd",
        "a/b",
        "a\\b",
        "fz",
        "orders",
        "a" * 127,
        "a" * 128,
        "\x00",
        "nul\x00byte",
        "CON",
        "%2e%2e",
        "|",
        "%",
        "*",
        "é",
        "\u202e",
        " fz",
        "fz\n",
    ]
)
texts = st.one_of(st.text(max_size=200), nasty_text)
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(), texts, st.binary(max_size=64))
wild = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)

good_topics = st.sampled_from(["fz", "fz_2", "fz-3"])
topics = st.one_of(good_topics, texts)
msg_ids = st.text(alphabet=ASCII, min_size=1, max_size=128)
short_text = st.text(max_size=40)


def _now_ms() -> int:
    return int(time.time() * 1000)


@st.composite
def shaped(
    draw: st.DrawFn,
    required: dict[str, st.SearchStrategy[Any]],
    optional: dict[str, st.SearchStrategy[Any]] | None = None,
) -> dict[str, Any]:
    """A schema-valid dict with 0-2 corruptions (a field dropped, replaced by anything,
    or an unknown one added): most examples reach the handler's own checks."""
    d: dict[str, Any] = draw(st.fixed_dictionaries(required, optional=optional or {}))
    keys = [*required, *(optional or {}), "extra"]
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 1, 2]))):
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()):
            d[key] = draw(wild)
        else:
            d.pop(key, None)
    return d


message = shaped(
    {
        "topic": good_topics,
        "queue_id": st.integers(0, 3),
        "msg_id": msg_ids,
        "body": st.binary(max_size=2048),
    },
    {
        "key": short_text,
        "tags": short_text,
        "properties": st.dictionaries(short_text, short_text, max_size=5),
        "delay_ms": st.one_of(st.integers(0, 60_000), ints),
        "deliver_at_ms": st.one_of(
            st.builds(lambda d: _now_ms() + d, st.integers(-(10**6), 10**9)), ints
        ),
        "flag": st.sampled_from([0, 1, 2, 128]),
    },
)
send = shaped({"messages": st.lists(message, min_size=1, max_size=5)})
cancel = shaped(
    {"topic": topics, "msg_id": msg_ids, "deliver_at_ms": st.one_of(st.builds(_now_ms), ints)}
)
lookup = shaped({"topic": topics, "msg_id": msg_ids})
reschedule = shaped(
    {"topic": topics, "msg_id": msg_ids},
    {"delay_ms": st.one_of(st.integers(0, 10**6), ints), "deliver_at_ms": ints},
)
# wait_ms is never a valid positive value: a valid long poll would just wait.
pull = shaped(
    {"topic": topics, "group": st.one_of(st.sampled_from(["g", "g-2"]), texts)},
    {
        "max_messages": st.one_of(st.integers(0, 64), ints),
        "wait_ms": st.one_of(st.just(0), st.integers(max_value=-1), st.integers(min_value=30_001)),
        "commits": st.dictionaries(
            st.one_of(st.integers(-2, 8), ints), st.one_of(st.integers(0, 5), ints), max_size=4
        ),
    },
)
create_topic = shaped(
    {"topic": topics},
    {"queues": st.one_of(st.integers(1, 8), ints), "perm": st.sampled_from([0, 2, 4, 6, 7, 8, -1])},
)

content_types = st.sampled_from(
    [wire.JSON, wire.MSGPACK] * 8
    + [
        "application/json; charset=utf-8",
        "text/plain",
        "",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
    ]
)


def _encode(obj: Any, content_type: str) -> bytes | None:
    try:
        if content_type.startswith(wire.MSGPACK):
            return msgspec.msgpack.encode(obj)
        return msgspec.json.encode(obj)
    except (OverflowError, TypeError, ValueError, msgspec.EncodeError):
        return None  # not representable in this encoding: send garbage instead


def bodies(shape: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[str, bytes]]:
    """``(content type, body)``: mostly a shaped object, sometimes any value or raw bytes."""

    def build(ct: str, kind: str, obj: Any, anything: Any, raw: bytes) -> tuple[str, bytes]:
        encoded = None if kind == "raw" else _encode(obj if kind == "shaped" else anything, ct)
        return ct, raw if encoded is None else encoded

    kinds = st.sampled_from(["shaped"] * 8 + ["any", "raw"])
    return st.builds(build, content_types, kinds, shape, wild, st.binary(max_size=512))


# --- checks --------------------------------------------------------------------------


def check_answer(resp: httpx.Response) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    if resp.status_code >= 400:
        media = (
            wire.MSGPACK
            if resp.headers.get("content-type", "").startswith(wire.MSGPACK)
            else wire.JSON
        )
        err = wire.decode(resp.content, wire.ErrorResponse, media).error
        assert err.code and err.message and "\n" not in err.message


def check_alive(cluster: LocalCluster) -> None:
    broker = cluster.brokers[0]
    assert broker.running
    health = httpx.get(wire.base_url(broker.addr) + wire.HEALTH, timeout=5.0, trust_env=False)
    assert health.status_code == 200
    log_text = (cluster.data_dir / f"{broker.name}.log").read_text(errors="replace")
    assert "internal error" not in log_text and "Traceback" not in log_text, log_text[-2000:]


@pytest.fixture(scope="module")
def open_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=str(tmp_path_factory.mktemp("fuzz"))) as c:
        yield c


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10.0, trust_env=False) as c:
        yield c


# --- the open broker -----------------------------------------------------------------

ENDPOINTS = [
    (wire.BROKER_SEND, send),
    (wire.BROKER_CANCEL, cancel),
    (wire.BROKER_LOOKUP, lookup),
    (wire.BROKER_RESCHEDULE, reschedule),
    (wire.BROKER_PULL, pull),
    (wire.BROKER_TOPICS, create_topic),
]


@pytest.mark.parametrize("path, shape", ENDPOINTS, ids=[p for p, _ in ENDPOINTS])
def test_fuzz_post_endpoints(
    open_cluster: LocalCluster, client: httpx.Client, path: str, shape: st.SearchStrategy[Any]
) -> None:
    base = wire.base_url(open_cluster.brokers[0].addr)

    @FUZZ
    @given(bodies(shape))
    def one(case: tuple[str, bytes]) -> None:
        ct, body = case
        headers = {"Content-Type": ct} if ct else {}
        check_answer(client.post(base + path, content=body, headers=headers))

    one()
    check_alive(open_cluster)


methods = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
paths = st.one_of(
    st.sampled_from(
        [
            wire.BROKER_SEND,
            wire.BROKER_CANCEL,
            wire.BROKER_PULL,
            wire.BROKER_TOPICS,
            wire.BROKER_STATS,
            wire.HEALTH,
            "/",
            "/v1",
            "/v1/",
            "/v1/send/",
            "/v1//send",
            "/%2e%2e/%2e%2e/etc/passwd",
            "/v1/topics/../stats",
        ]
    ),
    st.text(alphabet=string.ascii_letters + string.digits + "/._-%~", max_size=80).map(
        lambda s: "/" + s
    ),
)


def test_fuzz_methods_and_paths(open_cluster: LocalCluster, client: httpx.Client) -> None:
    base = wire.base_url(open_cluster.brokers[0].addr)

    @FUZZ
    @given(methods, paths, st.binary(max_size=256), content_types)
    def one(method: str, path: str, body: bytes, ct: str) -> None:
        headers = {"Content-Type": ct} if ct else {}
        try:
            req = client.build_request(method, base + path, content=body or None, headers=headers)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol):
            return  # the client cannot even say it
        resp = client.send(req)
        assert resp.status_code < 500, (method, path, resp.status_code, resp.text[:200])

    one()
    check_alive(open_cluster)


# --- the name server -----------------------------------------------------------------

topic_config = shaped(
    {},
    {
        "read_queue_nums": st.one_of(st.integers(0, 8), ints),
        "write_queue_nums": st.one_of(st.integers(0, 8), ints),
        "perm": st.sampled_from([0, 2, 4, 6, 7, -1]),
    },
)
registration = shaped(
    {
        "broker_name": st.one_of(st.sampled_from(["fz-broker", "fz-2"]), texts),
        "addr": st.one_of(st.just("127.0.0.1:1"), texts),
    },
    {
        "cluster": st.one_of(st.just("c"), texts),
        "perm": st.sampled_from([0, 4, 6, 9]),
        "auto_create_topics": st.booleans(),
        "default_queue_nums": st.one_of(st.integers(1, 8), ints),
        "topics": st.dictionaries(topics, topic_config, max_size=4),
    },
)
unregistration = shaped(
    {
        "broker_name": st.one_of(st.just("fz-broker"), texts),
        "addr": st.one_of(st.just("127.0.0.1:1"), texts),
    }
)
route_topics = st.text(alphabet=string.ascii_letters + string.digits + "_%|-./~*", max_size=140)


def test_fuzz_name_server(open_cluster: LocalCluster, client: httpx.Client) -> None:
    ns = open_cluster.namesrv_node
    base = wire.base_url(ns.addr)

    @FUZZ
    @given(
        st.one_of(
            st.tuples(st.just(wire.NAMESRV_REGISTER), bodies(registration)),
            st.tuples(st.just(wire.NAMESRV_UNREGISTER), bodies(unregistration)),
            st.tuples(st.just("route"), st.tuples(st.just(""), route_topics.map(str.encode))),
        )
    )
    def one(case: tuple[str, tuple[str, bytes]]) -> None:
        path, (ct, body) = case
        if path == "route":
            try:
                resp = client.get(f"{base}/v1/routes/{body.decode()}")
            except httpx.InvalidURL:
                return
        else:
            resp = client.post(
                base + path, content=body, headers={"Content-Type": ct} if ct else {}
            )
        check_answer(resp)
        if resp.status_code == 200 and path == wire.NAMESRV_REGISTER:
            # What a reader of the routes trusts stays in range.
            reg = msgspec.convert(
                msgspec.json.decode(body)
                if not ct.startswith(wire.MSGPACK)
                else msgspec.msgpack.decode(body),
                wire.BrokerRegistration,
            )
            assert 1 <= reg.default_queue_nums <= 256
            assert all(c.read_queue_nums <= 256 for c in reg.topics.values())

    one()
    assert ns.running
    assert client.get(base + wire.HEALTH).status_code == 200
    log_text = (open_cluster.data_dir / f"{ns.name}.log").read_text(errors="replace")
    assert "internal error" not in log_text and "Traceback" not in log_text


def test_name_server_registration_limits(open_cluster: LocalCluster, client: httpx.Client) -> None:
    base = wire.base_url(open_cluster.namesrv_node.addr)
    good = {"broker_name": "lim", "addr": "127.0.0.1:1"}
    for over in [
        {"default_queue_nums": 10**9},
        {"default_queue_nums": 0},
        {"perm": 99},
        {"broker_name": "x" * 129},
        {"addr": "a b"},
        {"cluster": ""},
        {"topics": {"t": {"read_queue_nums": 100_000}}},
        {"topics": {"t": {"perm": -1}}},
        {"topics": {"../t": {}}},
    ]:
        resp = client.post(
            base + wire.NAMESRV_REGISTER,
            content=msgspec.json.encode({**good, **over}),
            headers={"Content-Type": wire.JSON},
        )
        assert resp.status_code == 400, (over, resp.text)
        check_answer(resp)
    assert "lim" not in open_cluster.registered()


# --- a broker with an auth file ------------------------------------------------------


@pytest.fixture(scope="module")
def auth_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    d: Path = tmp_path_factory.mktemp("fuzz-auth")
    with LocalCluster(brokers=1, data_dir=str(d / "c"), auth_file=write_auth_file(d)) as c:
        yield c


# (h11 refuses to send values with surrounding blanks: strip them)
header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=100
).map(str.strip)


def test_fuzz_signature_headers(auth_cluster: LocalCluster, client: httpx.Client) -> None:
    base = wire.base_url(auth_cluster.brokers[0].addr)
    before = _appended(client, base)

    @FUZZ
    @given(
        st.sampled_from([p for p, _ in ENDPOINTS] + [wire.BROKER_STATS, "/nope"]),
        st.fixed_dictionaries(
            {},
            optional={
                auth.HEADER_ACCESS_KEY: st.one_of(st.sampled_from([OTHER_KEY]), header_text),
                auth.HEADER_TIMESTAMP: st.one_of(
                    st.builds(lambda d: str(_now_ms() + d), st.integers(-(10**6), 10**6)),
                    header_text,
                ),
                auth.HEADER_NONCE: header_text,
                auth.HEADER_SIGNATURE: st.one_of(
                    st.text("0123456789abcdef", min_size=64, max_size=64), header_text
                ),
            },
        ),
        bodies(send),
    )
    def one(path: str, headers: dict[str, str], case: tuple[str, bytes]) -> None:
        ct, body = case
        resp = client.post(
            base + path, content=body, headers={**headers, **({"Content-Type": ct} if ct else {})}
        )
        assert resp.status_code == 401, (resp.status_code, resp.text[:200])
        check_answer(resp)

    one()
    assert _appended(client, base) == before  # no unsigned request stored anything
    check_alive(auth_cluster)


def test_fuzz_signed_bodies(auth_cluster: LocalCluster, client: httpx.Client) -> None:
    base = wire.base_url(auth_cluster.brokers[0].addr)

    @FUZZ
    @given(st.sampled_from(ENDPOINTS).flatmap(lambda e: st.tuples(st.just(e[0]), bodies(e[1]))))
    def one(case: tuple[str, tuple[str, bytes]]) -> None:
        path, (ct, body) = case
        headers = auth.sign_headers(OTHER_KEY, OTHER_SECRET, "POST", path, body)
        if ct:
            headers["Content-Type"] = ct
        check_answer(client.post(base + path, content=body, headers=headers))

    one()
    check_alive(auth_cluster)


def test_fuzz_findings_stay_fixed(open_cluster: LocalCluster, client: httpx.Client) -> None:
    """Cases the fuzzing found (each was a 500 before)."""
    base = wire.base_url(open_cluster.brokers[0].addr)
    for deliver_at_ms in (-1, 2**64 - 1):
        body = msgspec.json.encode({"topic": "fz", "msg_id": "0", "deliver_at_ms": deliver_at_ms})
        resp = client.post(
            base + wire.BROKER_CANCEL, content=body, headers={"Content-Type": wire.JSON}
        )
        assert resp.status_code == 400, resp.text
        check_answer(resp)


def _appended(client: httpx.Client, base: str) -> int:
    headers = auth.sign_headers(OTHER_KEY, OTHER_SECRET, "GET", wire.BROKER_STATS, b"")
    resp = client.get(base + wire.BROKER_STATS, headers=headers)
    resp.raise_for_status()
    return int(resp.json()["store"]["appended"])
