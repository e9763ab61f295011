"""The store contract, run unchanged against every backend (a real SQLite file, a real
PostgreSQL database), with the store's clock pinned so lease expiry is deterministic.

Every operation of the Store protocol is called here (a test below checks that), so a
backend that passes this module implements the whole seam.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import pathlib
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.core.auth import Role, Token, hash_secret
from conveyor.core.cron import Cron, Schedule, tick_id
from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Progress, Settlement
from conveyor.errors import InvalidState
from conveyor.store import JobPageQuery, Lease, Retention, Store, create_store
from conveyor.store.protocol import AuditEntry
from tests.helpers import FakeClock, new, schema


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
    assert len(await store.page_jobs(JobPageQuery(limit=500))) == 100


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


async def test_a_large_batch_is_stored_as_submitted_and_taken_ids_are_found(
    store: Store, clock: FakeClock
) -> None:
    """Large batches may take a faster path (PostgreSQL: COPY); what they store and return,
    and how a taken id is answered, are the same as for a small batch."""
    at = datetime(2031, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    batch = [
        new(
            f"j{i:03}",
            payload={"n": i, "text": "é\u2603"},
            priority=i % 3,
            delay=float(i % 5),
            run_at=at if i % 7 == 0 else None,
            tenant="acme" if i % 2 else None,
            concurrency_key="k" if i % 4 == 0 else None,
            timeout=2.5 if i % 6 == 0 else None,
            lease=9.0 if i % 8 == 0 else None,
            state={"resume": i} if i % 9 == 0 else None,
            trace_context="00-" + "1" * 32 + "-" + "2" * 16 + "-01" if i % 10 == 0 else None,
        )
        for i in range(200)
    ]
    first = await store.submit(batch)
    assert all(r.created for r in first)
    for r in first:
        assert r.job == await store.get(r.job.id)
    again = await store.submit([new("fresh"), *batch[:60], new("j000", payload={"n": -1})])
    assert again[0].created and not any(r.created for r in again[1:])
    assert [r.job for r in again[1:61]] == [r.job for r in first[:60]]
    assert again[61].job.payload == first[0].job.payload
    twice = await store.submit([new(f"d{i}") for i in range(100)] + [new("d0")])
    assert all(r.created for r in twice[:100]) and not twice[100].created


_AWKWARD = "tab\there, line\nbreak, cr\r, back\\slash \\N \\. é\u2603"


def _awkward_job(i: int, at: datetime) -> object:
    """A job with every optional field set, and text that COPY's format must escape."""
    return new(
        f"w{i:03}",
        type=f"type {_AWKWARD}",
        queue=f"queue {_AWKWARD}",
        payload={"text": _AWKWARD, "quote": '"\\"', "n": i, "f": 0.1 * i, "l": [None, True]},
        priority=-i,
        delay=1.5 if i % 2 else 0.0,
        run_at=at if i % 3 == 0 else None,
        max_attempts=7,
        timeout=2.5,
        lease=9.0,
        backoff_base=0.5,
        backoff_cap=60.0,
        concurrency_key=f"key {_AWKWARD}",
        state={"resume": _AWKWARD},
        trace_context="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        submitted_by=f"token:{_AWKWARD}",
    )


