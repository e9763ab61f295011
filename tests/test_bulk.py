"""Bulk jobs as users expect them (issue #12), on every backend: a root's status from its
leaves, re-opening on a manual retry, retry chains and limits, live counts kept by the
store, completion callbacks, durable cancel, top-level listing and who submitted a job."""

from __future__ import annotations

import asyncio
import importlib
import threading
import time
from typing import Any

import pytest

from conveyor import (
    Conveyor,
    InvalidState,
    JobContext,
    JobNotFound,
    Outcome,
    RetryLimitReached,
    Status,
    Submission,
)
from conveyor.app.tenants import TenantView
from conveyor.core.auth import Principal, Role
from conveyor.core.model import Settlement, TreeCounts
from conveyor.store import create_store
from tests.helpers import FakeClock, eventually, new, running_worker, settled


def three_levels(app: Conveyor, attempts_to_fail: dict[str, int], *, max_attempts: int) -> None:
    """root -> 2 branches -> 2 twigs each -> 3 leaves each (12 leaves, 19 jobs below)."""
    runs: dict[str, int] = {}

    @app.job(max_attempts=max_attempts, backoff="10ms")
    async def leaf(ctx: JobContext, name: str) -> str:
        runs[name] = runs.get(name, 0) + 1
        if runs[name] <= attempts_to_fail.get(name, 0):
            raise RuntimeError(f"{name} fails (run {runs[name]})")
        return name

    @app.job()
    async def twig(ctx: JobContext, name: str) -> None:
        await ctx.spawn_many(
            [Submission("leaf", {"name": f"{name}.{i}"}, id=f"{ctx.id}.{i}") for i in range(3)]
        )

    @app.job()
    async def branch(ctx: JobContext, name: str) -> None:
        await ctx.spawn_many(
            [Submission("twig", {"name": f"{name}.{i}"}, id=f"{ctx.id}.{i}") for i in range(2)]
        )

    @app.job()
    async def root(ctx: JobContext) -> None:
        await ctx.spawn_many(
            [Submission("branch", {"name": f"b{i}"}, id=f"{ctx.id}.{i}") for i in range(2)]
        )


async def test_a_leaf_that_fails_twice_then_succeeds_lets_the_root_succeed(app: Conveyor) -> None:
    three_levels(app, {"b1.0.2": 2}, max_attempts=3)
    root = await app.submit("root", {})
    async with running_worker(app, concurrency=8):
        await settled(root, Status.SUCCEEDED, timeout=60)
    assert root.below == TreeCounts(succeeded=2 + 4 + 12)
    assert (root.below.done, root.below.total) == (18, 18)
    branch = await app.get(f"{root.id}.1")
    assert branch.status is Status.SUCCEEDED and branch.below == TreeCounts(succeeded=2 + 6)
    leaf = await app.get(f"{root.id}.1.0.2")
    assert (leaf.status, leaf.attempt) == (Status.SUCCEEDED, 3)


async def test_a_leaf_failed_for_good_then_retried_by_hand_reopens_the_root(
    app: Conveyor,
) -> None:
    three_levels(app, {"b0.1.1": 1}, max_attempts=1)
    root = await app.submit("root", {})
    leaf_id, twig_id, branch_id = f"{root.id}.0.1.1", f"{root.id}.0.1", f"{root.id}.0"
    async with running_worker(app, concurrency=8):
        await settled(root, Status.FAILED, timeout=60)
        # The leaf failed, so did its twig and branch (for what failed below them).
        assert root.error == "3 failed and 0 cancelled of 18 jobs below it"
        assert root.below == TreeCounts(succeeded=15, failed=3)
        assert (await app.get(branch_id)).status is Status.FAILED
        retried = await app.retry(leaf_id)
        for reopened in (twig_id, branch_id, root.id):
            assert (await app.get(reopened)).status in (Status.WAITING, Status.SUCCEEDED)
        await settled(retried, Status.SUCCEEDED)
        await settled(root, Status.SUCCEEDED, timeout=30)
    # The failed leaf no longer counts, its retry does: 18 jobs below, all succeeded.
    assert root.below == TreeCounts(succeeded=18)
    assert root.error is None
    for reopened in (twig_id, branch_id, root.id):
        job = await app.get(reopened)
        assert job.status is Status.SUCCEEDED
        (event,) = await app.events(reopened)
        assert event.event == "reopened" and leaf_id in (event.detail or "")
    old = await app.get(leaf_id)
    assert (old.status, old.record.retried_by) == (Status.FAILED, retried.id)
    assert retried.record.parent_id == twig_id and retried.record.root_id == root.id


