"""Parents and children, cancels and manual retries, on every backend."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement
from conveyor.errors import InvalidState
from conveyor.store import Lease, Store
from tests.helpers import FakeClock, new
from tests.store.common import claim
from tests.store.recording import create_store


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
    # the plain jobs, in one round trip (postgres/_settle.py): each path is fenced.
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
