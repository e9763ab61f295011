"""Wake-ups: a waiting store hears of other connections' commits."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib

from conveyor.store import Store
from tests.helpers import FakeClock, new
from tests.store.recording import create_store


async def test_sqlite_watcher_wakes_for_other_connections_commits_not_its_own(
    tmp_path: pathlib.Path,
) -> None:
    """A draining worker commits every few milliseconds; those commits must not wake it,
    and another process's submit in the middle of them still must."""
    url = f"sqlite:///{tmp_path / 'watched.db'}"
    ours, theirs = create_store(url), create_store(url)
    await ours.open()
    await theirs.open()
    try:
        # The first call starts the watcher, whose first look wakes waiters once.
        while await ours.wait_for_jobs(0.05) or not await _times_out(ours, 0.3):
            pass
        waiter = asyncio.create_task(ours.wait_for_jobs(30))
        for n in range(50):
            await ours.submit([new(f"own-{n}")])
        await asyncio.sleep(0.1)  # 50 watcher polls
        assert not waiter.done(), "the store's own commits woke it"
        for n in range(20):  # keep committing while the other connection commits once
            await ours.submit([new(f"more-{n}")])
            if n == 10:
                await theirs.submit([new("theirs")])
        await asyncio.wait_for(waiter, 10)
    finally:
        await ours.close()
        await theirs.close()


async def _times_out(store: Store, seconds: float) -> bool:
    """Whether ``wait_for_jobs`` ran its whole timeout (nothing woke it)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    await store.wait_for_jobs(seconds)
    return loop.time() - start >= seconds * 0.9


async def test_a_waiting_store_wakes_when_another_store_submits(
    db_url: str, clock: FakeClock
) -> None:
    """On every backend, ``wait_for_jobs`` returns before its timeout once another
    connection submits (SQLite: its watcher; PostgreSQL: LISTEN/NOTIFY)."""
    ours, theirs = create_store(db_url, clock=clock), create_store(db_url, clock=clock)
    await ours.open()
    await theirs.open()
    try:
        # The first calls start listening (SQLite's first look wakes waiters once): settle
        # until a wait runs its whole timeout, so that a wake-up below is the submit's.
        while not await _times_out(ours, 0.3):
            pass
        woke = False
        for n in range(10):  # a submit made before the listener was up is not heard
            waiter = asyncio.create_task(ours.wait_for_jobs(30))
            await asyncio.sleep(0)
            await theirs.submit([new(f"theirs-{n}")])
            done, _ = await asyncio.wait([waiter], timeout=3)
            if done:
                woke = True
                break
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        assert woke, "no submit by another connection woke the waiting store"
    finally:
        await ours.close()
        await theirs.close()
