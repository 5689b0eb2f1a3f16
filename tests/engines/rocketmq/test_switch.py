"""follow_switch: a member keeps a broker's queues while its group has no master."""

from __future__ import annotations

import msgspec

from qclient.engines.rocketmq.switch import follow_switch
from qclient.protocol.wire import BrokerData, QueueData, TopicRoute

RW = 0x6  # PERM_READ | PERM_WRITE


def _route(addrs: dict[str, dict[int, str]], perm: int = RW) -> TopicRoute:
    return TopicRoute(
        topic="t",
        queue_datas=[QueueData(name, 2, 2, perm) for name in addrs],
        broker_datas=[BrokerData(name, a) for name, a in addrs.items()],
    )


BEFORE = ({"a": "h:1", "b": "h:3"}, [("a", 0), ("a", 1), ("b", 0), ("b", 1)])


def test_a_routed_master_changes_nothing() -> None:
    route = _route({"a": {0: "h:1", 2: "h:2"}, "b": {0: "h:3"}})
    assert follow_switch(route, *BEFORE) == BEFORE


def test_a_group_without_master_keeps_its_queues_and_last_address() -> None:
    route = _route({"a": {2: "h:2"}, "b": {0: "h:3"}})
    assert follow_switch(route, *BEFORE) == BEFORE


def test_the_new_master_replaces_the_last_address() -> None:
    route = _route({"a": {0: "h:2"}, "b": {0: "h:3"}})
    masters, queues = follow_switch(route, *BEFORE)
    assert masters == {"a": "h:2", "b": "h:3"} and queues == BEFORE[1]


def test_a_broker_gone_from_the_route_or_unreadable_is_let_go() -> None:
    gone = _route({"b": {0: "h:3"}})
    assert follow_switch(gone, *BEFORE) == ({"b": "h:3"}, [("b", 0), ("b", 1)])
    write_only = TopicRoute(
        topic="t",
        queue_datas=[QueueData("a", 2, 2, 0x2), QueueData("b", 2, 2, RW)],
        broker_datas=[BrokerData("a", {2: "h:2"}), BrokerData("b", {0: "h:3"})],
    )
    assert follow_switch(write_only, *BEFORE) == ({"b": "h:3"}, [("b", 0), ("b", 1)])


def test_a_broker_never_seen_with_a_master_is_not_added() -> None:
    route = _route({"a": {2: "h:2"}, "b": {0: "h:3"}})
    assert follow_switch(route, {"b": "h:3"}, [("b", 0), ("b", 1)]) == (
        {"b": "h:3"},
        [("b", 0), ("b", 1)],
    )


def test_a_partial_route_lacking_a_group_keeps_it() -> None:
    """A NameServer that may have restarted has not heard from broker a yet: the member
    keeps a's queues and address until a complete route leaves a out."""
    partial = msgspec.structs.replace(_route({"b": {0: "h:3"}}), partial=True)
    assert follow_switch(partial, *BEFORE) == BEFORE
    unreadable = msgspec.structs.replace(
        _route({"a": {0: "h:1"}, "b": {0: "h:3"}}, perm=0x2), partial=True
    )
    assert follow_switch(unreadable, *BEFORE) == ({}, [])  # listed, not readable: let go