@pytest.mark.parametrize("size", [1, 120])
async def test_every_field_is_stored_as_submitted_one_job_or_a_large_batch(
    store: Store, clock: FakeClock, size: int
) -> None:
    """One job and a large batch take their own fast paths (one prepared INSERT; on
    PostgreSQL, COPY text): each stores every field as given, awkward text included, and
    returns the job as a read returns it."""
    at = datetime(2031, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    jobs = [_awkward_job(i, at) for i in range(size)]
    results = await store.submit(jobs)  # type: ignore[arg-type]
    assert all(r.created for r in results)
    for job, r in zip(jobs, results, strict=True):
        read = await store.get(r.job.id)
        assert r.job == read
        assert read is not None and read.status is Status.QUEUED
        for field in ("type", "queue", "payload", "priority", "max_attempts", "timeout"):
            assert getattr(read, field) == getattr(job, field), field
        assert (read.lease, read.backoff_base, read.backoff_cap) == (9.0, 0.5, 60.0)
        assert (read.concurrency_key, read.state) == (job.concurrency_key, job.state)  # type: ignore[attr-defined]
        assert read.trace_context == job.trace_context  # type: ignore[attr-defined]
        assert read.submitted_by == job.submitted_by  # type: ignore[attr-defined]
        expected_run_at = job.run_at or read.created_at + timedelta(seconds=job.delay)  # type: ignore[attr-defined]
        assert read.run_at == expected_run_at


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


async def test_a_claim_over_several_queues_takes_claim_order_across_them(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("m1", queue="media", priority=1), new("d1", priority=2)])
    await store.submit([new("m0", queue="media", priority=0), new("e0", queue="email")])
    await store.submit([new("d0", priority=0), new("later", queue="media", delay=60)])
    await store.set_paused("email", True)
    both = ("default", "media", "email")
    assert sorted(j.id for j in await claim(store, limit=3, queues=both)) == ["d0", "m0", "m1"]
    assert [j.id for j in await claim(store, queues=both)] == ["d1"]
    await store.set_paused("email", False)
    clock.advance(61)
    assert sorted(j.id for j in await claim(store, queues=both)) == ["e0", "later"]


async def test_claims_over_a_long_or_repeating_list_of_queues_take_claim_order_too(
    store: Store,
) -> None:
    await store.submit([new("q3-b", queue="q3", priority=1), new("q3-a", queue="q3")])
    await store.submit([new("q17", queue="q17", priority=0), new("d", priority=2)])
    many = (*(f"q{n}" for n in range(20)), "default")  # past the per-queue union
    assert sorted(j.id for j in await claim(store, limit=2, queues=many)) == ["q17", "q3-a"]
    twice = ("q3", "default", "q3", "default")
    assert [j.id for j in await claim(store, limit=1, queues=twice)] == ["q3-b"]
    assert [j.id for j in await claim(store, queues=twice)] == ["d"]


async def test_a_batch_mixing_plain_successes_with_other_ends_settles_each_as_alone(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new(x) for x in ("plain", "result", "ref", "retry", "fail", "back")])
    jobs = {j.id: j for j in await claim(store)}
    ok, failed = Outcome.SUCCEEDED, Outcome.FAILED

    def end(job_id: str, status: Status, outcome: Outcome | None, **kw: object) -> Settlement:
        return Settlement(job_id, jobs[job_id].lease_token, status, outcome, **kw)  # type: ignore[arg-type]

    refused = await store.settle(
        [
            end("plain", Status.SUCCEEDED, ok),
            end("result", Status.SUCCEEDED, ok, result={"n": [1, "two"]}),
            end("ref", Status.SUCCEEDED, ok, result_ref="s3://x", progress=Progress(2, 2)),
            end("retry", Status.QUEUED, failed, error="boom", retry_delay=5),
            end("fail", Status.FAILED, failed, error="bad", traceback="tb"),
            end("back", Status.QUEUED, None),
        ]
    )
    assert refused == []
    got = {j.id: j for j in await store.get_many(list(jobs))}
    assert got["plain"].status is Status.SUCCEEDED and got["plain"].result is None
    assert got["result"].result == {"n": [1, "two"]} and got["result"].finished_at is not None
    assert got["ref"].result_ref == "s3://x" and got["ref"].progress == Progress(2, 2)
    assert got["retry"].status is Status.QUEUED and got["retry"].error == "boom"
    assert got["fail"].status is Status.FAILED and got["fail"].error == "bad"
    assert got["back"].status is Status.QUEUED and got["back"].attempt == 0
    assert [a.outcome for a in await store.attempts("plain")] == [ok]
    assert [a.outcome for a in await store.attempts("result")] == [ok]
    assert await store.attempts("back") == []
    stale = Settlement("plain", jobs["plain"].lease_token, Status.SUCCEEDED, ok)
    assert await store.settle([stale]) == ["plain"]  # settled once only


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


# -- the rest of the protocol, operation by operation ------------------------------------