async def test_a_retry_of_a_retry_points_at_the_first_job_up_to_the_types_limit(
    app: Conveyor,
) -> None:
    @app.job(max_attempts=1, retry_limit=2)
    async def fragile(ctx: JobContext) -> None:
        raise RuntimeError("still broken")

    first = await app.submit("fragile", {})
    async with running_worker(app):
        await settled(first, Status.FAILED)
        second = await app.retry(first.id)
        await settled(second, Status.FAILED)
        with pytest.raises(InvalidState, match=f"already retried as {second.id}"):
            await app.retry(first.id)
        third = await app.retry(second.id)
        await settled(third, Status.FAILED)
    # The last retry allowed says so as it fails (issue #30 item 11: only once another
    # retry was tried); the one before it does not.
    assert (await app.get(second.id)).error == "RuntimeError: still broken"
    note = f"retry limit reached (2 manual retries of {first.id})"
    assert (await app.get(third.id)).error == f"RuntimeError: still broken; {note}"
    assert (second.retry_of, second.retry_count) == (first.id, 1)
    assert (third.retry_of, third.retry_count) == (first.id, 2)
    assert third.submitted_by == "local"
    with pytest.raises(RetryLimitReached, match=r"retry limit reached.*\(its retry_limit=2\)"):
        await app.retry(third.id)
    last = await app.get(third.id)
    assert (
        last.error
        == f"RuntimeError: still broken; retry limit reached (2 manual retries of {first.id})"
    )
    with pytest.raises(RetryLimitReached):
        await app.retry(third.id)  # said once, not twice
    assert (await app.get(third.id)).error == last.error


async def test_on_complete_runs_once_with_the_counts_when_4_of_200_children_fail(
    app: Conveyor,
) -> None:
    summaries: list[dict[str, Any]] = []
    celebrations: list[dict[str, Any]] = []

    @app.job(max_attempts=1)
    async def item(ctx: JobContext, n: int) -> int:
        if n % 50 == 7:
            raise RuntimeError(f"item {n} is bad")
        return n

    @app.job()
    async def summarize(ctx: JobContext, report: str, batch: dict[str, Any]) -> None:
        summaries.append({"report": report, **batch})

    @app.job()
    async def celebrate(ctx: JobContext, batch: dict[str, Any]) -> None:
        celebrations.append(batch)

    @app.job()
    async def bulk(ctx: JobContext, n: int) -> None:
        await ctx.spawn_many(
            [Submission("item", {"n": i}, id=f"{ctx.id}.{i}") for i in range(n)],
            on_complete=Submission("summarize", {"report": "weekly"}),
            on_success="celebrate",
        )

    root = await app.submit("bulk", {"n": 200})
    async with running_worker(app, concurrency=20):
        await settled(root, Status.FAILED, timeout=60)
        callback = await app.get(f"{root.id}.on_complete")
        await settled(callback, Status.SUCCEEDED)
    assert root.error == "4 failed and 0 cancelled of 200 jobs below it"
    assert root.below is not None and (root.below.failed, root.below.total) == (4, 200)
    (summary,) = summaries
    assert summary["report"] == "weekly" and summary["job_id"] == root.id
    assert (summary["status"], summary["succeeded"], summary["failed"]) == ("failed", 196, 4)
    assert (summary["cancelled"], summary["done"], summary["total"]) == (0, 200, 200)
    assert celebrations == []
    # A callback is a top-level job of its own, not a child of the batch.
    assert callback.record.parent_id is None and callback.record.root_id is None
    assert len(await app.children(root.id, limit=1000)) == 200


