"""The broker's loop-side group commit on a real store (fsync on): a lone send commits on
the loop thread, the sends of one loop iteration share one group, larger or concurrent
groups go to the committer thread, duplicates and failures reach every caller."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from qclient.server.broker.commit import LoopCommitter
from qclient.server.store import (
    DeadlineExceededError,
    DelayStore,
    NewMessage,
    StoreConfig,
    StoreError,
)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DelayStore]:
    s = DelayStore(StoreConfig(data_dir=tmp_path / "store", bucket_ms=60_000))
    s.open()
    try:
        yield s
    finally:
        s.close()


def _msgs(tag: str, n: int = 1) -> list[NewMessage]:
    at = int(time.time() * 1000) + 3_600_000
    return [NewMessage("t", 0, f"{tag}-{i}", b"x" * 100, at) for i in range(n)]


def _groups(store: DelayStore) -> int:
    return int(store.stats()["groups"])


def test_a_lone_send_commits_on_the_loop_thread(store: DelayStore) -> None:
    threads: set[str] = set()
    commit = store._committer._commit

    def spy(group: list) -> None:  # type: ignore[type-arg]
        threads.add(threading.current_thread().name)
        commit(group)

    store._committer._commit = spy  # type: ignore[method-assign]

    async def main() -> None:
        committer = LoopCommitter(store, asyncio.get_running_loop())
        for i in range(3):
            [r] = await committer.submit(_msgs(f"lone{i}"))
            assert r.msg_id == f"lone{i}-0" and not r.duplicate

    before = _groups(store)
    asyncio.run(main())
    assert _groups(store) - before == 3
    assert threads == {threading.current_thread().name}


def test_store_now_commits_at_once_unless_a_group_is_forming(store: DelayStore) -> None:
    async def main() -> None:
        committer = LoopCommitter(store, asyncio.get_running_loop(), inline_max_messages=8)
        [now] = committer.store_now(_msgs("now")) or []  # durable on return
        assert now.msg_id == "now-0" and not now.duplicate
        [again] = committer.store_now(_msgs("now")) or []  # a duplicate: the original
        assert again.duplicate and again.deliver_at_ms == now.deliver_at_ms
        assert committer.store_now(_msgs("big", 9)) is None  # too large: submit it
        first = committer.submit(_msgs("g1"))
        assert committer.store_now(_msgs("g2")) is None  # a group is forming: join it
        last = committer.submit(_msgs("g2"))
        await asyncio.gather(first, last)

    before = _groups(store)
    asyncio.run(main())
    assert _groups(store) - before == 2


def test_sends_of_one_iteration_share_one_group(store: DelayStore) -> None:
    async def main() -> list[list[str]]:
        committer = LoopCommitter(store, asyncio.get_running_loop())

        async def one(i: int) -> list[str]:
            return [r.msg_id for r in await committer.submit(_msgs(f"c{i}", 2))]

        return await asyncio.gather(*(one(i) for i in range(20)))

    before = _groups(store)
    answers = asyncio.run(main())
    assert answers == [[f"c{i}-0", f"c{i}-1"] for i in range(20)]
    assert _groups(store) - before == 1  # 40 messages of 20 requests: one write, one fsync


def test_a_large_group_goes_to_the_committer_thread(store: DelayStore) -> None:
    async def main() -> int:
        committer = LoopCommitter(store, asyncio.get_running_loop(), inline_max_messages=8)
        results = await committer.submit(_msgs("big", 50))
        return len(results)

    assert asyncio.run(main()) == 50
    assert store.stats()["appended"] >= 50


def test_duplicates_are_answered_with_the_original(store: DelayStore) -> None:
    async def main() -> None:
        committer = LoopCommitter(store, asyncio.get_running_loop())
        [first] = await committer.submit(_msgs("dup"))
        # in flight twice in one iteration, then again once durable
        a, b = await asyncio.gather(
            committer.submit(_msgs("dup2")), committer.submit(_msgs("dup2"))
        )
        [again] = await committer.submit(_msgs("dup"))
        assert again.duplicate and again.deliver_at_ms == first.deliver_at_ms
        assert [a[0].duplicate, b[0].duplicate] == [False, True]
        assert a[0].deliver_at_ms == b[0].deliver_at_ms

    asyncio.run(main())


def test_a_failed_write_fails_every_waiter_and_stores_nothing(store: DelayStore) -> None:
    mlog = store._committer._sh.files.mlog

    def broken(datas: list[bytes]) -> list[int]:
        raise OSError(5, "Input/output error")

    async def main() -> list[BaseException | object]:
        committer = LoopCommitter(store, asyncio.get_running_loop())
        lone = await asyncio.gather(committer.submit(_msgs("f0")), return_exceptions=True)
        many = await asyncio.gather(
            *(committer.submit(_msgs(f"f{i}")) for i in range(1, 5)), return_exceptions=True
        )
        return [*lone, *many]

    appended = store.stats()["appended"]
    real = mlog.append
    mlog.append = broken  # type: ignore[method-assign]
    try:
        outcomes = asyncio.run(main())
    finally:
        mlog.append = real  # type: ignore[method-assign]
    assert len(outcomes) == 5
    assert all(isinstance(o, StoreError) for o in outcomes), outcomes
    assert store.stats()["appended"] == appended

    async def retry() -> None:  # the ids were not remembered: they store now
        committer = LoopCommitter(store, asyncio.get_running_loop())
        [r] = await committer.submit(_msgs("f0"))
        assert not r.duplicate

    asyncio.run(retry())


def test_direct_sends_are_answered_by_callback_alone_or_in_one_group(store: DelayStore) -> None:
    async def main() -> dict[str, object]:
        loop = asyncio.get_running_loop()
        committer = LoopCommitter(store, loop)
        got: dict[str, object] = {}
        done = asyncio.Event()

        def answer(tag: str, count: int) -> Callable[[object], None]:
            def call(outcome: object) -> None:
                got[tag] = outcome
                if len(got) == count:
                    done.set()

            return call

        committer.store_soon(_msgs("lone"), None, None, answer("lone", 1))
        assert got == {}  # never before store_soon returns
        await asyncio.wait_for(done.wait(), 10)
        lone_groups = _groups(store)
        lone = got.pop("lone")
        done.clear()
        committer.store_soon(_msgs("a", 2), None, None, answer("a", 3))
        committer.store_soon(_msgs("late"), None, 0, answer("late", 3))  # deadline passed
        committer.store_soon(_msgs("b"), None, None, answer("b", 3))
        routed = committer.submit(_msgs("c"))
        await asyncio.wait_for(done.wait(), 10)
        got["c"] = await routed
        got["groups"] = (lone_groups, _groups(store))
        got["lone"] = lone
        return got

    before = _groups(store)
    got = asyncio.run(main())
    assert [r.msg_id for r in got["lone"]] == ["lone-0"]  # type: ignore[attr-defined]
    assert [r.msg_id for r in got["a"]] == ["a-0", "a-1"]  # type: ignore[attr-defined]
    assert isinstance(got["late"], DeadlineExceededError)
    assert [r.msg_id for r in got["b"]] == ["b-0"] and [r.msg_id for r in got["c"]] == ["c-0"]  # type: ignore[attr-defined]
    assert got["groups"] == (before + 1, before + 2)  # alone: one; then one for all four
