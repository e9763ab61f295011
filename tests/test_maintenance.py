"""The maintenance duties, called directly (``run_once`` and what the loop asks), on every
backend with the store's clock pinned."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from conveyor.core.cron import Cron, Schedule, tick_id
from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement
from conveyor.store import Lease, Retention, Store
from conveyor.worker._maintenance import CronFirer, ParentFinisher, Pruner, Rescuer
from tests.helpers import FakeClock, new


@pytest.fixture
def clock() -> FakeClock:
    # On a minute boundary, so the tick arithmetic reads plainly.
    return FakeClock(now=datetime(2026, 1, 1, 12, 0, tzinfo=UTC).timestamp())


def every(seconds: int, name: str) -> Schedule:
    return Schedule(name, Cron(f"*/{seconds} * * * * *"), "t", {})


async def test_the_cron_firer_sleeps_to_the_next_tick_not_a_fixed_interval(
    store: Store, clock: FakeClock
) -> None:
    firer = CronFirer(store, interval=5.0)
    assert await firer.next_delay() == 5.0  # no schedule: the interval
    await store.sync_schedules([every(2, "two"), every(3, "three")])
    clock.advance(0.5)
    delay = await firer.next_delay()  # to 12:00:02, the earlier of the two next ticks
    assert 1.5 <= delay <= 1.5 + 0.05
    clock.advance(delay)
    assert await firer.run_once() == [tick_id("two", datetime(2026, 1, 1, 12, 0, 2, tzinfo=UTC))]
    assert 1.0 - 0.1 <= await firer.next_delay() <= 1.0 + 0.05  # to 12:00:03 (three)


async def test_the_cron_firer_counts_a_tick_late_by_less_than_its_check_grace_on_time(
    store: Store, clock: FakeClock
) -> None:
    await store.sync_schedules([every(1, "beat")])
    clock.advance(1 + 1.5)  # the 12:00:01 tick, 1.5 s late (its own grace is 0.5 s)
    fired = await CronFirer(store, interval=1.0).run_once()
    assert fired == [
        tick_id("beat", datetime(2026, 1, 1, 12, 0, second, tzinfo=UTC)) for second in (1, 2)
    ]
    clock.advance(10)  # ten ticks with no worker: the five older than the 5 s grace are skipped
    assert len(await CronFirer(store, interval=1.0).run_once()) == 5


async def test_the_rescuer_settles_expired_leases_in_batches(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new(f"j{i}") for i in range(5)])
    await store.claim(worker_id="gone", queues=["default"], limit=5, lease=30)
    assert await Rescuer(store, batch=2).run_once() == []  # every lease still valid
    clock.advance(31)
    rescued = await Rescuer(store, batch=2).run_once()  # three batches: 2, 2 and 1
    assert sorted(r.job_id for r in rescued) == [f"j{i}" for i in range(5)]
    assert {r.worker_id for r in rescued} == {"gone"}
    assert {r.status for r in rescued} == {Status.QUEUED}


async def test_the_pruner_deletes_in_small_batches_up_to_its_limit_per_run(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new(f"j{i}") for i in range(7)])
    for job in await store.claim(worker_id="w", queues=["default"], limit=7, lease=30):
        done = Settlement(job.id, job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        await store.settle([done])
    clock.advance(100)
    pruner = Pruner(store, Retention(succeeded=50), batch=2, max_batches=3)
    assert await pruner.run_once() == 6  # three batches of two, then the run ends
    assert await pruner.run_once() == 1
    assert await pruner.run_once() == 0


async def test_the_parent_finisher_finds_nothing_when_settling_ended_every_parent(
    store: Store,
) -> None:
    await store.submit([new("parent")])
    (parent,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
    await store.spawn(Lease("parent", parent.lease_token), [new("child")])
    done = Settlement("parent", parent.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    await store.settle([done])
    (child,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
    await store.settle(
        [Settlement("child", child.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)]
    )
    assert await ParentFinisher(store).run_once() == []
    finished = await store.get("parent")
    assert finished is not None and finished.status is Status.SUCCEEDED
