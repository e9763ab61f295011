"""The metrics each process keeps of the jobs it submits and runs, and the server's /metrics."""

from __future__ import annotations

import asyncio

import httpx

from conveyor import Cancel, Conveyor, JobContext, Status
from conveyor.web import create_api
from conveyor.worker._maintenance import Rescuer
from tests.helpers import eventually, running_worker, settled


def sample(app: Conveyor, name: str, type: str, queue: str = "default") -> float:
    value = app.metrics.registry.get_sample_value(name, {"type": type, "queue": queue})
    return 0.0 if value is None else value


async def test_counters_per_type_and_queue(app: Conveyor) -> None:
    @app.job()
    async def ok(ctx: JobContext) -> None:
        return None

    @app.job(max_attempts=2, backoff=("10ms", "10ms"), queue="bulk")
    async def bad(ctx: JobContext) -> None:
        raise ValueError("no")

    @app.job()
    async def drop(ctx: JobContext) -> None:
        raise Cancel("dropped")

    jobs = [await ok.submit() for _ in range(3)]
    jobs += [await bad.submit(), await drop.submit()]
    await app.submit("ok", id=jobs[0].id)  # the same id again: no new job, not counted
    async with running_worker(app, queues=("default", "bulk")):
        for job in jobs:
            await settled(job)
    assert sample(app, "conveyor_jobs_submitted_total", "ok") == 3
    assert sample(app, "conveyor_jobs_submitted_total", "bad", "bulk") == 1
    assert sample(app, "conveyor_jobs_started_total", "ok") == 3
    assert sample(app, "conveyor_jobs_succeeded_total", "ok") == 3
    assert sample(app, "conveyor_jobs_started_total", "bad", "bulk") == 2
    assert sample(app, "conveyor_jobs_retried_total", "bad", "bulk") == 1
    assert sample(app, "conveyor_jobs_failed_total", "bad", "bulk") == 1
    assert sample(app, "conveyor_jobs_cancelled_total", "drop") == 1
    assert sample(app, "conveyor_jobs_running", "ok") == 0
    assert sample(app, "conveyor_job_run_seconds_count", "ok") == 3
    assert sample(app, "conveyor_job_queue_wait_seconds_count", "ok") == 3
    registry = app.metrics.registry
    for operation in ("claim", "settle"):
        count = registry.get_sample_value("conveyor_store_seconds_count", {"operation": operation})
        assert count is not None and count >= 1


async def test_running_gauge_and_lease_losses(app: Conveyor) -> None:
    started = asyncio.Event()

    @app.job(max_attempts=1)
    async def long(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    await long.submit()
    async with running_worker(app) as worker:
        await started.wait()
        assert sample(app, "conveyor_jobs_running", "long") == 1
        worker._on_lost(worker.held())
        assert sample(app, "conveyor_jobs_running", "long") == 0
    assert sample(app, "conveyor_lease_losses_total", "long") == 1


async def test_a_rescue_is_counted_by_the_process_that_made_it(app: Conveyor) -> None:
    @app.job(queue="q1")
    async def stuck(ctx: JobContext) -> None:
        return None

    await stuck.submit()
    store = await app.store()
    # A worker that claimed the job and vanished: its short lease runs out.
    (claimed,) = await store.claim(worker_id="gone", queues=("q1",), limit=1, lease=0.05)
    rescuer = Rescuer(store, metrics=app.metrics)
    rescued: list[object] = []

    async def rescue() -> bool:
        rescued.extend(await rescuer.run_once())
        return bool(rescued)

    await eventually(rescue)
    assert sample(app, "conveyor_jobs_rescued_total", "stuck", "q1") == 1
    assert (await app.get(claimed.id)).status is Status.QUEUED


async def test_the_server_adds_counters_and_per_queue_lag_once_per_scrape(app: Conveyor) -> None:
    @app.job(queue="mail")
    async def send(ctx: JobContext) -> None:
        return None

    for _ in range(3):
        await send.submit()
    # The cluster's figures are an admin's: a tenant's token reads its own jobs' counts.
    _, secret = await app.create_token(tenant="default", role="admin")
    api = create_api(app)
    transport = httpx.ASGITransport(app=api)
    headers = {"Authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        text = (await client.get("/metrics", headers=headers)).text
        assert 'conveyor_queue_due_jobs{queue="mail"} 3.0' in text
        assert 'conveyor_queue_oldest_due_seconds{queue="mail"}' in text
        assert 'conveyor_jobs_submitted_total{queue="mail",type="send"} 3.0' in text
        async with running_worker(app, queues=("mail",)):
            await eventually(lambda: _drained(app))
        # Within a second of the last read, a scrape reuses it: the database is not asked.
        again = (await client.get("/metrics", headers=headers)).text
        assert 'conveyor_queue_due_jobs{queue="mail"} 3.0' in again
        api.state.metrics.cluster = None
        fresh = (await client.get("/metrics", headers=headers)).text
        assert 'conveyor_queue_due_jobs{queue="mail"}' not in fresh
        assert 'conveyor_jobs_succeeded_total{queue="mail",type="send"} 3.0' in fresh


async def _drained(app: Conveyor) -> bool:
    page = await app.page_jobs(limit=100)
    return all(j.status is Status.SUCCEEDED for j in page.jobs)


def test_a_wait_observed_as_a_timedelta_counts_as_its_seconds() -> None:
    from datetime import timedelta

    from conveyor.observe.metrics import Buckets

    bounds = (0.005, 0.025, 1, 60)
    as_delta, as_seconds = Buckets(bounds), Buckets(bounds)
    # On a bound, between bounds, past the last, zero, and negative (clock skew: 0).
    for seconds in (0.005, 0.0051, 0.3, 1.0, 61.5, 0.0, -2.0):
        as_delta.observe_delta(timedelta(seconds=seconds))
        as_seconds.observe(max(0.0, seconds))
    assert as_delta.counts == as_seconds.counts == [3, 1, 2, 0, 1]
    assert as_delta.sum == as_seconds.sum == 0.005 + 0.0051 + 0.3 + 1.0 + 61.5
    assert as_delta.cumulative() == as_seconds.cumulative()
