"""A schedule's overlap policy, on every backend: ``skip`` holds ticks back while the
previous run is unfinished (the schedule still advances), ``allow`` fires every tick.
Ticks are fired directly on a pinned clock, never by waiting."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest

from conveyor import ConfigurationError, Conveyor, JobContext, Status
from conveyor.core.cron import CatchUp, Cron, Overlap, Schedule
from conveyor.core.model import Outcome, Settlement
from conveyor.store import JobPageQuery, Store
from conveyor.web import create_api
from tests.helpers import FakeClock
from tests.test_cli import acli


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(now=datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp())


def every_minute(overlap: Overlap, catch_up: CatchUp = CatchUp.SKIP) -> Schedule:
    return Schedule(
        name="sync",
        cron=Cron("* * * * *"),
        type="report",
        payload={},
        catch_up=catch_up,
        overlap=overlap,
    )


async def tick(store: Store, clock: FakeClock) -> list[str]:
    clock.advance(60)
    return await store.fire_schedules(limit=10)


async def job_ids(store: Store) -> list[str]:
    return sorted(j.id for j in await store.page_jobs(JobPageQuery(limit=100)))


async def skipped(store: Store) -> int:
    (info,) = await store.schedules()
    return info.skipped_ticks


async def test_skip_holds_ticks_back_while_the_run_is_queued_or_running(
    store: Store, clock: FakeClock
) -> None:
    await store.sync_schedules([every_minute(Overlap.SKIP)])
    (first,) = await tick(store, clock)
    for _ in range(3):  # three ticks while the first run is still queued
        assert await tick(store, clock) == []
    assert await job_ids(store) == [first] and await skipped(store) == 3
    (info,) = await store.schedules()
    assert info.next_run_at.timestamp() > clock.now  # advanced past every skipped tick

    (running,) = await store.claim(worker_id="w1", queues=["default"], limit=1, lease=30)
    assert running.id == first
    assert await tick(store, clock) == []  # running holds ticks back too
    done = Settlement(first, running.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    assert await store.settle([done]) == []

    (second,) = await tick(store, clock)  # finished: the next tick fires again
    assert second != first and await job_ids(store) == sorted([first, second])
    assert await skipped(store) == 4


async def test_allow_fires_every_tick(store: Store, clock: FakeClock) -> None:
    await store.sync_schedules([every_minute(Overlap.ALLOW)])
    fired = [job_id for _ in range(4) for job_id in await tick(store, clock)]
    assert len(fired) == 4 and await job_ids(store) == sorted(fired)
    assert await skipped(store) == 0


async def test_skip_catches_up_with_one_run_and_run_now_ignores_it(
    store: Store, clock: FakeClock
) -> None:
    await store.sync_schedules([every_minute(Overlap.SKIP, CatchUp.BACKFILL)])
    clock.advance(5 * 60 + 40)  # five ticks missed: backfill would fire each of them
    (latest,) = await store.fire_schedules(limit=10)
    assert latest.endswith("12:05:00Z") and await skipped(store) == 4
    manual = await store.run_schedule("sync")  # by hand: an explicit request, fired anyway
    assert manual is not None and manual.id != latest
    assert len(await job_ids(store)) == 2


async def test_the_policy_is_declared_checked_and_shown(app: Conveyor) -> None:
    @app.job()
    async def report(ctx: JobContext) -> None:
        return None

    with pytest.raises(ConfigurationError, match="'sometimes' is not a valid Overlap"):
        app.schedule("bad", "* * * * *", report, overlap="sometimes")
    app.schedule("sync", "* * * * *", report, overlap="skip")
    app.schedule("beat", "* * * * *", report)
    await app.sync_schedules()
    policies = {i.schedule.name: i.schedule.overlap for i in await app.list_schedules()}
    assert policies == {"beat": Overlap.ALLOW, "sync": Overlap.SKIP}

    _, secret = await app.create_token(tenant="ops", role="admin")
    transport = httpx.ASGITransport(app=create_api(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        answer = await client.get("/schedules", headers={"Authorization": f"Bearer {secret}"})
    assert answer.status_code == 200, answer.text
    shown = {s["name"]: (s["overlap"], s["skipped_ticks"]) for s in answer.json()["schedules"]}
    assert shown == {"beat": ("allow", 0), "sync": ("skip", 0)}


async def test_schedules_list_shows_the_policy_and_skipped_ticks(
    db_url: str, store: Store, clock: FakeClock
) -> None:
    await store.sync_schedules([every_minute(Overlap.SKIP)])
    await tick(store, clock)
    await tick(store, clock)  # skipped: the first run is still queued
    listed = await acli("schedules", "list", "--json", "--database-url", db_url)
    assert listed.returncode == 0, listed.stderr
    (sched,) = json.loads(listed.stdout)["schedules"]
    assert sched["schedule"]["overlap"] == "skip" and sched["skipped_ticks"] == 1
    table = await acli("schedules", "list", "--database-url", db_url)
    assert table.returncode == 0, table.stderr
    assert "overlap" in table.stdout and "skip (1 skipped)" in table.stdout
