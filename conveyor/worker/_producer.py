"""The worker's producer: claims as many due jobs as it has free slots, in one round trip,
and starts their handlers (River's producer)."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from conveyor.core.flow import TenantLimit
from conveyor.core.lifecycle import Event
from conveyor.core.model import Job
from conveyor.core.retry import pause_after_failures
from conveyor.errors import ConfigurationError
from conveyor.observe import tracing
from conveyor.observe.hooks import AttemptStarted
from conveyor.store import Limits, WorkerStore
from conveyor.worker._base import WorkerBase, _Phase, log
from conveyor.worker._leases import Run, may_have_expired

if TYPE_CHECKING:
    from conveyor.app.registry import JobType


class Producer(WorkerBase):
    """Claims due jobs into free slots and starts them; waits when none is due."""

    async def _produce(self, store: WorkerStore) -> None:
        failures = 0
        while self._phase is _Phase.RUNNING:
            # Clear before claiming, not after: a wake-up (a stop, a freed slot, a
            # notification) that arrives while the claim is in flight is not lost.
            self._wakeup.clear()
            # Leases held count too, up to one batch awaiting its settle beyond the
            # running ones: claiming while results wait would only grow the heartbeat
            # and the settle backlog when the database falls behind.
            free = min(
                self.options.concurrency - self._active,
                2 * self.options.concurrency - len(self.leases),
            )
            claimed: list[Job] = []
            # Burst mode ends on an empty claim only if nothing was running or settling
            # when it was sent: a job that settles while the claim is in flight may have
            # made work due (a spawned child, a dependent) that the claim could not see.
            idle_before = self._idle_now()
            if free > 0:
                # The database starts the lease at some moment after this one: counting
                # from here, the worker never believes it holds a lease longer than it does.
                sent = time.monotonic()
                hold = functools.partial(self.leases.hold_claimed, sent=sent)
                try:
                    claimed = await store.claim(
                        worker_id=self.id,
                        queues=self.queues,
                        types=self.types,
                        limit=free,
                        lease=self.options.lease,
                        limits=_limits(
                            self._limited, self.leases.snapshot(), self.app.tenants.limits
                        ),
                        on_claimed=hold,  # renewed from then on, whatever the loop does
                    )
                    if self._metrics is not None:
                        self._metrics.claim_seconds.observe(time.monotonic() - sent)
                    if failures:
                        log.warning("database reachable again; claiming resumed")
                    failures = 0
                except ConfigurationError:  # retrying cannot fix a setting
                    raise
                except Exception as exc:  # the database may be restarting: back off, retry
                    failures += 1
                    if failures == 1:
                        log.error("cannot claim jobs (%s); retrying with backoff", exc)
                    await self._sleep(pause_after_failures(failures, jitter=random.random()))
                    continue
                finally:
                    # Whatever came of the call, the jobs it leased start (or go back).
                    self._start_claimed()
                if len(claimed) == free:
                    continue  # more may be due; claim again as soon as slots free
                if not claimed and self.options.burst and idle_before and self._idle_now():
                    return
            try:
                await asyncio.wait_for(self._wakeup.wait(), self.options.poll_interval)
            except TimeoutError:
                pass

    def _idle_now(self) -> bool:
        """Whether no handler runs and no result waits for its settle."""
        return self._active == 0 and not self._outbox and not len(self.leases)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop_requested.wait(), seconds)
        except TimeoutError:
            pass

    async def _listen(self, store: WorkerStore) -> None:
        # Loop on a flag, not only on cancellation: asyncio.wait_for in Python 3.11 can
        # swallow a cancel that arrives as its inner wait completes.
        while not self._maintenance_stop.is_set():
            try:
                cancelled = await store.wait_for_jobs(self.options.poll_interval)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(self.options.poll_interval)
                continue
            if cancelled:
                self._on_cancel_requested(cancelled)
            self._wakeup.set()

    # -- running ------------------------------------------------------------------------

    def _start_claimed(self) -> None:
        """Start the handlers of the runs claimed since last called (on the loop)."""
        store = self._store
        # Once per claim, not per job: asking opentelemetry costs an environment lookup.
        self._traced = tracing.enabled()
        if store is not None:
            for run, previous in self.leases.take_claimed():
                self._start(store, run, previous)

    def _start(self, store: WorkerStore, run: Run, previous: Run | None) -> None:
        job = run.job
        if previous is not None and not previous.done:
            # The job was rescued from this worker (its lease ran out) and claimed back:
            # the earlier run's lease is gone, so it stops now rather than run alongside.
            # Its result, if any, is dropped; were it already on its way to the store,
            # the new claim's token would make the store refuse it.
            log.warning(
                "job %s: claimed again after its lease ran out; dropping the older run", job.id
            )
            self._lose(previous)
        if run.done:
            return
        stale = may_have_expired(run, time.monotonic())
        self._active += 1
        self._idle.clear()
        if stale or self._phase >= _Phase.STOPPING:
            # Claimed as the stop came (the claim was in flight), or the loop came back to
            # this claim too late (it was blocked) and another worker may hold the job by
            # now: never start a handler then, hand the job back unstarted. The hand-back
            # is fenced like any settle: refused if the job was rescued meanwhile, else
            # the job is queued again at once (not stuck until its lease runs out).
            if stale:
                log.warning("job %s: lease may have expired before its handler started", job.id)
            run.began = time.perf_counter()
            self._finish(run, self._settlement(run, Event.HAND_BACK, None))
            return
        job_type = self.app.registry.find(job.type)
        # A process-isolated handler is awaited like an async one: cancelling its task
        # stops the child process.
        run.is_async = (
            job_type is None or job_type.is_async or job_type.options.isolation == "process"
        )
        # Unnamed: naming a task costs more than a no-op job's handler; the job shows in
        # the task's coroutine (Worker._execute) and in every log line about it.
        run.task = asyncio.create_task(self._execute(run, job_type, store))
        self._started(run)

    def _started(self, run: Run) -> None:
        """Count, log and announce an attempt as it starts."""
        job = run.job
        run.began = time.perf_counter()
        if self._metrics is not None:
            m = run.metrics = self._metrics.of(job.type, job.queue)
            m.started += 1
            m.running += 1
            if job.started_at is not None:
                m.wait_seconds.observe_delta(job.started_at - job.run_at)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "job started (attempt %d/%d)",
                job.attempt,
                job.max_attempts,
                extra=run.fields(self.id),
            )
        if self._hooks.attempt_start:
            self._hooks.started(AttemptStarted(job=job, worker_id=self.id))


def _limits(
    limited: Sequence[JobType], held: Iterable[Run], tenants: Mapping[str, TenantLimit]
) -> Limits | None:
    """The flow control this claim must respect, or None when no type or tenant has any."""
    if not limited:
        return Limits(tenants=tenants) if tenants else None
    running: dict[str, int] = {}
    for run in held:
        if not run.done:
            running[run.job.type] = running.get(run.job.type, 0) + 1
    local = {
        t.name: t.options.concurrency - running.get(t.name, 0)
        for t in limited
        if t.options.concurrency is not None
    }
    return Limits(
        local=local,
        cluster={
            t.name: t.options.global_concurrency
            for t in limited
            if t.options.global_concurrency is not None
        },
        per_key={
            t.name: t.options.key_concurrency
            for t in limited
            if t.options.key_concurrency is not None
        },
        rate={t.name: t.options.rate_limit for t in limited if t.options.rate_limit},
        tenants=tenants,
    )
