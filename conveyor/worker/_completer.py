"""The worker's completer: records finished attempts in batches, so that while one settle
is in flight the next ones gather (River's job completer), and logs each outcome."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement
from conveyor.core.retry import pause_after_failures
from conveyor.observe.hooks import AttemptEnded
from conveyor.observe.logs import JobLines, direct_handler
from conveyor.store import WorkerStore
from conveyor.worker._base import WorkerBase, _Phase, log
from conveyor.worker._leases import Interrupt, Run

if TYPE_CHECKING:
    pass


class Completer(WorkerBase):
    """Settles finished attempts in batches and reports each outcome."""

    async def _settle_loop(self, store: WorkerStore) -> None:
        failures = 0
        while True:
            await self._settle_ready.wait()
            self._settle_ready.clear()
            batch, self._outbox = self._outbox, []
            if not batch:
                # Settle until the shutdown has drained: a claim still in flight when
                # the stop came may start jobs whose results must be recorded too.
                if self._phase >= _Phase.DRAINED:
                    return
                continue
            try:
                sent = time.monotonic()
                refused = set(await store.settle([s for _, s in batch]))
                if refused and failures:
                    refused -= await recorded_before(store, batch, refused)
                if self._metrics is not None:
                    self._metrics.settle_seconds.observe(time.monotonic() - sent)
                failures = 0
            except Exception as exc:
                if self._phase is _Phase.GAVE_UP:
                    return
                failures += 1
                if failures == 1:
                    log.error("cannot record finished jobs (%s); retrying", exc)
                self._outbox[:0] = batch
                await asyncio.sleep(pause_after_failures(failures, jitter=random.random()))
                self._settle_ready.set()
                continue
            # Outcome lines straight to conveyor's handler when that is the same as logging
            # them (asked once a batch), written together: see logs.direct_handler.
            direct = direct_handler(log, logging.INFO) if log.isEnabledFor(logging.INFO) else None
            lines = None if direct is None else direct.job_lines(log.name, logging.INFO, self.id)
            for run, settlement in batch:
                if run.job.id in refused:
                    self._lost(run, "lease lost before its result was recorded")
                else:
                    self._recorded(run, settlement, lines)
            if lines is not None:
                lines.write()
            self.leases.release(run for run, _ in batch)
            self._wakeup.set()  # slots held by the batch are free for the producer
            if self._phase >= _Phase.STOPPING:
                self._settle_ready.set()

    def _recorded(self, run: Run, s: Settlement, lines: JobLines | None) -> None:
        """Count, log and announce an attempt's outcome once the database has it.

        ``lines``: where INFO lines go to be written directly (None: to ``log``).
        """
        status, m = s.status, run.metrics
        retry_at = None
        if status is Status.QUEUED and s.outcome is not None:
            retry_at = datetime.now(UTC) + timedelta(seconds=s.retry_delay)
        if m is not None:
            m.run_seconds.observe(run.elapsed)
            if status is Status.SUCCEEDED:
                m.succeeded += 1
            elif status is Status.FAILED:
                m.failed += 1
            elif status is Status.CANCELLED:
                m.cancelled += 1
            elif retry_at is not None:
                m.retried += 1
        level = logging.ERROR if status is Status.FAILED else logging.INFO
        if lines is not None and level == logging.INFO:
            lines.add(_outcome_line(run, s, retry_at), run.job, s.outcome, run.elapsed, retry_at)
        elif log.isEnabledFor(level):
            fields = run.fields(self.id)
            fields["outcome"] = s.outcome  # a StrEnum: the text it prints is its value
            fields["duration"] = round(run.elapsed, 6)
            if retry_at is not None:
                fields["retry_at"] = retry_at.isoformat()
            if status is Status.FAILED:
                fields["error"] = s.error
                fields["traceback"] = s.traceback
            log.log(level, _outcome_line(run, s, retry_at), extra=fields)
        hooks = self._hooks
        if hooks.attempt_end or hooks.final_failure:
            hooks.ended(
                AttemptEnded(
                    job=run.job,
                    worker_id=self.id,
                    status=status.value,
                    outcome=None if s.outcome is None else s.outcome.value,
                    duration=run.elapsed,
                    error=s.error,
                    traceback=s.traceback,
                    retry_at=retry_at,
                )
            )

    def _lost(self, run: Run, why: str = "lease lost; its result is dropped") -> None:
        """Count, log and announce a run whose lease is gone."""
        if run.metrics is not None:
            run.metrics.lease_losses += 1
        log.warning("job %s after %.3fs", why, run.elapsed, extra=run.fields(self.id))
        hooks = self._hooks
        if hooks.attempt_end:
            hooks.ended(
                AttemptEnded(
                    job=run.job,
                    worker_id=self.id,
                    status="lost",
                    outcome=None,
                    duration=run.elapsed,
                    error=why,
                )
            )

    # -- shutting down ------------------------------------------------------------------

    async def _drain(self) -> None:
        self._advance(_Phase.STOPPING)
        if self._active:
            log.info("waiting up to %.1fs for %d running jobs", self.options.grace, self._active)
            try:
                await asyncio.wait_for(self._idle.wait(), self.options.grace)
            except TimeoutError:
                running = [r for r in self.leases.snapshot() if not r.done]
                log.warning("grace period over: handing back %d jobs", len(running))
                for run in running:
                    self._interrupt(run, Interrupt.HAND_BACK, "worker shutting down")
                await self._idle.wait()
        # Results wait for the database at most a lease: past that their leases have
        # expired anyway, and other workers rescue and rerun those jobs.
        deadline = asyncio.get_running_loop().time() + max(self.options.lease, 5.0)
        while self._outbox or self.leases.awaiting_settle():
            if asyncio.get_running_loop().time() > deadline:
                log.error(
                    "could not record %d finished jobs before stopping; they will run again "
                    "once their leases expire",
                    len(self._outbox),
                )
                self._outbox.clear()
                self._advance(_Phase.GAVE_UP)
                break
            self._settle_ready.set()
            await asyncio.sleep(0.01)


def _outcome_line(run: Run, s: Settlement, retry_at: datetime | None) -> str:
    """The log message of a recorded attempt (the job's fields go with it, not in it)."""
    status = s.status
    if status is Status.SUCCEEDED:  # first: nearly every line
        return f"job succeeded in {run.elapsed:.3f}s"
    job, took = run.job, f"{run.elapsed:.3f}s"
    what = "timed out" if s.outcome is Outcome.TIMED_OUT else "failed"
    if status is Status.QUEUED and retry_at is not None:
        return (
            f"job {what} (attempt {job.attempt}/{job.max_attempts}) after {took}: {s.error}; "
            f"retry at {retry_at.isoformat(timespec='seconds')}"
        )
    if status is Status.FAILED:
        return (
            f"job {what} (attempt {job.attempt}/{job.max_attempts}, no retry left) "
            f"after {took}: {s.error}"
        )
    if status is Status.CANCELLED:
        return f"job cancelled after {took}: {s.error or run.reason}"
    if status is Status.QUEUED:
        return f"job handed back after {took} ({run.reason or 'worker stopping'})"
    return f"job {status.value} after {took}"


async def recorded_before(
    store: WorkerStore, batch: Sequence[tuple[Run, Settlement]], refused: set[str]
) -> set[str]:
    """The refused jobs that a failed try of this settle had recorded after all.

    A settle retried after a lost connection (a database restart) is refused for the jobs
    whose first try committed before the answer was lost: their attempt rows already hold
    this run's outcome. Those results were recorded, not lost.
    """
    found = set()
    for run, settlement in batch:
        if run.job.id in refused and settlement.outcome is not None:
            attempts = await store.attempts(run.job.id)
            number, outcome = run.job.attempt, settlement.outcome
            if any(a.number == number and a.outcome == outcome for a in attempts):
                found.add(run.job.id)
    return found
