"""The store contract, run unchanged against every backend (a real SQLite file, a real
PostgreSQL database), with the store's clock pinned so lease expiry is deterministic."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Progress, Settlement
from conveyor.store import JobQuery, Lease, Store, create_store
from tests.helpers import FakeClock, new


async def claim(store: Store, limit: int = 10, queues: tuple[str, ...] = ("default",)):
    return await store.claim(worker_id="w1", queues=queues, limit=limit, lease=30)


async def test_submit_then_same_id_returns_the_existing_job(store: Store) -> None:
    first = await store.submit([new("a")])
    again = await store.submit([new("a", payload={"n": 2})])
    assert first[0].created and not again[0].created
    assert again[0].job.payload == {"n": 1}
    assert (await store.get("a")).status is Status.QUEUED  # type: ignore[union-attr]


async def test_bulk_submit_is_one_transaction(store: Store) -> None:
    results = await store.submit([new(f"j{i}") for i in range(100)])
    assert all(r.created for r in results)
    assert len(await store.list_jobs(JobQuery(limit=500))) == 100


async def test_unique_key_returns_the_active_job(store: Store) -> None:
    a = await store.submit([new("a", unique_key="k")])
    b = await store.submit([new("b", unique_key="k")])
    assert b[0].job.id == "a" and not b[0].created
    assert a[0].created


async def test_a_batch_returns_each_job_as_stored_and_existing_ids_as_found(
    store: Store,
) -> None:
    await store.submit([new("old", payload={"n": 0})])
    batch = [
        new("a", payload={"n": 1}, priority=3, delay=5.0),
        new("old", payload={"n": 2}),
        new("b", unique_key="k"),
        new("a", payload={"n": 3}),
        new("c", unique_key="k"),
    ]
    results = await store.submit(batch)
    assert [(r.job.id, r.created) for r in results] == [
        ("a", True),
        ("old", False),
        ("b", True),
        ("a", False),
        ("b", False),
    ]
    # What a submit returns is what a read returns, field for field.
    for r in results:
        assert r.job == await store.get(r.job.id)
    assert results[1].job.payload == {"n": 0} and results[3].job.payload == {"n": 1}


async def test_claim_order_is_priority_then_run_at_then_id(store: Store, clock: FakeClock) -> None:
    await store.submit([new("c", priority=5)])
    await store.submit([new("b", priority=0)])
    await store.submit([new("a", priority=0)])
    await store.submit([new("z", priority=-1)])
    claimed = await claim(store, limit=3)
    assert sorted(j.id for j in claimed) == ["a", "b", "z"]
    assert [j.id for j in await claim(store)] == ["c"]


async def test_claim_respects_run_at_queues_and_pauses(store: Store, clock: FakeClock) -> None:
    await store.submit([new("later", delay=60), new("other", queue="media"), new("now")])
    assert [j.id for j in await claim(store)] == ["now"]
    await store.set_paused("media", True)
    assert await claim(store, queues=("media",)) == []
    await store.set_paused("media", False)
    assert [j.id for j in await claim(store, queues=("media",))] == ["other"]
    clock.advance(61)
    assert [j.id for j in await claim(store)] == ["later"]


async def test_claim_sets_lease_token_and_attempt(store: Store, clock: FakeClock) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    assert job.status is Status.RUNNING
    assert job.attempt == 1
    assert job.lease_owner == "w1"
    assert job.lease_token >= 1
    assert job.lease_expires_at is not None
    assert job.lease_expires_at.timestamp() == pytest.approx(clock.now + 30, abs=0.01)


async def test_settle_is_fenced_by_the_token(store: Store) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    stale = Settlement("a", job.lease_token - 1, Status.SUCCEEDED, Outcome.SUCCEEDED, result=1)
    assert await store.settle([stale]) == ["a"]
    good = Settlement("a", job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED, result={"ok": 1})
    assert await store.settle([good]) == []
    assert await store.settle([good]) == ["a"]  # a second completion is refused too
    done = await store.get("a")
    assert done is not None and done.status is Status.SUCCEEDED and done.result == {"ok": 1}
    (attempt,) = await store.attempts("a")
    assert attempt.outcome is Outcome.SUCCEEDED and attempt.worker_id == "w1"


async def test_retry_settlement_requeues_with_delay(store: Store, clock: FakeClock) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    retry = Settlement(
        "a", job.lease_token, Status.QUEUED, Outcome.FAILED, error="boom", retry_delay=10
    )
    assert await store.settle([retry]) == []
    assert await claim(store) == []
    clock.advance(11)
    (again,) = await claim(store)
    assert again.attempt == 2 and again.lease_token > job.lease_token
    assert again.error == "boom"


async def test_hand_back_does_not_spend_an_attempt(store: Store) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    await store.settle([Settlement("a", job.lease_token, Status.QUEUED, None)])
    back = await store.get("a")
    assert back is not None and back.status is Status.QUEUED and back.attempt == 0
    assert await store.attempts("a") == []


async def test_heartbeat_renews_reports_lost_and_writes_progress(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("a"), new("b")])
    a, b = sorted(await claim(store), key=lambda j: j.id)
    clock.advance(20)
    beat = await store.heartbeat(
        worker_id="w1",
        leases=[Lease("a", a.lease_token), Lease("b", b.lease_token + 7)],
        lease=30,
        progress={Lease("a", a.lease_token): Progress(3, 10, "three")},
    )
    assert beat.lost == {"b"}
    renewed = await store.get("a")
    assert renewed is not None and renewed.lease_expires_at is not None
    assert renewed.lease_expires_at.timestamp() == pytest.approx(clock.now + 30, abs=0.01)
    assert renewed.progress == Progress(3, 10, "three")


async def test_rescue_records_a_lost_attempt_and_applies_the_retry_policy(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("a", max_attempts=2, backoff_base=5, backoff_cap=5)])
    (job,) = await claim(store)
    clock.advance(29)
    assert await store.rescue(limit=10, jitter=0.0) == []  # lease still valid
    clock.advance(2)
    (rescued,) = await store.rescue(limit=10, jitter=0.0)
    assert rescued.job_id == "a" and rescued.status is Status.QUEUED
    (attempt,) = await store.attempts("a")
    assert attempt.outcome is Outcome.LOST
    # The zombie's completion is refused after the rescue.
    late = Settlement("a", job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    assert await store.settle([late]) == ["a"]
    (_second,) = await claim(store)
    clock.advance(31)
    (rescued,) = await store.rescue(limit=10, jitter=0.0)
    assert rescued.status is Status.FAILED  # a job that kills its worker cannot loop forever
    final = await store.get("a")
    assert final is not None and final.attempt == 2 and final.status is Status.FAILED
    assert [a.outcome for a in await store.attempts("a")] == [Outcome.LOST, Outcome.LOST]


async def test_concurrent_rescuers_rescue_each_job_once(
    db_url: str, store: Store, clock: FakeClock
) -> None:
    await store.submit([new(f"j{i}") for i in range(50)])
    await claim(store, limit=50)
    clock.advance(31)
    others = [create_store(db_url, clock=clock) for _ in range(3)]
    for other in others:
        await other.open()
    try:
        results = await asyncio.gather(*(s.rescue(limit=100, jitter=0.0) for s in others))
    finally:
        for other in others:
            await other.close()
    rescued = [r.job_id for batch in results for r in batch]
    assert sorted(rescued) == sorted(f"j{i}" for i in range(50))
    for i in range(50):
        assert len(await store.attempts(f"j{i}")) == 1


async def test_checkpoint_is_fenced(store: Store) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    assert await store.checkpoint(Lease("a", job.lease_token), {"frame": 10})
    assert not await store.checkpoint(Lease("a", job.lease_token + 1), {"frame": 99})
    saved = await store.get("a")
    assert saved is not None and saved.state == {"frame": 10}


async def test_cancel_queued_at_once_and_running_by_request(store: Store) -> None:
    await store.submit([new("a"), new("b")])
    cancelled = await store.cancel("a", reason="no longer needed")
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    (running,) = await claim(store)
    requested = await store.cancel("b", reason="stop")
    assert requested is not None and requested.status is Status.RUNNING
    assert requested.cancel_requested
    beat = await store.heartbeat(
        worker_id="w1", leases=[Lease("b", running.lease_token)], lease=30, progress={}
    )
    assert beat.cancel_requested == {"b"}
    assert await store.cancel("missing", reason="x") is None


async def test_workers_and_queues_are_listed(store: Store) -> None:
    from conveyor.store import WorkerInfo

    await store.register_worker(WorkerInfo("w1", "host", 123, ("default",), 4))
    await store.submit([new("a"), new("b", queue="media")])
    (worker,) = await store.workers()
    assert worker.id == "w1" and worker.stopped_at is None
    await store.deregister_worker("w1")
    assert (await store.workers())[0].stopped_at is not None
    queues = {q.name: q for q in await store.queues()}
    assert queues["default"].counts == {"queued": 1}
    assert queues["media"].counts == {"queued": 1}


async def test_migrate_is_idempotent(store: Store) -> None:
    assert await store.migrate() == []


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