async def test_open_and_close_are_idempotent_and_now_is_the_stores_clock(
    db_url: str, clock: FakeClock
) -> None:
    s = create_store(db_url, clock=clock)
    await s.open()
    await s.open()
    try:
        assert (await s.now()).timestamp() == clock.now
        clock.advance(90)
        assert (await s.now()).timestamp() == clock.now
    finally:
        await s.close()
    await s.close()


async def test_get_many_returns_the_jobs_that_exist(store: Store) -> None:
    await store.submit([new("a"), new("b"), new("c")])
    found = await store.get_many(["c", "missing", "a"])
    assert sorted(j.id for j in found) == ["a", "c"]
    assert await store.get_many([]) == []


async def test_page_jobs_filters_and_pages_by_creation_without_skipping_or_repeating(
    store: Store, clock: FakeClock
) -> None:
    for i in range(7):  # one a second, and two at the same instant (ties broken by id)
        await store.submit([new(f"j{i}", type="even" if i % 2 == 0 else "odd")])
        if i != 3:
            clock.advance(1)
    await store.submit([new("media", queue="media")])
    first = await store.page_jobs(JobPageQuery(limit=3))
    assert [j.id for j in first] == ["media", "j6", "j5"]

    seen: list[str] = []
    after = None
    while page := await store.page_jobs(JobPageQuery(queue="default", after=after, limit=2)):
        seen.extend(j.id for j in page)
        after = (page[-1].created_at, page[-1].id)
    assert seen == ["j6", "j5", "j4", "j3", "j2", "j1", "j0"]

    oldest = await store.page_jobs(JobPageQuery(type="even", newest_first=False))
    assert [j.id for j in oldest] == ["j0", "j2", "j4", "j6"]
    j2 = await store.get("j2")
    assert j2 is not None
    window = JobPageQuery(
        created_after=j2.created_at,
        created_before=j2.created_at + timedelta(seconds=2),
        newest_first=False,
    )
    assert [j.id for j in await store.page_jobs(window)] == ["j2", "j3", "j4"]
    (running,) = await claim(store, limit=1)
    only = await store.page_jobs(JobPageQuery(status=(Status.RUNNING,)))
    assert [j.id for j in only] == [running.id]


