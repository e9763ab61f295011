"""Maintenance duties that every worker runs, safe when all of them run at once.

Each duty is ``run_once() -> result`` plus a loop that does nothing else; tests call
``run_once`` directly.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Protocol

from conveyor.core.cron import check_grace, next_check
from conveyor.core.retry import pause_after_failures
from conveyor.observe.metrics import Metrics
from conveyor.store import MaintenanceStore, ReadStore, Rescued, Retention

log = logging.getLogger("conveyor.maintenance")


@dataclass
class Rescuer:
    """Settles jobs whose lease expired as ``lost`` attempts; the retry policy then applies."""

    store: MaintenanceStore
    batch: int = 500
    metrics: Metrics | None = None  # counts rescued jobs per type and queue

    async def run_once(self) -> list[Rescued]:
        rescued: list[Rescued] = []
        while True:
            found = await self.store.rescue(limit=self.batch, jitter=random.random())
            rescued.extend(found)
            if len(found) < self.batch:
                break
        for r in rescued:
            log.warning(
                "rescued job %s from worker %s (lease expired): now %s",
                r.job_id,
                r.worker_id,
                r.status.value,
            )
        if rescued and self.metrics is not None:
            # Rescues are rare: one more read for their types costs nothing in steady state.
            for job in await self.store.get_many([r.job_id for r in rescued]):
                self.metrics.of(job.type, job.queue).rescued += 1
        return rescued


@dataclass
class ParentFinisher:
    """Ends waiting parents whose children have all ended.

    Settling the last child normally does this in its own transaction; this duty catches
    any parent left waiting.
    """

    store: MaintenanceStore
    batch: int = 500

    async def run_once(self) -> list[str]:
        finished = await self.store.finish_parents(limit=self.batch)
        for job_id in finished:
            log.info("finished waiting parent %s", job_id)
        return finished


class _TickStore(MaintenanceStore, ReadStore, Protocol):
    """What the cron firer needs: firing ticks, and reading when the next one is due."""


@dataclass
class CronFirer:
    """Fires due schedule ticks; each tick fires once however many workers run this.

    ``interval`` is the longest wait between two looks (see :func:`on_the_clock`); a tick
    up to twice that late still counts as on time, so a healthy cluster never skips one.
    """

    store: _TickStore
    batch: int = 100
    interval: float = 1.0
    jitter: float = 0.05  # at most, and at most a tenth of the interval

    async def run_once(self) -> list[str]:
        fired = await self.store.fire_schedules(
            limit=self.batch, min_grace=check_grace(self.interval)
        )
        for job_id in fired:
            log.info("fired %s", job_id)
        return fired

    async def next_delay(self) -> float:
        """Seconds until the next look: the next tick of any enabled schedule, plus jitter."""
        upcoming = [s.next_run_at for s in await self.store.schedules() if s.enabled]
        if not upcoming:
            return self.interval
        jitter = random.uniform(0.0, min(self.jitter, self.interval / 10))
        now = await self.store.now()  # the clock the store fires by
        delay = next_check(upcoming, now=now, interval=self.interval, jitter=jitter)
        # A tick still due right after a look (another worker is firing it, or it cannot
        # be fired) must not turn the loop into a busy one.
        return max(delay, min(self.jitter, self.interval))


@dataclass
class Pruner:
    """Deletes finished job trees older than their retention, in small batches."""

    store: MaintenanceStore
    retention: Retention
    batch: int = 500
    max_batches: int = 20  # per run, so one run never holds the database for long

    async def run_once(self) -> int:
        total = 0
        for _ in range(self.max_batches):
            deleted = await self.store.prune(self.retention, limit=self.batch)
            total += deleted
            if deleted == 0:
                break
        if total:
            log.info("pruned %d finished jobs", total)
        return total


@dataclass
class WorkerForgetter:
    """Deletes workers silent for longer than their own forget window, dead or stopped.

    A killed worker would otherwise stay in the registry for as long as the database
    lives, and every look at the cluster would count it; its attempts keep its history.
    """

    store: MaintenanceStore
    batch: int = 500

    async def run_once(self) -> list[str]:
        forgotten: list[str] = []
        while True:
            found = await self.store.forget_workers(limit=self.batch)
            forgotten.extend(found)
            if len(found) < self.batch:
                break
        for worker_id in forgotten:
            log.info("forgot worker %s (silent for longer than its forget window)", worker_id)
        return forgotten


class Duty(Protocol):
    async def run_once(self) -> object: ...


async def every(interval: float, duty: Duty, stop: asyncio.Event) -> None:
    """Run ``duty.run_once()`` every ``interval`` seconds until ``stop`` is set."""
    failures = 0
    while not stop.is_set():
        try:
            await duty.run_once()
            failures = 0
        except Exception as exc:  # the database may be briefly unavailable
            failures += 1
            if failures == 1:
                log.warning("%s failed, will retry: %s", type(duty).__name__, exc)
        pause = interval
        if failures > 1:  # a one-off failure retries on time; an outage backs off
            pause = max(interval, pause_after_failures(failures - 1, jitter=random.random()))
        try:
            await asyncio.wait_for(stop.wait(), pause)
        except TimeoutError:
            pass


async def on_the_clock(firer: CronFirer, stop: asyncio.Event) -> None:
    """Fire schedules at their ticks until ``stop`` is set.

    Each look waits for the next tick itself rather than a fixed interval after the last
    look: workers that slept an interval plus the time their look took would drift later
    together, until every tick of a short schedule was seen too late.
    """
    failures = 0
    while not stop.is_set():
        delay = firer.interval
        try:
            await firer.run_once()
            delay = await firer.next_delay()
            failures = 0
        except Exception as exc:  # the database may be briefly unavailable
            failures += 1
            if failures == 1:
                log.warning("firing schedules failed, will retry: %s", exc)
        if failures > 1:  # as every(): a one-off failure retries on time; an outage backs off
            delay = max(delay, pause_after_failures(failures - 1, jitter=random.random()))
        try:
            await asyncio.wait_for(stop.wait(), delay)
        except TimeoutError:
            pass