async def test_on_success_fires_after_a_reopened_batch_succeeds(app: Conveyor) -> None:
    fail_once = {"x": True}

    @app.job(max_attempts=1)
    async def part(ctx: JobContext) -> None:
        if fail_once.pop("x", False):
            raise RuntimeError("first run fails")

    @app.job()
    async def done(ctx: JobContext, batch: dict[str, Any]) -> str:
        return str(batch["status"])

    @app.job()
    async def whole(ctx: JobContext) -> None:
        await ctx.spawn_many(
            [Submission("part", {}, id=f"{ctx.id}.p")], on_complete="done", on_success="done"
        )

    root = await app.submit("whole", {})
    async with running_worker(app):
        await settled(root, Status.FAILED)
        first = await settled(await app.get(f"{root.id}.on_complete"), Status.SUCCEEDED)
        assert first.result == "failed"
        await app.retry_failed_children(root.id)
        await settled(root, Status.SUCCEEDED)
        again = await settled(await app.get(f"{root.id}.on_complete.2"), Status.SUCCEEDED)
        success = await settled(await app.get(f"{root.id}.on_success"), Status.SUCCEEDED)
    assert (again.result, success.result) == ("succeeded", "succeeded")


async def test_a_callback_whose_handler_does_not_take_batch_is_refused_at_spawn(
    app: Conveyor,
) -> None:
    @app.job()
    async def plain(ctx: JobContext) -> None:
        return None

    @app.job(max_attempts=1)
    async def spawner(ctx: JobContext) -> None:
        await ctx.spawn_many([Submission("plain", {})], on_complete="plain")

    job = await spawner.submit()
    async with running_worker(app):
        await settled(job, Status.FAILED)
    assert "batch" in (job.error or "")
    assert await app.children(job.id) == []


async def test_counts_follow_every_status_while_the_tree_runs(app: Conveyor) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    @app.job()
    async def blocked(ctx: JobContext) -> None:
        started.set()
        await gate.wait()

    @app.job()
    async def quick(ctx: JobContext) -> None:
        return None

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn_many(
            [
                Submission("blocked", {}, id=f"{ctx.id}.run"),
                Submission("quick", {}, id=f"{ctx.id}.paused", queue="paused"),
                Submission("quick", {}, id=f"{ctx.id}.after", depends_on=(f"{ctx.id}.paused",)),
                Submission("quick", {}, id=f"{ctx.id}.done"),
            ]
        )

    await app.pause("paused")
    root = await app.submit("parent", {})
    async with running_worker(app, concurrency=4, queues=("default", "paused")):
        await asyncio.wait_for(started.wait(), 20)

        async def counted() -> bool:
            await root.refresh()
            return root.below is not None and root.below.succeeded == 1

        await eventually(counted)
        assert root.status is Status.WAITING
        assert root.below == TreeCounts(pending=1, queued=1, running=1, succeeded=1)
        assert (root.below.done, root.below.total) == (1, 4)
        await app.resume("paused")
        gate.set()
        await settled(root, Status.SUCCEEDED)
    assert root.below == TreeCounts(succeeded=4)


async def test_retry_failed_children_retries_the_failures_of_a_whole_subtree(
    app: Conveyor,
) -> None:
    broken = {"b0.0.0", "b1.1.2"}
    three_levels(app, dict.fromkeys(broken, 1), max_attempts=1)
    root = await app.submit("root", {})
    async with running_worker(app, concurrency=8):
        await settled(root, Status.FAILED, timeout=60)
        new = await app.retry_failed_children(root.id)
        # The two leaves, not the twigs and branches they failed.
        assert sorted(h.record.retry_of or "" for h in new) == sorted(
            [f"{root.id}.0.0.0", f"{root.id}.1.1.2"]
        )
        assert all(h.record.parent_id is not None for h in new)
        await settled(root, Status.SUCCEEDED, timeout=30)
    assert root.below == TreeCounts(succeeded=18)
    assert await app.retry_failed_children(root.id) == []


async def test_cancel_of_a_waiting_parent_fires_on_complete_and_counts_the_tree(
    app: Conveyor,
) -> None:
    @app.job()
    async def never(ctx: JobContext) -> None:
        return None

    @app.job()
    async def told(ctx: JobContext, batch: dict[str, Any]) -> str:
        return str(batch["status"])

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn_many(
            [Submission("never", {}, queue="held") for _ in range(3)], on_complete="told"
        )

    await app.pause("held")
    root = await app.submit("parent", {})
    async with running_worker(app, queues=("default", "held")):

        async def waiting() -> bool:
            return (await root.refresh()).status is Status.WAITING

        await eventually(waiting)
        await app.cancel(root.id)
        told_job = await settled(await app.get(f"{root.id}.on_complete"), Status.SUCCEEDED)
    assert told_job.result == "cancelled"
    await root.refresh()
    assert root.status is Status.CANCELLED and root.below == TreeCounts(cancelled=3)