async def test_spawn_is_fenced_and_a_parent_waits_for_its_children(store: Store) -> None:
    await store.submit([new("parent")])
    (parent,) = await claim(store)
    lease = Lease("parent", parent.lease_token)
    assert await store.spawn(Lease("parent", parent.lease_token + 1), [new("x")]) is None
    spawned = await store.spawn(lease, [new("c1"), new("c2")])
    assert spawned is not None and [s.job.id for s in spawned] == ["c1", "c2"]
    assert {s.job.parent_id for s in spawned} == {"parent"}
    assert {s.job.root_id for s in spawned} == {"parent"}
    assert await store.get("x") is None

    done = Settlement("parent", parent.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    assert await store.settle([done]) == []
    waiting = await store.get("parent")
    assert waiting is not None and waiting.status is Status.WAITING
    children = await claim(store)
    assert sorted(c.id for c in children) == ["c1", "c2"]
    await store.settle(
        [Settlement(c.id, c.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED) for c in children]
    )
    # Settling the last child ended the parent (in the same settle); the safety net finds
    # nothing left to do.
    assert await store.finish_parents(limit=10) == []
    finished = await store.get("parent")
    assert finished is not None and finished.status is Status.SUCCEEDED


async def test_a_childs_settle_is_fenced_by_its_token_and_counted_by_its_parent(
    store: Store,
) -> None:
    await store.submit([new("parent")])
    (parent,) = await claim(store)
    await store.spawn(Lease("parent", parent.lease_token), [new(f"c{i}") for i in range(4)])
    await store.settle(
        [Settlement("parent", parent.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)]
    )
    c = {job.id: job for job in await claim(store)}

    def ok(job_id: str) -> Settlement:
        return Settlement(job_id, c[job_id].lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)

    def stale(job_id: str) -> Settlement:
        return Settlement(job_id, c[job_id].lease_token - 1, Status.SUCCEEDED, Outcome.SUCCEEDED)

    async def succeeded_below() -> int:
        job = await store.get("parent")
        assert job is not None and job.below is not None and job.below.total == 4
        return job.below.succeeded

    # The first batch meets a tree; on PostgreSQL the later ones settle its children with
    # the plain jobs, in one round trip (postgres/_leaves.py): each path is fenced.
    await store.submit([new("plain")])
    (plain,) = await claim(store)
    mixed = [
        ok("c0"),
        stale("c1"),
        Settlement("plain", plain.lease_token + 1, Status.SUCCEEDED, Outcome.SUCCEEDED),
    ]
    assert sorted(await store.settle(mixed)) == ["c1", "plain"]
    assert await succeeded_below() == 1
    assert await store.settle([stale("c1"), stale("c2"), ok("c0")]) == ["c1", "c2", "c0"]
    assert await succeeded_below() == 1
    assert await store.settle([ok("c1"), stale("c2")]) == ["c2"]
    assert await succeeded_below() == 2
    for job_id in ("c0", "c1", "c2"):
        found = await store.get(job_id)
        assert found is not None
        assert found.status is (Status.RUNNING if job_id == "c2" else Status.SUCCEEDED)
    assert await store.settle([ok("c2"), ok("c3")]) == []
    assert await succeeded_below() == 4
    done = await store.get("parent")
    assert done is not None and done.status is Status.SUCCEEDED
    assert [a.outcome for a in await store.attempts("c1")] == [Outcome.SUCCEEDED]


async def test_a_parent_ends_once_when_its_last_two_children_settle_at_once(
    store: Store, db_url: str, clock: FakeClock | None
) -> None:
    other = create_store(db_url, clock=clock)
    await other.open()
    try:
        for round_ in range(6):
            parent_id = f"p{round_}"
            await store.submit([new(parent_id)])
            (parent,) = await claim(store)
            children = [new(f"{parent_id}.{i}") for i in range(2)]
            callbacks = {"complete": new("cb", type="t")}
            assert await store.spawn(Lease(parent_id, parent.lease_token), children, callbacks)
            returned = Settlement(
                parent_id, parent.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED
            )
            await store.settle([returned])
            a, b = sorted(await claim(store), key=lambda j: j.id)
            # Two stores, two connections: the two settles run at the same time.
            await asyncio.gather(
                store.settle(
                    [Settlement(a.id, a.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)]
                ),
                other.settle([Settlement(b.id, b.lease_token, Status.FAILED, Outcome.FAILED)]),
            )
            ended = await store.get(parent_id)
            assert ended is not None and ended.status is Status.FAILED, round_
            assert ended.below is not None and (ended.below.succeeded, ended.below.failed) == (1, 1)
            fired = await store.get(f"{parent_id}.on_complete")
            assert fired is not None and fired.payload["batch"]["failed"] == 1
            assert await store.get(f"{parent_id}.on_complete.2") is None, "fired once"
            (callback,) = await claim(store)  # out of the way of the next round's claims
            await store.settle(
                [Settlement(callback.id, callback.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)]
            )
            assert await store.finish_parents(limit=10) == []
    finally:
        await other.close()


async def test_retry_makes_a_new_job_and_leaves_the_old_one_as_it_was(store: Store) -> None:
    await store.submit([new("a", max_attempts=1)])
    (job,) = await claim(store)
    failed = Settlement("a", job.lease_token, Status.FAILED, Outcome.FAILED, error="boom")
    await store.settle([failed])
    again = await store.retry("a", new("a2", retry_of="a"))
    assert again is not None and again.retry_of == "a" and again.status is Status.QUEUED
    old = await store.get("a")
    assert old is not None and old.status is Status.FAILED and old.error == "boom"
    assert await store.retry("missing", new("m2", retry_of="missing")) is None
    with pytest.raises(InvalidState):
        await store.retry("a2", new("a3", retry_of="a2"))  # still queued


async def test_prune_deletes_finished_jobs_past_their_retention_only(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("old"), new("recent"), new("queued", delay=10_000)])
    for job in await claim(store):
        await store.settle(
            [Settlement(job.id, job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)]
        )
        if job.id == "old":
            clock.advance(100)
    retention = Retention(succeeded=50)
    assert await store.prune(retention, limit=10) == 1
    assert await store.get("old") is None
    assert await store.get("recent") is not None and await store.get("queued") is not None
    assert await store.prune(retention, limit=10) == 0


