"""The maintenance duties, called directly (``run_once`` and what the loop asks), on every
backend with the store's clock pinned."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from conveyor.core.cron import Cron, Schedule, tick_id
from conveyor.maintenance import CronFirer
from conveyor.store import Store
from tests.helpers import FakeClock


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


async def test_the_cron_firer_counts_a_tick_late_by_less_than_twice_its_interval_on_time(
    store: Store, clock: FakeClock
) -> None:
    await store.sync_schedules([every(1, "beat")])
    clock.advance(1 + 1.5)  # the 12:00:01 tick, 1.5 s late (its own grace is 0.5 s)
    fired = await CronFirer(store, interval=1.0).run_once()
    assert fired == [
        tick_id("beat", datetime(2026, 1, 1, 12, 0, second, tzinfo=UTC)) for second in (1, 2)
    ]
    clock.advance(10)  # ten ticks with no worker: the eight older than the grace are skipped
    assert len(await CronFirer(store, interval=1.0).run_once()) == 2