async def test_cancel_of_a_running_parent_ends_it_once_its_running_children_stopped(
    app: Conveyor,
) -> None:
    """A parent cancelled while its handler runs, with children running below it, ends
    (and fires its callback, every child counted) only once they have stopped, as a
    waiting parent does: its own handler stopping is not the end of its batch."""
    asked, gate = threading.Event(), threading.Event()

    @app.job()
    def slow_to_stop(ctx: JobContext) -> None:
        while not ctx.cancelled:
            time.sleep(0.01)
        asked.set()
        gate.wait(30)  # stopping takes a while
        ctx.raise_if_cancelled()

    @app.job()
    async def told(ctx: JobContext, batch: dict[str, Any]) -> dict[str, Any]:
        return batch

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn_many(
            [Submission("slow_to_stop", {}, id=f"{ctx.id}.{i}") for i in range(2)],
            on_complete="told",
        )
        await asyncio.Event().wait()  # runs until cancelled

    root = await app.submit("parent", {})
    async with running_worker(app, concurrency=4):

        async def children_running() -> bool:
            await root.refresh()
            return root.below is not None and root.below.running == 2

        await eventually(children_running)
        await app.cancel(root.id, reason="not needed")
        await asyncio.to_thread(asked.wait, 30)

        async def handler_stopped() -> bool:
            return (await root.refresh()).status is not Status.RUNNING

        await eventually(handler_stopped)
        assert root.status is Status.WAITING, "it waits for the children still stopping"
        assert not root.terminal
        with pytest.raises(JobNotFound):
            await app.get(f"{root.id}.on_complete")
        gate.set()

        async def fired() -> bool:
            try:
                await app.get(f"{root.id}.on_complete")
            except JobNotFound:
                return False
            return True

        await eventually(fired)
        callback = await settled(await app.get(f"{root.id}.on_complete"))
    assert callback.result["status"] == "cancelled"
    assert (callback.result["cancelled"], callback.result["total"]) == (2, 2)
    await root.refresh()
    assert (root.status, root.error) == (Status.CANCELLED, "not needed")
    assert root.below == TreeCounts(cancelled=2)
    children = await app.children(root.id)
    ended = [c.record.finished_at for c in children if c.record.finished_at is not None]
    assert len(ended) == 2 and callback.record.created_at >= max(ended)


async def test_lists_hold_top_level_jobs_unless_children_are_asked_for(app: Conveyor) -> None:
    @app.job()
    async def child(ctx: JobContext) -> None:
        return None

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn_many([Submission("child", {}, id=f"{ctx.id}.{i}") for i in range(2)])

    root = await app.submit("parent", {})
    async with running_worker(app):
        await settled(root, Status.SUCCEEDED)
    assert [h.id for h in await app.list_jobs()] == [root.id]
    assert len(await app.list_jobs(include_children=True)) == 3
    assert len((await app.page_jobs(parent_id=root.id)).jobs) == 2
    assert len((await app.page_jobs(root_id=root.id)).jobs) == 2
    assert sorted(h.id for h in await root.children()) == [f"{root.id}.0", f"{root.id}.1"]


async def test_every_job_says_who_submitted_it(app: Conveyor) -> None:
    @app.job()
    async def child(ctx: JobContext) -> None:
        return None

    @app.job(max_attempts=1)
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn("child", id=f"{ctx.id}.c")
        raise RuntimeError("after spawning")

    view = TenantView(app, Principal("tok1", "acme", Role.WRITE))
    local = await app.submit("child", {})
    ((shown, _),) = await view.submit([Submission("parent", {})])
    remote = await app.get(f"acme/{shown.id}")  # the view shows acme its own ids
    async with running_worker(app):
        await settled(remote, Status.FAILED)
        child_job = await settled(await app.get(f"{remote.id}.c"))
        again = await view.retry(shown.id)
    assert local.submitted_by == "local"
    assert remote.submitted_by == "token:tok1"
    assert child_job.submitted_by == "token:tok1"  # children inherit their root's submitter
    assert again.submitted_by == "token:tok1"
    app.schedule("nightly", "0 2 * * *", child)
    await app.sync_schedules()
    assert (await app.run_schedule("nightly")).submitted_by == "schedule:nightly"