async def test_schedules_sync_fire_once_per_tick_toggle_and_run_by_hand(
    store: Store, clock: FakeClock
) -> None:
    beat = Schedule("beat", Cron("* * * * * *"), "t", {"n": 1})
    await store.sync_schedules([beat])
    (info,) = await store.schedules()
    assert info.enabled and info.schedule == beat
    assert info.next_run_at.timestamp() == clock.now + 1

    clock.advance(1.75)  # the first tick is 0.75 s late: past half the one-second gap
    assert await store.fire_schedules(limit=10) == []  # by the schedule's own grace, missed
    clock.advance(1)  # the second tick is as late, but within the firer's grace
    fired = await store.fire_schedules(limit=10, min_grace=2.0)
    assert fired == [tick_id("beat", datetime.fromtimestamp(info.next_run_at.timestamp() + 1, UTC))]
    assert await store.fire_schedules(limit=10, min_grace=2.0) == []  # once per tick

    off = await store.set_schedule_enabled("beat", False)
    assert off is not None and not off.enabled
    clock.advance(5)
    assert await store.fire_schedules(limit=10, min_grace=2.0) == []
    manual = await store.run_schedule("beat")
    assert manual is not None and manual.type == "t" and manual.id.startswith("cron-manual:")
    assert await store.run_schedule("missing") is None
    on = await store.set_schedule_enabled("beat", True)
    assert on is not None and on.enabled and on.next_run_at.timestamp() > clock.now


async def test_a_named_lease_is_acquired_renewed_released_and_remembered(
    store: Store, clock: FakeClock
) -> None:
    held = await store.acquire_lease("export", owner="a", ttl=10)
    assert held.owner == "a"
    other = await store.acquire_lease("export", owner="b", ttl=10)
    assert other.owner == "a" and other.token == held.token  # held elsewhere: unchanged
    clock.advance(5)
    until = await store.renew_lease("export", token=held.token, ttl=10)
    assert until is not None and until.timestamp() == clock.now + 10
    assert await store.renew_lease("export", token=held.token + 1, ttl=10) is None
    assert await store.release_lease("export", token=held.token)
    assert not await store.release_lease("export", token=held.token)
    taken = await store.acquire_lease("export", owner="b", ttl=10)
    assert taken.owner == "b" and taken.token > held.token
    history = await store.lease_history("export")
    assert [(r.owner, r.ended) for r in history] == [("b", None), ("a", "released")]


async def test_health_counts_queued_due_running_stale_and_workers(
    store: Store, clock: FakeClock
) -> None:
    from conveyor.store import WorkerInfo

    await store.register_worker(WorkerInfo("w1", "host", 1, ("default",), 4))
    await store.submit([new("a"), new("b"), new("later", delay=60)])
    await claim(store, limit=1)
    health = await store.health()
    assert (health.queued, health.due, health.running, health.stale_running) == (2, 1, 1, 0)
    assert (health.workers, health.live_workers) == (1, 1)
    assert health.now.timestamp() == clock.now
    clock.advance(31)  # the claim's 30 s lease has expired, not yet rescued
    assert (await store.health()).stale_running == 1


async def test_tokens_are_created_found_touched_revoked_once_and_listed(
    store: Store, clock: FakeClock
) -> None:
    made = datetime.fromtimestamp(clock.now, UTC)
    token = Token("t1", "acme", Role.WRITE, hash_secret("s3cret"), "ci", made)
    await store.create_token(token)
    assert await store.find_token("t1") == token
    assert await store.find_token("missing") is None
    clock.advance(10)
    await store.touch_token("t1")
    touched = await store.find_token("t1")
    assert touched is not None and touched.last_used_at is not None
    assert touched.last_used_at.timestamp() == pytest.approx(clock.now, abs=0.01)
    revoked = await store.revoke_token("t1")
    assert revoked is not None and revoked.revoked_at is not None and not revoked.active
    clock.advance(10)
    again = await store.revoke_token("t1")
    assert again is not None and again.revoked_at == revoked.revoked_at
    assert await store.revoke_token("missing") is None
    await store.create_token(Token("t2", "acme", Role.READ, hash_secret("x"), None, made))
    assert {t.id for t in await store.list_tokens()} == {"t1", "t2"}


