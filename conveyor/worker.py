"""The worker: claims jobs, runs their handlers, and reports how each attempt ended.

A worker has ``concurrency`` slots. It claims as many due jobs as it has free slots in
one round trip, runs async handlers on its event loop and sync handlers in a thread
pool, and settles finished attempts in batches: while one settle is in flight, the next
ones gather, so a busy worker writes many results per transaction and an idle one
writes at once.

Leases are renewed by a heartbeat thread with its own database connection, all of the
worker's leases in one statement, every lease/3. A handler that holds the event loop
(CPU-bound code in an async handler) therefore cannot make the worker lose its leases.
When a lease is lost (another worker rescued the job, or the heartbeat could not reach
the database before the lease ran out), the local run is cancelled and its result is
dropped: only the holder of the current fencing token can complete a job.

On SIGTERM or SIGINT the worker stops claiming, gives running handlers ``grace``
seconds, then cancels them and hands their jobs back as ``queued`` without spending an
attempt. A handler that ignores cancellation for ``cancel_grace`` seconds is abandoned.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import socket
import threading
import time
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from conveyor._isolation import ChildFailed, run_in_child
from conveyor.context import Cancel, JobContext, Retry
from conveyor.core.lifecycle import Event, Status, transition
from conveyor.core.model import JSON, Job, Outcome, Progress, Settlement, after_failure
from conveyor.errors import ConfigurationError, ConveyorError
from conveyor.maintenance import CronFirer, ParentFinisher, Pruner, Rescuer, every, on_the_clock
from conveyor.store import Lease, Limits, Retention, Store, WorkerInfo

if TYPE_CHECKING:
    from conveyor._handles import JobHandle, Submission
    from conveyor._host import WorkerHost
    from conveyor._registry import JobType

log = logging.getLogger("conveyor.worker")

# Results that are JSON as they are: no need to serialise them to find out.
_PLAIN = frozenset({str, int, bool})


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs, validated when built."""

    concurrency: int = 10
    queues: tuple[str, ...] | None = None  # None: the queues of the registered job types
    lease: float = 30.0
    grace: float = 30.0
    cancel_grace: float = 5.0
    poll_interval: float = 1.0
    rescue_interval: float = 5.0
    cron_interval: float = 1.0
    prune_interval: float = 60.0
    retention: Retention | None = None  # None: the defaults with the job types' overrides
    burst: bool = False
    worker_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or not 1 <= self.concurrency <= 10_000:
            raise ConfigurationError("concurrency must be an integer from 1 to 10000")
        if self.lease < 0.3:
            raise ConfigurationError("lease must be at least 0.3 seconds")
        for name in ("grace", "cancel_grace"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must not be negative")
        for name in ("poll_interval", "rescue_interval", "cron_interval", "prune_interval"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be positive")
        if self.queues is not None and not self.queues:
            raise ConfigurationError("queues, when given, must name at least one queue")


class _Interrupt(Enum):
    CANCEL = "cancel"  # a cancel request
    TIMEOUT = "timeout"
    HAND_BACK = "hand_back"  # graceful shutdown
    LOST = "lost"  # the lease is gone: drop everything


@dataclass(eq=False, slots=True)
class _Run:
    job: Job
    lease: float
    ctx: JobContext | None = None
    task: asyncio.Task[None] | None = None
    is_async: bool = True
    renewed_at: float = field(default_factory=time.monotonic)
    interrupt: _Interrupt | None = None
    reason: str = ""
    done: bool = False  # the slot was released (finished or abandoned)
    timer: asyncio.TimerHandle | None = None

    @property
    def key(self) -> Lease:
        return Lease(self.job.id, self.job.lease_token)


class Worker:
    """Claims and runs jobs for one application until stopped (or, in burst mode, idle)."""

    def __init__(self, app: WorkerHost, options: WorkerOptions) -> None:
        self.app = app
        self.options = options
        self.id = options.worker_id or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self.queues = options.queues or tuple(app.registry.queues())
        self._runs: dict[str, _Run] = {}  # leases held: running or awaiting settle
        self._lock = threading.Lock()
        self._progress: dict[Lease, Progress] = {}
        self._active = 0
        self._outbox: list[tuple[_Run, Settlement]] = []
        self._stopping = False
        self._gave_up = False  # shutting down with results the database would not take
        self._drained = False  # run() has finished draining: the settle loop may end
        self._store: Store | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=options.concurrency, thread_name_prefix="conveyor-handler"
        )
        self.processed = 0
        self._limited = [
            t
            for t in (app.registry.get(name) for name in app.registry.names())
            if t.options.concurrency
            or t.options.global_concurrency
            or t.options.key_concurrency
            or t.options.rate_limit
        ]

    # -- public -------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until :meth:`stop` (or until idle in burst mode), then shut down gracefully."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._settle_ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._maintenance_stop = asyncio.Event()
        store = self._store = self.app.new_store()
        await store.open()
        await store.register_worker(
            WorkerInfo(
                id=self.id,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                queues=self.queues,
                concurrency=self.options.concurrency,
            )
        )
        log.info(
            "worker %s started: queues %s, concurrency %d, lease %.1fs",
            self.id,
            ",".join(self.queues),
            self.options.concurrency,
            self.options.lease,
        )
        if self.app.schedules:
            await store.sync_schedules(list(self.app.schedules.values()))
        heartbeat = _Heartbeat(self)
        heartbeat.start()
        settler = asyncio.create_task(self._settle_loop(), name="conveyor-settle")
        listener = asyncio.create_task(self._listen(store), name="conveyor-listen")
        rescuer = asyncio.create_task(
            every(self.options.rescue_interval, Rescuer(store), self._maintenance_stop),
            name="conveyor-rescue",
        )
        duties = [
            asyncio.create_task(every(interval, duty, self._maintenance_stop), name=name)
            for name, interval, duty in (
                ("conveyor-finish-parents", self.options.rescue_interval, ParentFinisher(store)),
                (
                    "conveyor-prune",
                    self.options.prune_interval,
                    Pruner(store, self.app.retention(self.options.retention)),
                ),
            )
        ]
        cron = on_the_clock(
            CronFirer(store, interval=self.options.cron_interval), self._maintenance_stop
        )
        duties.append(asyncio.create_task(cron, name="conveyor-cron"))
        try:
            await self._produce(store)
            await self._drain()
        finally:
            self._drained = True
            self._maintenance_stop.set()
            listener.cancel()
            self._stopping = True
            self._settle_ready.set()
            await asyncio.gather(settler, rescuer, listener, *duties, return_exceptions=True)
            heartbeat.stop()
            await asyncio.get_running_loop().run_in_executor(None, heartbeat.join)
            try:
                await store.deregister_worker(self.id)
            except Exception as exc:
                log.warning("could not record worker %s as stopped: %s", self.id, exc)
            await store.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
            log.info("worker %s stopped after %d jobs", self.id, self.processed)

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down gracefully (thread-safe)."""
        loop = self._loop
        if loop is None:
            self._stopping = True
        elif loop.is_running():
            loop.call_soon_threadsafe(self._request_stop)

    def _request_stop(self) -> None:
        if not self._stopping:
            log.info("worker %s stopping: no new jobs; %d running", self.id, self._active)
        self._stopping = True
        self._stop_requested.set()
        self._wakeup.set()

    # -- claiming -----------------------------------------------------------------------

    async def _produce(self, store: Store) -> None:
        failures = 0
        while not self._stopping:
            # Clear before claiming, not after: a wake-up (a stop, a freed slot, a
            # notification) that arrives while the claim is in flight is not lost.
            self._wakeup.clear()
            # Leases held count too, up to one batch awaiting its settle beyond the
            # running ones: claiming while results wait would only grow the heartbeat
            # and the settle backlog when the database falls behind.
            free = min(
                self.options.concurrency - self._active,
                2 * self.options.concurrency - len(self._runs),
            )
            claimed: list[Job] = []
            if free > 0:
                try:
                    claimed = await store.claim(
                        worker_id=self.id,
                        queues=self.queues,
                        limit=free,
                        lease=self.options.lease,
                        limits=self._limits(),
                    )
                    if failures:
                        log.warning("database reachable again; claiming resumed")
                    failures = 0
                except ConfigurationError:  # retrying cannot fix a setting
                    raise
                except Exception as exc:  # the database may be restarting: back off, retry
                    failures += 1
                    if failures == 1:
                        log.error("cannot claim jobs (%s); retrying with backoff", exc)
                    await self._sleep(min(5.0, 0.1 * 2**failures) * (0.5 + random.random()))
                    continue
                for job in claimed:
                    self._start(job)
                if len(claimed) == free:
                    continue  # more may be due; claim again as soon as slots free
                idle = self._active == 0 and not self._outbox and not self._runs
                if not claimed and self.options.burst and idle:
                    return
            try:
                await asyncio.wait_for(self._wakeup.wait(), self.options.poll_interval)
            except TimeoutError:
                pass

    def _limits(self) -> Limits | None:
        """The flow control this claim must respect, or None when no type has any."""
        if not self._limited:
            return None
        running: dict[str, int] = {}
        for run in self.held():
            if not run.done:
                running[run.job.type] = running.get(run.job.type, 0) + 1
        local = {
            t.name: t.options.concurrency - running.get(t.name, 0)
            for t in self._limited
            if t.options.concurrency is not None
        }
        return Limits(
            local=local,
            cluster={
                t.name: t.options.global_concurrency
                for t in self._limited
                if t.options.global_concurrency is not None
            },
            per_key={
                t.name: t.options.key_concurrency
                for t in self._limited
                if t.options.key_concurrency is not None
            },
            rate={t.name: t.options.rate_limit for t in self._limited if t.options.rate_limit},
        )

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop_requested.wait(), seconds)
        except TimeoutError:
            pass

    async def _listen(self, store: Store) -> None:
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
                self._on_beat(frozenset(), cancelled)
            self._wakeup.set()

    # -- running ------------------------------------------------------------------------

    def _start(self, job: Job) -> None:
        run = _Run(job=job, lease=job.lease or self.options.lease)
        job_type = self.app.registry.find(job.type)
        # A process-isolated handler is awaited like an async one: cancelling its task
        # stops the child process.
        run.is_async = (
            job_type is None or job_type.is_async or job_type.options.isolation == "process"
        )
        with self._lock:
            self._runs[job.id] = run
        self._active += 1
        self._idle.clear()
        # Unnamed: naming a task costs more than a no-op job's handler; the job shows in
        # the task's coroutine (Worker._execute) and in every log line about it.
        run.task = asyncio.create_task(self._execute(run, job_type))

    async def _execute(self, run: _Run, job_type: JobType | None) -> None:
        loop = asyncio.get_running_loop()
        settlement: Settlement | None
        try:
            settlement = await self._invoke(run, job_type, loop)
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
            return  # abandoned: the job was already settled without this run's result
        if run.interrupt is not None:
            # However the handler ended, the interruption decides: a timed-out job that
            # swallowed its cancellation is not marked succeeded, a lost one not at all.
            settlement = self._interrupted(run)
        self._finish(run, settlement)

    async def _invoke(
        self, run: _Run, job_type: JobType | None, loop: asyncio.AbstractEventLoop
    ) -> Settlement | None:
        job = run.job
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
        ctx = run.ctx = JobContext(job, worker_id=self.id, port=_Port(self, run), loop=loop)
        if job.cancel_requested:
            self._interrupt(run, _Interrupt.CANCEL, job.error or "cancel requested")
        if job.timeout:
            run.timer = loop.call_later(
                job.timeout,
                self._interrupt,
                run,
                _Interrupt.TIMEOUT,
                f"timed out after {job.timeout:g}s",
            )
        try:
            if job_type.options.isolation == "process":
                result = await run_in_child(
                    job_type, job, ctx._port, cancel_grace=self.options.cancel_grace
                )
            elif run.is_async:
                result = await job_type.fn(ctx, **kwargs)
            else:
                future = loop.run_in_executor(self._pool, lambda: job_type.fn(ctx, **kwargs))
                result = await asyncio.shield(future)
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
        run: _Run,
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
        run: _Run,
        outcome: Outcome,
        error: str,
        *,
        tb: str | None = None,
        final: bool = False,
        retry_after: float | None = None,
    ) -> Settlement:
        job = run.job
        return after_failure(
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

    def _interrupted(self, run: _Run) -> Settlement | None:
        if run.interrupt is _Interrupt.CANCEL:
            # No error of its own: the job keeps the reason stored with the cancel request.
            return self._settlement(run, Event.CANCEL, Outcome.CANCELLED)
        if run.interrupt is _Interrupt.TIMEOUT:
            return self._failure(run, Outcome.TIMED_OUT, run.reason)
        if run.interrupt is _Interrupt.HAND_BACK:
            return self._settlement(run, Event.HAND_BACK, None)
        return None

    def _interrupt(self, run: _Run, kind: _Interrupt, reason: str) -> None:
        """Stop a run: cancel an async handler, flag a sync one, abandon it after a grace."""
        if run.done or (run.interrupt is not None and kind is not _Interrupt.LOST):
            return
        run.interrupt = kind
        run.reason = reason
        if run.ctx is not None:
            run.ctx._mark_cancelled(reason)
        # A sync handler's thread cannot be interrupted: it sees ctx.cancelled instead.
        if run.task is not None and (run.is_async or kind is _Interrupt.LOST):
            run.task.cancel()
        if kind is not _Interrupt.LOST and self._loop is not None:
            self._loop.call_later(self.options.cancel_grace, self._abandon, run)

    def _abandon(self, run: _Run) -> None:
        if run.done:
            return
        log.warning(
            "job %s ignored %s for %.1fs: abandoned",
            run.job.id,
            run.reason,
            self.options.cancel_grace,
        )
        self._finish(run, self._interrupted(run))

    def _finish(self, run: _Run, settlement: Settlement | None) -> None:
        run.done = True
        self._active -= 1
        self.processed += 1
        if settlement is None:
            self._release(run)
            log.warning("job %s: lease lost, result dropped", run.job.id)
        else:
            if self._progress:  # progress not yet written by a heartbeat goes with the result
                with self._lock:
                    progress = self._progress.pop(run.key, None)
                if progress is not None:
                    settlement = dataclasses.replace(settlement, progress=progress)
            self._outbox.append((run, settlement))
            self._settle_ready.set()
        if self._active == 0:
            self._idle.set()
        self._wakeup.set()

    def _release(self, run: _Run) -> None:
        self._release_all((run,))

    def _release_all(self, runs: Iterable[_Run]) -> None:
        with self._lock:
            held, progress = self._runs, self._progress
            for run in runs:
                if held.get(run.job.id) is run:
                    del held[run.job.id]
                if progress:
                    progress.pop(run.key, None)

    # -- settling -----------------------------------------------------------------------

    async def _settle_loop(self) -> None:
        store = self._store
        assert store is not None
        failures = 0
        while True:
            await self._settle_ready.wait()
            self._settle_ready.clear()
            batch, self._outbox = self._outbox, []
            if not batch:
                # Settle until the shutdown has drained: a claim still in flight when
                # the stop came may start jobs whose results must be recorded too.
                if self._gave_up or self._drained:
                    return
                continue
            try:
                refused = set(await store.settle([s for _, s in batch]))
                failures = 0
            except Exception as exc:
                if self._gave_up:
                    return
                failures += 1
                if failures == 1:
                    log.error("cannot record finished jobs (%s); retrying", exc)
                self._outbox[:0] = batch
                await asyncio.sleep(min(5.0, 0.1 * 2**failures) * (0.5 + random.random()))
                self._settle_ready.set()
                continue
            for job_id in refused:
                log.warning("job %s: lease lost before its result was recorded", job_id)
            self._release_all(run for run, _ in batch)
            self._wakeup.set()  # slots held by the batch are free for the producer
            if self._stopping:
                self._settle_ready.set()

    # -- shutting down ------------------------------------------------------------------

    async def _drain(self) -> None:
        if self._active:
            log.info("waiting up to %.1fs for %d running jobs", self.options.grace, self._active)
            try:
                await asyncio.wait_for(self._idle.wait(), self.options.grace)
            except TimeoutError:
                with self._lock:
                    running = [r for r in self._runs.values() if not r.done]
                log.warning("grace period over: handing back %d jobs", len(running))
                for run in running:
                    self._interrupt(run, _Interrupt.HAND_BACK, "worker shutting down")
                await self._idle.wait()
        # Results wait for the database at most a lease: past that their leases have
        # expired anyway, and other workers rescue and rerun those jobs.
        deadline = asyncio.get_running_loop().time() + max(self.options.lease, 5.0)
        while self._outbox or self._runs_pending_settle():
            if asyncio.get_running_loop().time() > deadline:
                log.error(
                    "could not record %d finished jobs before stopping; they will run again "
                    "once their leases expire",
                    len(self._outbox),
                )
                self._outbox.clear()
                self._gave_up = True
                break
            self._settle_ready.set()
            await asyncio.sleep(0.01)

    def _runs_pending_settle(self) -> bool:
        with self._lock:
            return any(r.done for r in self._runs.values())

    # -- heartbeat hooks (called on the loop) -------------------------------------------

    def _on_beat(self, lost: frozenset[str], cancel: frozenset[str]) -> None:
        with self._lock:
            runs = dict(self._runs)
        for job_id in lost:
            run = runs.get(job_id)
            if run is not None and not run.done:
                log.warning("job %s: lease lost; stopping its handler", job_id)
                self._interrupt(run, _Interrupt.LOST, "lease lost")
                self._finish(run, None)
        for job_id in cancel:
            run = runs.get(job_id)
            if run is not None and not run.done:
                self._interrupt(run, _Interrupt.CANCEL, run.job.error or "cancel requested")

    def held(self) -> list[_Run]:
        with self._lock:
            return list(self._runs.values())

    def take_progress(self) -> dict[Lease, Progress]:
        with self._lock:
            taken, self._progress = self._progress, {}
            return taken


class _Port:
    """A running job's way to the worker and the store; every write carries its lease."""

    def __init__(self, worker: Worker, run: _Run) -> None:
        self.worker = worker
        self.run = run

    def report_progress(self, progress: Progress) -> None:
        with self.worker._lock:
            self.worker._progress[self.run.key] = progress

    async def save_state(self, state: JSON) -> bool:
        json.dumps(state, allow_nan=False)
        store = self.worker._store
        if store is None or self.run.interrupt is _Interrupt.LOST:
            return False
        return await store.checkpoint(self.run.key, state)

    async def spawn(self, submissions: Sequence[Submission]) -> list[JobHandle] | None:
        app = self.worker.app
        store = self.worker._store
        if store is None or self.run.interrupt is _Interrupt.LOST:
            return None
        jobs = app.prepare(submissions)
        # Children belong to their parent's tenant, so that the API shows a tenant its trees.
        tenant = self.run.job.tenant
        if tenant is not None:
            jobs = [j if j.tenant else dataclasses.replace(j, tenant=tenant) for j in jobs]
        spawned = await store.spawn(self.run.key, jobs)
        if spawned is None:
            return None
        return app.handles(jobs, spawned)

    async def dependency_results(self) -> dict[str, JSON]:
        store = self.worker._store
        depends_on = self.run.job.depends_on
        if store is None or not depends_on:
            return {}
        return {j.id: j.result for j in await store.get_many(depends_on)}


class _Heartbeat(threading.Thread):
    """Renews the worker's leases from a thread of its own, with its own connection."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name="conveyor-heartbeat", daemon=True)
        self.worker = worker
        self._stop_event = threading.Event()
        self.interval = worker.options.lease / 3
        self.progress_interval = min(1.0, self.interval)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        store = self.worker.app.new_store()
        try:
            loop.run_until_complete(store.open())
        except Exception as exc:
            log.error("heartbeat cannot open the database: %s", exc)
            loop.close()
            return
        try:
            self._beat_forever(loop, store)
        finally:
            loop.run_until_complete(store.close())
            loop.close()

    def _beat_forever(self, loop: asyncio.AbstractEventLoop, store: Store) -> None:
        worker = self.worker
        last_beat = time.monotonic()
        last_progress = 0.0
        failures = 0
        tick = min(0.25, self.interval / 2)
        while not self._stop_event.wait(tick):
            now = time.monotonic()
            runs = worker.held()
            interval = min([r.lease / 3 for r in runs] + [self.interval])
            progress_due = bool(worker._progress) and now - last_progress >= self.progress_interval
            if now - last_beat < interval and not progress_due:
                self._fence(runs, now)
                continue
            progress = worker.take_progress()
            started = time.monotonic()
            try:
                beat = loop.run_until_complete(
                    store.heartbeat(
                        worker_id=worker.id,
                        leases=[r.key for r in runs],
                        lease=worker.options.lease,
                        progress=progress,
                    )
                )
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.error("heartbeat failed (%s); retrying until leases run out", exc)
                with worker._lock:
                    for key, value in progress.items():
                        worker._progress.setdefault(key, value)
                self._fence(runs, time.monotonic())
                continue
            if failures:
                log.warning("heartbeat reaches the database again")
            failures = 0
            last_beat = started
            if progress:
                last_progress = started
            for run in runs:
                if run.job.id not in beat.lost:
                    run.renewed_at = started
            if (beat.lost or beat.cancel_requested) and worker._loop is not None:
                try:
                    worker._loop.call_soon_threadsafe(
                        worker._on_beat, beat.lost, beat.cancel_requested
                    )
                except RuntimeError:
                    return

    def _fence(self, runs: list[_Run], now: float) -> None:
        """Stop runs whose lease may have expired: better stop early than run twice."""
        expired = frozenset(
            r.job.id
            for r in runs
            if not r.done and now - r.renewed_at > r.lease - min(r.lease / 6, 2.0)
        )
        if expired and self.worker._loop is not None:
            try:
                self.worker._loop.call_soon_threadsafe(self.worker._on_beat, expired, frozenset())
            except RuntimeError:
                pass


def run_worker(app: WorkerHost, options: WorkerOptions) -> None:
    """Run a worker in this thread until it stops (a convenience for scripts)."""
    asyncio.run(Worker(app, options).run())


__all__ = ["Worker", "WorkerOptions", "run_worker"]