async def test_a_cancel_asked_of_a_running_job_survives_a_retry_and_a_rescue(
    db_url: str,
) -> None:
    clock = FakeClock()
    store = create_store(db_url, clock=clock)
    await store.open()
    try:
        await store.submit([new("a", max_attempts=5), new("b", max_attempts=5)])
        claimed = {
            j.id: j for j in await store.claim(worker_id="w", queues=["default"], limit=2, lease=10)
        }
        for job_id in ("a", "b"):
            asked = await store.cancel(job_id, reason=f"stop {job_id}")
            assert asked is not None and asked.cancel_requested
        # "a" fails with attempts left: it is not queued again.
        retry = Settlement(
            "a", claimed["a"].lease_token, Status.QUEUED, Outcome.FAILED, error="boom"
        )
        assert await store.settle([retry]) == []
        # "b"'s worker died: its rescue ends it cancelled, not queued for another run.
        clock.advance(11)
        (rescued,) = await store.rescue(limit=10, jitter=0.5)
        assert (rescued.job_id, rescued.status) == ("b", Status.CANCELLED)
        for job_id in ("a", "b"):
            job = await store.get(job_id)
            assert job is not None
            assert (job.status, job.error) == (Status.CANCELLED, f"stop {job_id}")
        assert [a.outcome for a in await store.attempts("b")] == [Outcome.LOST]
        assert await store.claim(worker_id="w2", queues=["default"], limit=5, lease=10) == []
    finally:
        await store.close()


# A live tree as an older conveyor stored it: root waiting; a succeeded, b waiting on b1
# (running, lease token 1) and b2 (failed); c queued.
_OLD_TREE = [
    ("root", None, None, "waiting"),
    ("a", "root", "root", "succeeded"),
    ("b", "root", "root", "waiting"),
    ("b1", "b", "root", "running"),
    ("b2", "b", "root", "failed"),
    ("c", "root", "root", "queued"),
]


def _insert_old_tree(db_url: str) -> None:
    columns = (
        "id, parent_id, root_id, status, type, queue, payload, max_attempts, run_at, "
        "backoff_base, backoff_cap, created_at, lease_token, lease_expires_at"
    )
    if db_url.startswith("sqlite:"):
        import sqlite3

        with sqlite3.connect(db_url.removeprefix("sqlite:///")) as conn:
            conn.executemany(
                f"INSERT INTO conveyor_jobs ({columns}) "
                "VALUES (?, ?, ?, ?, 't', 'default', '{}', 3, 0, 1, 60, 0, 1, 4e9)",
                _OLD_TREE,
            )
        return
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        for row in _OLD_TREE:
            conn.execute(
                f"INSERT INTO conveyor_jobs ({columns}) VALUES (%s, %s, %s, %s, 't', "
                "'default', '{}', 3, now(), 1, 60, now(), 1, now() + interval '1 hour')",
                row,
            )


async def test_upgrading_a_database_with_live_trees_counts_them(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = create_store(db_url, migrate=False)
    backend = importlib.import_module(type(store).__module__)
    every = list(backend._MIGRATIONS)
    this = next(i for i, (_, name, _) in enumerate(every) if "bulk_jobs" in name)
    monkeypatch.setattr(backend, "_MIGRATIONS", every[:this])
    try:
        await store.migrate()  # the schema of the release before
    finally:
        await store.close()
    _insert_old_tree(db_url)
    monkeypatch.setattr(backend, "_MIGRATIONS", every)
    store = create_store(db_url)
    await store.open()  # migrates the rest, with the trees' counts
    try:
        root, b = await store.get("root"), await store.get("b")
        assert root is not None and b is not None
        assert root.below == TreeCounts(queued=1, running=1, waiting=1, succeeded=1, failed=1)
        assert b.below == TreeCounts(running=1, failed=1)
        assert root.submitted_by == "local" and root.retry_count == 0
        # The live tree goes on: b1 ends, b fails for b2, the root waits for c.
        ended = Settlement("b1", 1, Status.SUCCEEDED, Outcome.SUCCEEDED)
        assert await store.settle([ended]) == []
        root, b = await store.get("root"), await store.get("b")
        assert root is not None and b is not None
        assert (
            b.status is Status.FAILED and b.error == "1 failed and 0 cancelled of 2 jobs below it"
        )
        assert (root.status, root.below) == (
            Status.WAITING,
            TreeCounts(queued=1, succeeded=2, failed=2),
        )
    finally:
        await store.close()