async def test_tokens_expire_and_rotate_with_a_grace_and_servers_share_a_secret(
    store: Store, clock: FakeClock
) -> None:
    made = datetime.fromtimestamp(clock.now, UTC)
    until = made + timedelta(days=30)
    token = Token("t1", "acme", Role.READ, hash_secret("one"), None, made, expires_at=until)
    await store.create_token(token)
    found = await store.find_token("t1")
    assert found is not None and found.expires_at == until
    grace = made + timedelta(minutes=10)
    rotated = await store.rotate_token("t1", secret_hash=hash_secret("two"), grace_until=grace)
    assert rotated is not None and rotated.secret_hash == hash_secret("two")
    assert rotated.previous_hash == hash_secret("one") and rotated.previous_expires_at == grace
    assert rotated.matches("one", made) and not rotated.matches("one", grace)
    at_once = await store.rotate_token("t1", secret_hash=hash_secret("three"), grace_until=None)
    assert at_once is not None and at_once.previous_hash is None
    assert not at_once.matches("two", made) and at_once.matches("three", made)
    await store.revoke_token("t1")
    assert await store.rotate_token("t1", secret_hash="x", grace_until=None) is None
    assert await store.rotate_token("missing", secret_hash="x", grace_until=None) is None
    secret = await store.server_secret("cursor")
    assert secret is not None and len(secret) >= 32
    assert await store.server_secret("cursor") == secret  # made once, by the migration
    assert await store.server_secret("nothing") is None


# -- behaviour every backend must show (once PostgreSQL-only) ---------------------------


