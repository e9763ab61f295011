"""The worker's executor: runs one attempt of a job's handler (async on the loop, sync in a
thread, or in a child process), with its time limit, cancellation and lease loss, and
turns how it ended into a settlement (River's job executor)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
import traceback
from typing import TYPE_CHECKING

from conveyor.core.lifecycle import Event, Status, transition
from conveyor.core.model import JSON, Outcome, Settlement, after_failure
from conveyor.core.retry import retry_limit_note
from conveyor.errors import ConveyorError, UnknownJobType
from conveyor.observe import tracing
from conveyor.store import WorkerStore
from conveyor.worker._base import WorkerBase, log
from conveyor.worker._isolation import ChildFailed, run_in_child
from conveyor.worker._leases import Interrupt, Run, lease_current, lease_fresh
from conveyor.worker._port import Port
from conveyor.worker._threads import in_thread
from conveyor.worker.context import Cancel, JobContext, Retry

if TYPE_CHECKING:
    from conveyor.app.registry import JobType


# How long a process-isolated handler's child may take to start (interpreter, imports)
# before the job's own time limit begins; it is added to that limit until the child
# reports in. Generous, because a loaded machine can take seconds to start Python.
_CHILD_START_ALLOWANCE = 60.0

# Results that are JSON as they are: no need to serialise them to find out.
_PLAIN = frozenset({str, int, bool})


class Executor(WorkerBase):
    """Runs claimed jobs' handlers and decides each attempt's settlement."""

    async def _execute(self, run: Run, job_type: JobType | None, store: WorkerStore) -> None:
        if not self._traced:
            await self._attempt(run, job_type, store)
            return
        with tracing.attempt_span(run.job, self.id) as span:
            settlement = await self._attempt(run, job_type, store)
            if settlement is None:
                tracing.end_attempt(span, "lost", None)
            else:
                outcome = None if settlement.outcome is None else settlement.outcome.value
                tracing.end_attempt(span, outcome, settlement.error)

    async def _attempt(
        self, run: Run, job_type: JobType | None, store: WorkerStore
    ) -> Settlement | None:
        """Run one attempt to its end; return its settlement (None: abandoned or lost)."""
        settlement: Settlement | None
        try:
            # Nearly every run starts on a fresh lease: no coroutine to wait for it then.
            if not lease_fresh(run, time.monotonic()) and not await lease_current(run):
                if not run.done:
                    # No renewal came before the lease may have run out: the handler never
                    # starts, and the job goes back, fenced by its token like any settle
                    # (refused if it was rescued meanwhile, else queued again at once, its
                    # attempt not spent). Dropped, it would sit "running" until rescued.
                    log.warning(
                        "job %s: lease not renewed in time; not started, handed back",
                        run.job.id,
                    )
                    self._finish(run, self._settlement(run, Event.HAND_BACK, None))
                return None
            settlement = await self._invoke(run, job_type, store)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if run.interrupt is None or task is None:
                raise
            task.uncancel()
            settlement = self._interrupted(run)
        finally:
            if run.timer is not None:
                run.timer.cancel()
        if run.done:
            return None  # abandoned: the job was already settled without this run's result
        if run.interrupt is not None:
            # However the handler ended, the interruption decides: a timed-out job that
            # swallowed its cancellation is not marked succeeded, a lost one not at all.
            settlement = self._interrupted(run)
        self._finish(run, settlement)
        return settlement

    async def _invoke(
        self, run: Run, job_type: JobType | None, store: WorkerStore
    ) -> Settlement | None:
        job = run.job
        loop = asyncio.get_running_loop()
        if job_type is None:
            return self._failure(
                run,
                Outcome.FAILED,
                f"no handler for job type {job.type!r} in worker {self.id}; "
                f"known types: {', '.join(self.app.registry.names()) or 'none'}",
            )
        try:
            kwargs = job_type.arguments(job.payload)
        except ConveyorError as exc:
            return self._failure(run, Outcome.FAILED, str(exc), final=True)
        port = Port(run, self.leases, store, self.app)
        ctx = run.ctx = JobContext(job, worker_id=self.id, port=port, loop=loop)
        if job.cancel_requested:
            self._interrupt(run, Interrupt.CANCEL, job.error or "cancel requested")
        isolated = job_type.options.isolation == "process"
        if job.timeout:
            # An isolated handler's limit starts when its child reports in; until then
            # the child gets a start-up allowance, not the handler's own time.
            self._arm_timeout(run, job.timeout + _CHILD_START_ALLOWANCE if isolated else None)
        try:
            if isolated:
                result = await run_in_child(
                    job_type,
                    job,
                    ctx._port,
                    cancel_grace=self.options.cancel_grace,
                    on_started=lambda: self._arm_timeout(run),
                )
            elif run.is_async:
                result = await job_type.fn(ctx, **kwargs)
            else:
                called = in_thread(self._threads, loop, job_type.fn, ctx, kwargs, self._traced)
                result = await asyncio.shield(called)
        except Retry as exc:
            return self._failure(
                run, Outcome.FAILED, f"retry requested: {exc.reason}", retry_after=exc.after
            )
        except Cancel as exc:
            return self._settlement(run, Event.CANCEL, Outcome.CANCELLED, error=exc.reason)
        except asyncio.CancelledError:
            raise
        except ChildFailed as exc:
            return self._failure(run, Outcome.FAILED, str(exc), tb=exc.traceback, final=exc.final)
        except Exception as exc:
            final = isinstance(exc, job_type.options.non_retryable)
            return self._failure(
                run,
                Outcome.FAILED,
                f"{type(exc).__name__}: {exc}",
                tb=traceback.format_exc(),
                final=final,
            )
        try:
            if result is not None and type(result) not in _PLAIN:
                json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return self._failure(
                run,
                Outcome.FAILED,
                f"the handler returned a result that is not JSON ({exc}); return plain data",
                final=True,
            )
        return self._settlement(
            run,
            Event.SUCCEED,
            Outcome.SUCCEEDED,
            result=result,
            result_ref=None if ctx.result_ref is None else str(ctx.result_ref),
        )

    def _settlement(
        self,
        run: Run,
        event: Event,
        outcome: Outcome | None,
        *,
        result: JSON = None,
        result_ref: str | None = None,
        error: str | None = None,
    ) -> Settlement:
        return Settlement(
            job_id=run.job.id,
            token=run.job.lease_token,
            status=transition(Status.RUNNING, event),
            outcome=outcome,
            result=result,
            result_ref=result_ref,
            error=error,
        )

    def _failure(
        self,
        run: Run,
        outcome: Outcome,
        error: str,
        *,
        tb: str | None = None,
        final: bool = False,
        retry_after: float | None = None,
    ) -> Settlement:
        job = run.job
        settlement = after_failure(
            job_id=job.id,
            token=job.lease_token,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            outcome=outcome,
            error=error,
            traceback=tb,
            backoff_base=job.backoff_base,
            backoff_cap=job.backoff_cap,
            jitter=random.random(),
            retry_after=retry_after,
            final=final,
        )
        limit = self._retry_limit(job.type) if job.retry_count else None
        if settlement.status is Status.FAILED and limit is not None and job.retry_count >= limit:
            # The last manual retry its type allows says so as it fails, not only once
            # another retry is refused.
            note = retry_limit_note(limit=limit, first_id=job.retry_of or job.id)
            settlement = dataclasses.replace(settlement, error=f"{settlement.error}; {note}")
        return settlement

    def _retry_limit(self, job_type: str) -> int | None:
        try:
            return self.app.registry.get(job_type).options.retry_limit
        except UnknownJobType:  # failed for that very reason: nothing to say of retries
            return None

    def _arm_timeout(self, run: Run, after: float | None = None) -> None:
        """Interrupt ``run`` when its time limit (or ``after`` seconds) has passed."""
        timeout = run.job.timeout
        if timeout is None or run.done:
            return
        if run.timer is not None:
            run.timer.cancel()
        run.timer = asyncio.get_running_loop().call_later(
            timeout if after is None else after,
            self._interrupt,
            run,
            Interrupt.TIMEOUT,
            f"timed out after {timeout:g}s",
        )

    def _interrupted(self, run: Run) -> Settlement | None:
        if run.interrupt is Interrupt.CANCEL:
            # No error of its own: the job keeps the reason stored with the cancel request.
            return self._settlement(run, Event.CANCEL, Outcome.CANCELLED)
        if run.interrupt is Interrupt.TIMEOUT:
            return self._failure(run, Outcome.TIMED_OUT, run.reason)
        if run.interrupt is Interrupt.HAND_BACK:
            return self._settlement(run, Event.HAND_BACK, None)
        return None

    def _interrupt(self, run: Run, kind: Interrupt, reason: str) -> None:
        """Stop a run: cancel an async handler, flag a sync one, abandon it after a grace."""
        if run.done or (run.interrupt is not None and kind is not Interrupt.LOST):
            return
        run.interrupt = kind
        run.reason = reason
        if run.ctx is not None:
            run.ctx._mark_cancelled(reason)
        # A sync handler's thread cannot be interrupted: it sees ctx.cancelled instead.
        if run.task is not None and (run.is_async or kind is Interrupt.LOST):
            run.task.cancel()
        if kind is not Interrupt.LOST:
            asyncio.get_running_loop().call_later(self.options.cancel_grace, self._abandon, run)

    def _abandon(self, run: Run) -> None:
        if run.done:
            return
        log.warning(
            "job %s ignored %s for %.1fs: abandoned",
            run.job.id,
            run.reason,
            self.options.cancel_grace,
        )
        settlement = self._interrupted(run)
        if settlement is not None and run.interrupt is Interrupt.HAND_BACK:
            # Its handler is still running, until this process exits: the job goes back
            # to the queue runnable only once its lease would have run out, as after a
            # crash, so that no other worker starts it alongside (no attempt is spent).
            left = run.lease - (time.monotonic() - run.renewed_at)
            settlement = dataclasses.replace(settlement, retry_delay=max(0.0, left))
        self._finish(run, settlement)

    def _finish(self, run: Run, settlement: Settlement | None) -> None:
        run.done = True
        run.elapsed = time.perf_counter() - run.began
        self._active -= 1
        self.processed += 1
        if run.metrics is not None:
            run.metrics.running -= 1
        if settlement is None:
            self.leases.release((run,))
            self._lost(run)
        else:
            # Progress not yet written by a heartbeat goes with the result.
            progress = self.leases.pop_progress(run)
            if progress is not None:
                settlement = dataclasses.replace(settlement, progress=progress)
            self._outbox.append((run, settlement))
            self._settle_ready.set()
        if self._active == 0:
            self._idle.set()
        self._wakeup.set()

    def _lose(self, run: Run) -> None:
        """Stop a run whose lease is gone and drop its result."""
        self._interrupt(run, Interrupt.LOST, "lease lost")
        self._finish(run, None)

    # -- settling -----------------------------------------------------------------------
