"""Flow control and scheduling, on every backend: cron, unique jobs, limits, leases, pruning."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conveyor import ConfigurationError, Conveyor, JobContext, Status
from conveyor.core.cron import CatchUp, Cron, Schedule
from conveyor.errors import LeaseHeld
from conveyor.store import Retention, Store, create_store
from tests.helpers import FakeClock, running_worker, settled


@pytest.fixture
def clock() -> FakeClock:
    # On a minute boundary, so tick arithmetic in the tests reads plainly.
    return FakeClock(now=datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp())


def every_minute(name: str = "tick", catch_up: CatchUp = CatchUp.SKIP, limit: int = 10) -> Schedule:
    return Schedule(
        name=name,
        cron=Cron("* * * * *"),
        type="report",
        payload={},
        catch_up=catch_up,
        backfill_limit=limit,
    )


async def test_each_tick_fires_once_however_many_workers_fire(
    db_url: str, store: Store, clock: FakeClock
) -> None:
    await store.sync_schedules([every_minute()])
    firers = [create_store(db_url, clock=clock) for _ in range(5)]
    for f in firers:
        await f.open()
    try:
        created: list[str] = []
        for _ in range(100):
            clock.advance(60)
            batches = await asyncio.gather(*(f.fire_schedules(limit=10) for f in firers))
            created.extend(job_id for batch in batches for job_id in batch)
    finally:
        for f in firers:
            await f.close()
    assert len(created) == 100 == len(set(created))
    jobs = await store.get_many(created)
    assert len(jobs) == 100 and all(j.type == "report" for j in jobs)


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [(CatchUp.SKIP, 0), (CatchUp.ONCE, 1), (CatchUp.BACKFILL, 4)],
)
async def test_catch_up_after_ten_missed_ticks(
    store: Store, clock: FakeClock, catch_up: CatchUp, expected: int
) -> None:
    await store.sync_schedules([every_minute(catch_up=catch_up, limit=4)])
    clock.advance(60)
    assert len(await store.fire_schedules(limit=10)) == 1  # on time
    clock.advance(10 * 60 + 40)  # ten ticks pass with no worker, then one comes back
    fired = await store.fire_schedules(limit=10)
    assert len(fired) == expected
    clock.advance(30)  # the next tick comes on time again
    assert len(await store.fire_schedules(limit=10)) == 1


async def test_schedules_are_listed_disabled_and_run_by_hand(
    store: Store, clock: FakeClock
) -> None:
    await store.sync_schedules([every_minute("nightly")])
    (info,) = await store.schedules()
    assert info.enabled and info.schedule.cron.expression == "* * * * *"
    disabled = await store.set_schedule_enabled("nightly", False)
    assert disabled is not None and not disabled.enabled
    clock.advance(600)
    assert await store.fire_schedules(limit=10) == []
    job = await store.run_schedule("nightly")
    assert job is not None and job.type == "report"
    enabled = await store.set_schedule_enabled("nightly", True)
    assert enabled is not None and enabled.next_run_at.timestamp() > clock.now
    assert await store.set_schedule_enabled("nope", True) is None


async def test_schedule_declarations_are_checked(app: Conveyor) -> None:
    @app.job()
    async def report(ctx: JobContext, day: str = "today") -> None:
        return None

    with pytest.raises(ConfigurationError, match="invalid cron expression"):
        app.schedule("bad", "61 * * * *", report)
    with pytest.raises(ConfigurationError, match="unknown timezone"):
        app.schedule("bad", "0 2 * * *", report, timezone="Moon/Base")
    with pytest.raises(ConfigurationError, match="'sometimes' is not a valid CatchUp"):
        app.schedule("bad", "0 2 * * *", report, catch_up="sometimes")
    with pytest.raises(Exception, match="unexpected argument"):
        app.schedule("bad", "0 2 * * *", report, {"week": 3})
    app.schedule("nightly", "0 2 * * *", report, {"day": "yesterday"}, timezone="Europe/Paris")
    await app.sync_schedules()
    (info,) = await app.list_schedules()
    assert info.schedule.payload == {"day": "yesterday"}


async def test_unique_key_holds_under_concurrent_and_bulk_submits(app: Conveyor) -> None:
    from conveyor import Submission

    @app.job()
    async def sync_account(ctx: JobContext, account: int) -> None:
        return None

    handles = await asyncio.gather(
        *(app.submit("sync_account", {"account": 1}, unique_key="account:1") for _ in range(50))
    )
    assert len({h.id for h in handles}) == 1
    bulk = await app.submit_many(
        [Submission("sync_account", {"account": 2}, unique_key="account:2") for _ in range(5)]
    )
    assert len({h.id for h in bulk}) == 1
    assert len(await app.list_jobs()) == 2


async def test_per_worker_type_concurrency(app: Conveyor) -> None:
    running = peak = 0

    @app.job(concurrency=2)
    async def heavy(ctx: JobContext) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1

    @app.job()
    async def light(ctx: JobContext) -> None:
        return None

    jobs = [await heavy.submit() for _ in range(10)] + [await light.submit() for _ in range(10)]
    async with running_worker(app, concurrency=10):
        for job in jobs:
            await settled(job, Status.SUCCEEDED)
    assert peak == 2


async def test_per_key_concurrency_does_not_block_other_keys(app: Conveyor) -> None:
    running: dict[str, int] = {}
    peaks: dict[str, int] = {}

    @app.job(key_concurrency=1)
    async def push(ctx: JobContext, customer: str) -> None:
        running[customer] = running.get(customer, 0) + 1
        peaks[customer] = max(peaks.get(customer, 0), running[customer])
        peaks["both"] = max(peaks.get("both", 0), sum(running.values()))
        await asyncio.sleep(0.05)
        running[customer] -= 1

    jobs = []
    for _i in range(6):
        for customer in ("a", "b"):
            jobs.append(await app.submit("push", {"customer": customer}, concurrency_key=customer))
    async with running_worker(app, concurrency=8):
        for job in jobs:
            await settled(job, Status.SUCCEEDED)
    assert peaks["a"] == 1 and peaks["b"] == 1
    assert peaks["both"] == 2  # the two keys ran side by side


async def test_named_lease_is_exclusive_fenced_and_kept_in_history(app: Conveyor) -> None:
    async with app.lease("export", ttl=5, owner="first") as lease:
        assert lease.token >= 1 and not lease.lost
        with pytest.raises(LeaseHeld, match="lease 'export' is held by first"):
            async with app.lease("export", ttl=5, owner="second"):
                pass
        first_token = lease.token
    async with app.lease("export", ttl=5, owner="second") as again:
        assert again.token > first_token
    history = await app.lease_history("export")
    assert [(h.owner, h.ended) for h in history] == [("second", "released"), ("first", "released")]


def test_named_lease_sync_form(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")
    with app.lease("singleton", ttl=2) as lease:
        assert lease.token == 1
    with app.lease("singleton", ttl=2) as lease:
        assert lease.token == 2


async def test_an_expired_named_lease_is_taken_over_and_noticed(
    store: Store, clock: FakeClock
) -> None:
    first = await store.acquire_lease("job", owner="a", ttl=10)
    assert first.owner == "a"
    clock.advance(11)
    second = await store.acquire_lease("job", owner="b", ttl=10)
    assert second.owner == "b" and second.token == first.token + 1
    assert await store.renew_lease("job", token=first.token, ttl=10) is None
    assert not await store.release_lease("job", token=first.token)
    history = await store.lease_history("job")
    assert [(h.owner, h.ended) for h in history] == [("b", None), ("a", "expired")]


async def test_prune_removes_old_finished_trees_whole(app: Conveyor, db_url: str) -> None:
    @app.job()
    async def leaf(ctx: JobContext) -> None:
        return None

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn("leaf")

    @app.job(max_attempts=1, retention={"failed": "1s"})
    async def broken(ctx: JobContext) -> None:
        raise RuntimeError("no")

    tree = await parent.submit()
    failed = await broken.submit()
    async with running_worker(app):
        await settled(tree, Status.SUCCEEDED)
        await settled(failed, Status.FAILED)
    assert await app.prune() == 0  # nothing is old enough yet
    later = Conveyor(db_url, clock=lambda: time.time() + 2)
    for name in ("leaf", "parent", "broken"):
        later.registry.add(app.registry.get(name))
    try:
        assert await later.prune() == 1  # the failed job: its type keeps failures 1 s
        assert {j.id for j in await app.list_jobs(include_children=True)} == {
            tree.id,
            (await app.children(tree.id))[0].id,
        }
        far = Conveyor(db_url, clock=lambda: time.time() + 2 * 86_400)
        try:
            assert await far.prune(Retention()) == 2  # the parent and its child, together
        finally:
            await far.close()
        assert await app.list_jobs() == []
    finally:
        await later.close()


async def test_rate_limit_parsing_errors(app: Conveyor) -> None:
    with pytest.raises(ConfigurationError, match="COUNT/PERIOD"):

        @app.job(rate_limit="fast")
        async def quick(ctx: JobContext) -> None:
            return None