async def test_concurrent_claims_never_share_a_job(
    db_url: str, store: Store, clock: FakeClock
) -> None:
    await store.submit([new(f"j{i:04d}") for i in range(1000)])
    stores = [create_store(db_url, clock=clock) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    claimed: list[str] = []

    async def drain(s: Store, name: str) -> None:
        while batch := await s.claim(worker_id=name, queues=["default"], limit=7, lease=30):
            claimed.extend(j.id for j in batch)

    try:
        await asyncio.gather(*(drain(s, f"w{i}") for i, s in enumerate(stores)))
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert sorted(claimed) == [f"j{i:04d}" for i in range(1000)]


async def test_payloads_and_results_come_back_exactly_as_written(store: Store) -> None:
    payload = {"z": 1, "a": [1.0, 1e300, "\u0000", "\u00e9\U0001f600"], "m": {"y": None, "b": True}}
    result = {"out": [0.1, -0.0, 2**53], "s": "x" * 10_000}
    (submitted,) = await store.submit([new("a", payload=payload)])
    job = await store.get("a")
    assert job is not None
    assert json.dumps(job.payload) == json.dumps(payload)
    assert json.dumps(submitted.job.payload) == json.dumps(payload)
    (running,) = await claim(store)
    done = Settlement("a", running.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED, result=result)
    await store.settle([done])
    finished = await store.get("a")
    assert finished is not None and json.dumps(finished.result) == json.dumps(result)


def test_the_store_implements_the_whole_protocol_with_the_same_parameters(store: Store) -> None:
    for name, method in _operations().items():
        ours = getattr(type(store), name, None)
        assert ours is not None, f"{type(store).__name__} has no {name}()"
        expected = list(inspect.signature(method).parameters)
        assert list(inspect.signature(ours).parameters) == expected, name


def test_this_contract_calls_every_store_operation() -> None:
    source = pathlib.Path(__file__).read_text()
    # list_jobs is being folded into page_jobs; it is not part of the contract any more.
    missing = [
        name
        for name in _operations()
        if name != "list_jobs" and not re.search(rf"\.{name}\(", source)
    ]
    assert missing == [], f"no test here calls {missing}"


def _operations() -> dict[str, Callable[..., object]]:
    return {
        name: method
        for name, method in vars(Store).items()
        if inspect.isfunction(method) and not name.startswith("_")
    }


async def test_upgrading_one_release_at_a_time_gives_the_schema_of_a_fresh_install(
    db_url: str, second_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = create_store(db_url, migrate=False)
    backend = importlib.import_module(type(fresh).__module__)
    migrations = backend._MIGRATIONS
    try:
        assert len(await fresh.migrate()) == len(migrations)
    finally:
        await fresh.close()
    for known in range(1, len(migrations) + 1):
        # An older conveyor, which knew only the first migrations, then the next one.
        monkeypatch.setattr(backend, "_MIGRATIONS", migrations[:known])
        older = create_store(second_db_url, migrate=False)
        try:
            assert await older.migrate() == [migrations[known - 1][1]]
        finally:
            await older.close()
    assert await schema(second_db_url) == await schema(db_url)


async def test_the_dashboards_reads_count_what_the_store_holds(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("root"), new("waiting", queue="media")])
    (root,) = await claim(store, limit=1)
    await store.spawn(Lease("root", root.lease_token), [new("c1"), new("c2")])
    assert await store.running_by_worker() == {"w1": 1}
    below = (await store.get("root")).below  # type: ignore[union-attr]
    assert below is not None and (below.queued, below.total) == (2, 2)
    clock.advance(5)
    lag = {q.queue: q for q in await store.queue_lag()}
    assert lag["media"].due == 1 and lag["media"].oldest_age == pytest.approx(5, abs=0.5)
    for child in await claim(store):
        done = Settlement(child.id, child.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        await store.settle([done])
    since = datetime.fromtimestamp(clock.now - 3600, UTC)
    assert sum(m.succeeded for m in await store.minute_stats(since)) == 2
    await store.acquire_lease("export", owner="a", ttl=10)
    assert await store.lease_names() == ["export"]
    at = datetime.fromtimestamp(clock.now, UTC)
    await store.record_audit(AuditEntry(at, "acme", "t1", "job.cancel", "root"))
    await store.record_audit(AuditEntry(at, "other", "t2", "queue.pause", "media"))
    (entry,) = await store.audit_log(tenant="acme")
    assert (entry.action, entry.target, entry.id is not None) == ("job.cancel", "root", True)
    assert [e.tenant for e in await store.audit_log()] == ["other", "acme"]


async def test_failed_jobs_below_a_root_are_retried_in_their_place(store: Store) -> None:
    await store.submit([new("root")])
    (root,) = await claim(store, limit=1)
    await store.spawn(Lease("root", root.lease_token), [new("a"), new("b")])
    returned = Settlement("root", root.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    assert await store.settle([returned]) == []
    for child in await claim(store):
        failed = Settlement(child.id, child.lease_token, Status.FAILED, Outcome.FAILED, error="x")
        await store.settle([failed])
    assert (await store.get("root")).status is Status.FAILED  # type: ignore[union-attr]
    assert await store.failed_below("root", limit=10) == ["a", "b"]
    retry = new("a2", parent_id="root", root_id="root", retry_of="a", retry_count=1)
    twice = new("a3", parent_id="root", root_id="root", retry_of="a", retry_count=1)
    (again,) = await store.retry_many([("a", retry), ("a", twice)])  # "a" is retried once
    assert (again.id, again.status) == ("a2", Status.QUEUED)
    root_now = await store.get("root")
    assert root_now is not None and root_now.status is Status.WAITING
    assert root_now.below is not None and (root_now.below.failed, root_now.below.total) == (1, 2)
    assert [e.event for e in await store.job_events("root")] == ["reopened"]
    assert await store.failed_below("root", limit=10) == ["b"]
    noted = await store.note_retry_limit("b", "x; retry limit reached")
    assert noted is not None and noted.error == "x; retry limit reached"
    assert await store.note_retry_limit("a2", "not failed") is None


async def test_a_tenants_reads_count_only_its_jobs(store: Store) -> None:
    acme = [new("acme/a", tenant="acme"), new("acme/b", tenant="acme", queue="media")]
    await store.submit([*acme, new("globex/a", tenant="globex"), new("plain")])
    assert await store.count_queued("acme") == 2 and await store.count_queued("nobody") == 0
    counts = {q.name: q.counts for q in await store.queues(tenant="acme")}
    assert counts == {"default": {"queued": 1}, "media": {"queued": 1}}
    await claim(store)
    assert await store.running_by_worker(tenant="globex") == {"w1": 1}
    assert await store.running_by_worker() == {"w1": 3}


async def test_the_tenant_namespace_migration_moves_live_jobs_with_their_references(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of the release before tenant namespaces, holding jobs of every kind of
    link: after the upgrade each tenant's job is tenant/id, and every link follows it."""
    old = create_store(db_url, migrate=False)
    backend = importlib.import_module(type(old).__module__)
    migrations = backend._MIGRATIONS
    at = next(i for i, m in enumerate(migrations) if m[1].endswith("_tenant_namespaces.sql"))
    monkeypatch.setattr(backend, "_MIGRATIONS", migrations[:at])
    try:
        await old.migrate()
        await old.open()
        # That release's claim did not look at tenants (their index is the migration's).
        old._tenant_mix.saw([])  # type: ignore[attr-defined]
        await old.submit([new("parent", tenant="acme"), new("flaky", tenant="acme")])
        await old.submit([new("plain"), new("keyed", tenant="acme", unique_key="k")])
        jobs = {j.id: j for j in await claim(old, limit=2)}
        await old.spawn(Lease("parent", jobs["parent"].lease_token), [new("child", tenant="acme")])
        await old.submit([new("after", tenant="acme", depends_on=("child",))])
        failed = Settlement("flaky", jobs["flaky"].lease_token, Status.FAILED, Outcome.FAILED)
        await old.settle([failed])
        await old.retry("flaky", new("again", tenant="acme", retry_of="flaky"))
    finally:
        await old.close()
    monkeypatch.setattr(backend, "_MIGRATIONS", migrations)
    upgraded = create_store(db_url)
    try:
        await upgraded.open()
        assert await upgraded.get("parent") is None
        parent = await upgraded.get("acme/parent")
        assert parent is not None and parent.status is Status.RUNNING
        assert parent.below is not None and parent.below.total == 1  # its counts moved too
        child = await upgraded.get("acme/child")
        assert child is not None and (child.parent_id, child.root_id) == ("acme/parent",) * 2
        after = await upgraded.get("acme/after")
        assert after is not None and after.depends_on == ("acme/child",)
        again = await upgraded.get("acme/again")
        assert again is not None and again.retry_of == "acme/flaky"
        assert len(await upgraded.attempts("acme/flaky")) == 1
        assert (await upgraded.get("plain")) is not None
        # The moved links work: the child runs, and its dependent is released.
        (claimed,) = [j for j in await claim(upgraded) if j.id == "acme/child"]
        done = Settlement(claimed.id, claimed.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        await upgraded.settle([done])
        after = await upgraded.get("acme/after")
        assert after is not None and after.status is Status.QUEUED
        # Unique keys are per tenant now.
        [theirs] = await upgraded.submit([new("globex/keyed", tenant="globex", unique_key="k")])
        [mine] = await upgraded.submit([new("acme/other", tenant="acme", unique_key="k")])
        assert theirs.created and not mine.created and mine.job.id == "acme/keyed"
    finally:
        await upgraded.close()


async def test_a_settle_retried_after_its_answer_was_lost_is_told_from_lost_leases(
    store: Store,
) -> None:
    # A database restart can lose a settle's answer after its commit: the worker's retry
    # is refused for those jobs, whose results are recorded, not lost (worker.py).
    from conveyor.worker import _Run, recorded_before

    await store.submit([new("recorded"), new("taken")])
    jobs = {job.id: job for job in await claim(store)}
    first = Settlement(
        "recorded", jobs["recorded"].lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED
    )
    assert await store.settle([first]) == []  # the try whose answer was lost
    stale = jobs["taken"].lease_token - 1  # a lease that really is gone
    retry = [first, Settlement("taken", stale, Status.SUCCEEDED, Outcome.SUCCEEDED)]
    refused = set(await store.settle(retry))
    assert refused == {"recorded", "taken"}
    batch = [(_Run(jobs[s.job_id], 30.0, 0.0), s) for s in retry]
    assert await recorded_before(store, batch, refused) == {"recorded"}
