"""The worker's behaviour, in this process, on every backend."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from typing import Any, cast

import pytest

from conveyor import (
    Cancel,
    Conveyor,
    JobContext,
    Outcome,
    Retry,
    Status,
    Submission,
    WorkerOptions,
)
from conveyor.core.model import Progress, Settlement
from conveyor.store import Beat, Store, create_store
from tests.helpers import eventually, fast_options, running_worker, settled


async def test_runs_a_job_and_stores_its_result(app: Conveyor) -> None:
    @app.job()
    async def add(ctx: JobContext, a: int, b: int = 1) -> int:
        return a + b

    job = await add.submit(a=2, b=3)
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    assert job.result == 5
    (attempt,) = await job.attempts()
    assert attempt.outcome is Outcome.SUCCEEDED and attempt.worker_id


async def test_sync_handlers_run_in_threads(app: Conveyor) -> None:
    seen: list[str] = []

    @app.job()
    def greet(ctx: JobContext, name: str) -> str:
        seen.append(threading.current_thread().name)
        return f"hello {name}"

    job = await greet.submit(name="ada")
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    assert job.result == "hello ada"
    assert seen[0].startswith("conveyor-handler")


async def test_retries_with_backoff_until_failed(app: Conveyor) -> None:
    @app.job(max_attempts=3, backoff=("10ms", "50ms"))
    async def broken(ctx: JobContext) -> None:
        raise ValueError(f"broken on attempt {ctx.attempt}")

    job = await broken.submit()
    async with running_worker(app):
        await settled(job, Status.FAILED)
    attempts = await job.attempts()
    assert [a.outcome for a in attempts] == [Outcome.FAILED] * 3
    assert job.error == "ValueError: broken on attempt 3"
    assert attempts[0].traceback and "ValueError" in attempts[0].traceback


async def test_retry_after_asks_for_a_specific_delay(app: Conveyor) -> None:
    @app.job(max_attempts=3)
    async def polite(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise Retry(after="300ms", reason="rate limited")
        return ctx.attempt

    job = await polite.submit()
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    first, second = await job.attempts()
    assert first.error == "retry requested: rate limited"
    assert first.finished_at and second.started_at
    assert (second.started_at - first.finished_at).total_seconds() >= 0.29
    assert job.result == 2


async def test_timeout_records_timed_out_then_retries(app: Conveyor) -> None:
    @app.job(timeout="300ms", max_attempts=2, backoff="10ms")
    async def slow_first(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            await asyncio.sleep(30)
        return "fast the second time"

    job = await slow_first.submit()
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    assert [a.outcome for a in await job.attempts()] == [Outcome.TIMED_OUT, Outcome.SUCCEEDED]


async def test_sync_handler_sees_cancellation_on_timeout(app: Conveyor) -> None:
    stopped = threading.Event()

    @app.job(timeout="200ms", max_attempts=1)
    def loop_until_told(ctx: JobContext) -> None:
        while True:
            if ctx.cancelled:
                stopped.set()
                ctx.raise_if_cancelled()
            time.sleep(0.01)

    job = await loop_until_told.submit()
    async with running_worker(app):
        await settled(job, Status.FAILED)
    assert stopped.is_set()
    assert [a.outcome for a in await job.attempts()] == [Outcome.TIMED_OUT]


async def test_cancel_and_non_retryable_end_the_job(app: Conveyor) -> None:
    @app.job(max_attempts=5)
    async def gives_up(ctx: JobContext) -> None:
        raise Cancel("nothing to do")

    @app.job(max_attempts=5, non_retryable=[KeyError])
    async def missing(ctx: JobContext) -> None:
        raise KeyError("user 42")

    a, b = await gives_up.submit(), await missing.submit()
    async with running_worker(app):
        await settled(a, Status.CANCELLED)
        await settled(b, Status.FAILED)
    assert a.error == "nothing to do"
    assert b.attempt == 1


async def test_cancel_of_a_running_async_job(app: Conveyor) -> None:
    started = asyncio.Event()
    saw_cancel = asyncio.Event()

    @app.job()
    async def long(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw_cancel.set()
            raise

    job = await long.submit()
    async with running_worker(app, lease=0.6):
        await asyncio.wait_for(started.wait(), 10)
        await app.cancel(job.id, reason="user pressed stop")
        await settled(job, Status.CANCELLED)
    assert saw_cancel.is_set()
    assert job.error == "user pressed stop"
    assert [a.outcome for a in await job.attempts()] == [Outcome.CANCELLED]


async def test_cpu_bound_async_handler_does_not_lose_its_lease(app: Conveyor, db_url: str) -> None:
    """The event loop is blocked for 2.5 leases; the heartbeat thread keeps the lease."""
    stop = threading.Event()
    rescued: list[str] = []

    def rescuer() -> None:
        async def loop() -> None:
            store = create_store(db_url)
            await store.open()
            try:
                while not stop.is_set():
                    rescued.extend(r.job_id for r in await store.rescue(limit=10, jitter=0.0))
                    await asyncio.sleep(0.05)
            finally:
                await store.close()

        asyncio.run(loop())

    @app.job()
    async def hog(ctx: JobContext) -> str:
        time.sleep(2.5)  # holds the event loop, as CPU-bound code would
        return "done"

    job = await hog.submit()
    thread = threading.Thread(target=rescuer)
    thread.start()
    try:
        async with running_worker(app, lease=1.0):
            await settled(job, Status.SUCCEEDED)
    finally:
        stop.set()
        thread.join()
    assert rescued == []
    assert [a.outcome for a in await job.attempts()] == [Outcome.SUCCEEDED]


async def test_lost_lease_cancels_the_local_run_and_drops_its_result(
    app: Conveyor, db_url: str
) -> None:
    runs: list[str] = []
    first_started = asyncio.Event()

    @app.job(max_attempts=3, backoff="10ms")
    async def work(ctx: JobContext) -> int:
        runs.append(f"start {ctx.attempt}")
        if ctx.attempt == 1:
            first_started.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                runs.append("cancelled 1")
                raise
        return ctx.attempt

    job = await work.submit()
    async with running_worker(app, lease=1.0, rescue_interval=60):
        await asyncio.wait_for(first_started.wait(), 10)
        # A store whose clock runs 1.5 s ahead (past the 1 s lease) rescues the job.
        thief = create_store(db_url, clock=lambda: time.time() + 1.5)
        await thief.open()
        try:
            (rescued,) = await thief.rescue(limit=10, jitter=0.0)
        finally:
            await thief.close()
        assert rescued.job_id == job.id
        await settled(job, Status.SUCCEEDED)
    assert job.result == 2
    assert runs[:2] == ["start 1", "cancelled 1"]
    assert [a.outcome for a in await job.attempts()] == [Outcome.LOST, Outcome.SUCCEEDED]


async def test_graceful_stop_hands_running_jobs_back(app: Conveyor) -> None:
    started = asyncio.Event()
    checkpointed = asyncio.Event()

    @app.job()
    async def long(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await ctx.checkpoint({"stopped_at": 7})
            checkpointed.set()
            raise

    job = await long.submit()
    async with running_worker(app, grace=0.2):
        await asyncio.wait_for(started.wait(), 10)
    assert checkpointed.is_set()
    await job.refresh()
    assert job.status is Status.QUEUED
    assert job.attempt == 0  # no attempt spent
    assert job.state == {"stopped_at": 7}
    assert await job.attempts() == []


async def test_progress_and_checkpoints_reach_the_next_attempt(app: Conveyor) -> None:
    seen_state: list[object] = []
    seen_progress: list[Progress | None] = []

    @app.job(max_attempts=2, backoff="10ms")
    async def resumable(ctx: JobContext, total: int) -> int:
        seen_state.append(ctx.state)
        seen_progress.append(ctx.last_progress)  # issue #30 item 11: no getter before
        start = (ctx.state or {}).get("i", 0)
        for i in range(start, total):
            ctx.progress(i + 1, total, "working")
            assert ctx.last_progress == Progress(i + 1, total, "working")
            if i == 4 and ctx.attempt == 1:
                await ctx.checkpoint({"i": 5})
                raise RuntimeError("crash after checkpoint")
        return total

    job = await resumable.submit(total=10)
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    assert seen_state == [None, {"i": 5}]
    assert seen_progress[0] is None and seen_progress[1] is not None  # the first attempt's
    assert job.progress is not None and job.progress.done == 10 and job.progress.total == 10
    # JobHandle.to_dict (issue #30 item 11): the job as JSON values, without lease internals.
    document = job.to_dict()
    assert document["status"] == "succeeded" and document["result"] == 10
    assert document["progress"] == {
        "done": 10.0,
        "total": 10.0,
        "message": "working",
        "fraction": 1.0,
    }
    assert (
        "lease_token" not in document
        and document["created_at"] == job.record.created_at.isoformat()
    )
    json.dumps(document)


async def test_a_job_type_unknown_to_the_worker_waits_for_one_that_knows_it(
    db_url: str,
) -> None:
    # A rolling deploy: new code submits a type the running worker has no handler for.
    producer = Conveyor(db_url)
    consumer = Conveyor(db_url)

    @producer.job(max_attempts=1)
    async def only_here(ctx: JobContext) -> None:
        return None

    @consumer.job()
    async def something_else(ctx: JobContext) -> None:
        return None

    job = await only_here.submit()
    known = await something_else.submit()
    try:
        async with running_worker(consumer, burst=True) as worker:
            await settled(known, Status.SUCCEEDED)
        assert worker.processed == 1
        await job.refresh()
        assert (job.status, job.attempt) == (Status.QUEUED, 0)
        async with running_worker(producer, burst=True):
            await settled(job, Status.SUCCEEDED)
        assert job.attempt == 1
    finally:
        await producer.close()
        await consumer.close()


async def test_burst_worker_exits_when_no_job_is_due(app: Conveyor) -> None:
    @app.job()
    async def quick(ctx: JobContext, i: int) -> int:
        return i

    jobs = [await quick.submit(i=i) for i in range(20)]
    await asyncio.wait_for(app.worker(fast_options_burst()).run(), 30)
    for job in jobs:
        await job.refresh()
        assert job.status is Status.SUCCEEDED


def fast_options_burst() -> WorkerOptions:
    return fast_options(burst=True)


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_concurrency_bounds_running_handlers(app: Conveyor, concurrency: int) -> None:
    running = 0
    peak = 0

    @app.job()
    async def tracked(ctx: JobContext) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    jobs = [await tracked.submit() for _ in range(30)]
    async with running_worker(app, concurrency=concurrency):
        for job in jobs:
            await settled(job, Status.SUCCEEDED)
    assert peak == concurrency


async def test_eventually_helper_times_out() -> None:
    async def never() -> bool:
        return False

    with pytest.raises(TimeoutError):
        await eventually(never, timeout=0.1)


async def test_cancel_of_a_running_sync_job(app: Conveyor) -> None:
    started = threading.Event()

    @app.job()
    def polite(ctx: JobContext) -> str:
        started.set()
        while True:
            ctx.raise_if_cancelled()
            time.sleep(0.01)

    @app.job()
    async def next_one(ctx: JobContext) -> str:
        return "served"

    job = await polite.submit()
    async with running_worker(app, lease=0.6):
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        await app.cancel(job.id)
        await settled(job, Status.CANCELLED)
        after = await next_one.submit()
        await settled(after, Status.SUCCEEDED)
    assert [a.outcome for a in await job.attempts()] == [Outcome.CANCELLED]


async def test_a_sync_handler_that_ignores_cancel_is_abandoned(app: Conveyor) -> None:
    started = threading.Event()
    finished = threading.Event()

    @app.job()
    def stubborn(ctx: JobContext) -> str:
        started.set()
        time.sleep(2.0)  # never looks at ctx.cancelled
        finished.set()
        return "too late"

    @app.job()
    async def next_one(ctx: JobContext) -> str:
        return "served"

    job = await stubborn.submit()
    async with running_worker(app, lease=0.6, cancel_grace=0.3):
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        await app.cancel(job.id)
        await settled(job, Status.CANCELLED)
        assert not finished.is_set()
        after = await next_one.submit()
        await settled(after, Status.SUCCEEDED)
        await asyncio.get_running_loop().run_in_executor(None, finished.wait, 10)
        await asyncio.sleep(0.2)
    await job.refresh()
    assert job.status is Status.CANCELLED and job.result is None  # the late result is refused


class CountingStore:
    """Delegates to a real store and counts the calls that write progress."""

    def __init__(self, inner: Store, counts: dict[str, int]) -> None:
        self._inner = inner
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def heartbeat(self, **kw: Any) -> Beat:
        if kw["progress"]:
            self._counts["progress_writes"] = self._counts.get("progress_writes", 0) + 1
        return await self._inner.heartbeat(**kw)


async def test_ten_thousand_progress_calls_cost_a_few_writes(db_url: str) -> None:
    counts: dict[str, int] = {}

    class CountingConveyor(Conveyor):
        def new_store(self) -> Store:
            return cast(Store, CountingStore(super().new_store(), counts))

    app = CountingConveyor(db_url)

    @app.job()
    async def chatty(ctx: JobContext) -> int:
        for i in range(10_000):
            ctx.progress(i + 1, 10_000)
            if i % 100 == 0:
                await asyncio.sleep(0.025)  # about 2.5 s in all
        return 10_000

    job = await chatty.submit()
    try:
        async with running_worker(app, lease=3.0):
            await settled(job, Status.SUCCEEDED)
    finally:
        await app.close()
    assert 1 <= counts["progress_writes"] <= 6  # about one a second, plus the final settle
    assert job.progress is not None and job.progress.done == 10_000


async def test_a_worker_holds_at_most_one_batch_awaiting_its_settle(app: Conveyor) -> None:
    """When the database takes results slowly, the worker claims less instead of piling up
    finished jobs and their leases (each heartbeat would renew them all)."""

    @app.job()
    async def quick(ctx: JobContext) -> None:
        return None

    jobs = await app.submit_many([Submission("quick", {}) for _ in range(60)])
    new_store = app.new_store

    def slow_settling_store() -> Store:
        store = new_store()
        settle = store.settle

        async def slow_settle(settlements: Sequence[Settlement]) -> list[str]:
            await asyncio.sleep(0.1)
            return await settle(settlements)

        store.settle = slow_settle  # type: ignore[method-assign]
        return store

    app.new_store = slow_settling_store  # type: ignore[method-assign]
    most = 0
    async with running_worker(app, concurrency=4) as worker:
        while any(j.status is not Status.SUCCEEDED for j in jobs):
            most = max(most, len(worker.held()))
            await asyncio.sleep(0.005)
            for j in jobs:
                if j.status is not Status.SUCCEEDED:
                    await j.refresh()
                    break
    assert 4 <= most <= 8, f"{most} leases held by a worker of 4 slots"
