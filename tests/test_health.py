"""Health judges each worker by its own lease, on both backends (conveyor/core/health.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from conveyor import Conveyor
from conveyor.core.health import no_live_worker
from conveyor.store import WorkerInfo

from .helpers import eventually, running_worker

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def timed(db_url: str, clock: Clock) -> AsyncIterator[Conveyor]:
    application = Conveyor(db_url, clock=clock)
    yield application
    await application.close()


async def _register(app: Conveyor, worker_id: str, *, lease: float) -> None:
    store = await app.store()
    await store.register_worker(
        WorkerInfo(
            id=worker_id,
            hostname="h",
            pid=1,
            queues=("default",),
            concurrency=1,
            lease=lease,
            heartbeat_interval=lease / 3,
        )
    )


async def test_no_worker_ever_is_degraded_and_says_how_to_start_one(timed: Conveyor) -> None:
    health = await timed.health()
    assert health.status == "degraded"
    assert health.counts.workers == 0 and health.no_live_worker
    assert no_live_worker(workers=0, heartbeat_age=None, app="jobs:app") == (
        "no worker has heartbeated on this database — start one with `conveyor worker jobs:app`"
    )


async def test_a_worker_with_a_long_lease_stays_live_between_heartbeats(
    timed: Conveyor, clock: Clock
) -> None:
    await _register(timed, "slow", lease=240.0)
    clock.now += 70  # past the old fixed 60 s threshold, well within its lease
    health = await timed.health()
    assert health.status == "healthy", health
    assert health.counts.live_workers == 1 and health.counts.dead_workers == 0
    assert health.hint is None
    assert health.heartbeat_age == pytest.approx(70.0)


async def test_a_silent_worker_is_dead_once_its_lease_has_passed(
    timed: Conveyor, clock: Clock
) -> None:
    await _register(timed, "killed", lease=2.0)
    clock.now += 1.5
    assert (await timed.health()).counts.live_workers == 1
    clock.now += 1.0  # 2.5 s of silence with a 2 s lease: killed, frozen or cut off
    health = await timed.health()
    assert health.counts.live_workers == 0 and health.counts.dead_workers == 1
    assert health.status == "unhealthy" and health.no_live_worker
    (info,) = await timed.workers()
    assert info.lease == 2.0 and info.state(health.counts.now) == "dead"


async def test_one_dead_worker_among_live_ones_is_degraded(timed: Conveyor, clock: Clock) -> None:
    await _register(timed, "dead", lease=2.0)
    clock.now += 10
    await _register(timed, "alive", lease=30.0)
    health = await timed.health()
    assert (health.counts.live_workers, health.counts.dead_workers) == (1, 1)
    assert health.status == "degraded"
    assert health.hint is not None and health.hint.startswith("1 worker stopped heartbeating")
    assert health.to_dict()["hint"] == health.hint


async def test_a_worker_that_stopped_cleanly_is_neither_live_nor_dead(
    timed: Conveyor, clock: Clock
) -> None:
    await _register(timed, "gone", lease=2.0)
    await (await timed.store()).deregister_worker("gone")
    clock.now += 100
    health = await timed.health()
    assert (health.counts.workers, health.counts.live_workers, health.counts.dead_workers) == (
        1,
        0,
        0,
    )
    assert health.status == "unhealthy"  # workers ran here; none will run a job now
    (info,) = await timed.workers()
    assert info.state(health.counts.now) == "stopped"


async def test_a_worker_records_its_lease_and_heartbeat_interval(app: Conveyor) -> None:
    async with running_worker(app, lease=240.0):

        async def registered() -> bool:
            return (await app.health()).counts.live_workers == 1

        await eventually(registered)
        (info,) = await app.workers()
        assert info.lease == 240.0 and info.heartbeat_interval == pytest.approx(80.0)
        assert (await app.health()).status == "healthy"
