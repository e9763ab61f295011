"""The worker: claims jobs, runs their handlers, and reports how each attempt ended.

A worker has ``concurrency`` slots. It claims as many due jobs as it has free slots in
one round trip, runs async handlers on its event loop and sync handlers in a thread
pool, and settles finished attempts in batches: while one settle is in flight, the next
ones gather, so a busy worker writes many results per transaction and an idle one
writes at once.

Leases are renewed by a heartbeat thread with its own database connection, all of the
worker's leases in one statement, every lease/3. A handler that holds the event loop
(CPU-bound code in an async handler) therefore cannot make the worker lose its leases,
and the renewal never waits for a row another transaction has locked (the worker's own
settle, held open while its loop is blocked, among them). A lease counts from the moment
its claim or renewal was sent, so the worker stops a run before the database could let
another worker take it. When a lease is lost (another worker rescued the job, or the
heartbeat could not reach the database before the lease ran out), the local run is
cancelled and its result is dropped: only the holder of the current fencing token can
complete a job. A worker never runs two attempts of one job: when it claims a job it
already runs (the job was rescued from it), the older run is dropped as lost.

Claimed jobs reach the heartbeat before the event loop: the store calls the worker back
on the thread that completes the claim, where their leases are held (and renewed from
then on) however long a handler blocks the loop. The loop starts their handlers later,
and never on a lease it cannot show is current: one that may have expired is handed back
unstarted (fenced: refused if another worker rescued the job meanwhile), one older than
lease/3 waits for the heartbeat's renewal first.

On SIGTERM or SIGINT the worker stops claiming, gives running handlers ``grace``
seconds, then cancels them and hands their jobs back as ``queued`` without spending an
attempt. A handler that ignores cancellation for ``cancel_grace`` seconds is abandoned;
a sync handler abandoned so keeps its thread, but not a slot: the next sync job gets a
thread of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import functools
import json
import logging
import os
import queue
import random
import socket
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

from conveyor import _tracing
from conveyor._isolation import ChildFailed, run_in_child
from conveyor.context import Cancel, JobContext, Retry
from conveyor.core.flow import TenantLimit
from conveyor.core.lifecycle import Event, Status, transition
from conveyor.core.model import (
    JSON,
    Job,
    NewJob,
    Outcome,
    Progress,
    Settlement,
    after_failure,
)
from conveyor.core.retry import pause_after_failures
from conveyor.errors import ConfigurationError, ConveyorError
from conveyor.hooks import AttemptEnded, AttemptStarted
from conveyor.logs import JobLines, direct_handler, job_fields
from conveyor.maintenance import CronFirer, ParentFinisher, Pruner, Rescuer, every, on_the_clock
from conveyor.metrics import Metrics, TypeMetrics
from conveyor.store import Beat, Lease, Limits, Retention, Store, WorkerInfo

if TYPE_CHECKING:
    from conveyor._handles import JobHandle, Submission
    from conveyor._host import WorkerHost
    from conveyor._registry import JobType

log = logging.getLogger("conveyor.worker")

# How long a process-isolated handler's child may take to start (interpreter, imports)
# before the job's own time limit begins; it is added to that limit until the child
# reports in. Generous, because a loaded machine can take seconds to start Python.
_CHILD_START_ALLOWANCE = 60.0

# Results that are JSON as they are: no need to serialise them to find out.
_PLAIN = frozenset({str, int, bool})


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs, validated when built."""

    # Jobs at once, and the most claimed in one round trip: 100 keeps a worker of short
    # jobs from waiting on round trips (10 drained at half the rate on PostgreSQL).
    concurrency: int = 100
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
    # Whether this worker fires due schedule ticks (False: a JobTester's, whose ticks fire
    # only when the test moves time with advance()).
    fire_schedules: bool = True
    worker_id: str | None = None
    # Count attempts into the application's metrics (off only to measure what they cost).
    metrics: bool = True

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


class _Phase(IntEnum):
    """How far the worker's shutdown has gone; it only ever moves forward."""

    RUNNING = 0  # claiming
    STOPPING = 1  # no new claims; running handlers finish, or are handed back after grace
    DRAINED = 2  # no handler runs: the settle loop ends once the results are recorded
    GAVE_UP = 3  # results the database would not take were dropped: the settle loop ends


@dataclass(eq=False, slots=True)
class _Run:
    job: Job
    lease: float
    # When the claim that leased the job was sent: the lease counts from no earlier.
    renewed_at: float
    ctx: JobContext | None = None
    task: asyncio.Task[None] | None = None
    is_async: bool = True
    interrupt: _Interrupt | None = None
    reason: str = ""
    done: bool = False  # the slot was released (finished or abandoned)
    timer: asyncio.TimerHandle | None = None
    began: float = 0.0  # perf_counter at the start of the attempt
    elapsed: float = 0.0  # the handler's run time, once finished
    metrics: TypeMetrics | None = None

    def fields(self, worker_id: str) -> dict[str, Any]:
        job = self.job
        return job_fields(job.id, job.type, job.queue, job.attempt, worker_id)

    @property
    def key(self) -> Lease:
        return Lease(self.job.id, self.job.lease_token)


class _Leases:
    """The leases a worker holds, their buffered progress, and the lock over both.

    A lease is held from its claim until its result is settled (or it is found lost), so
    it is renewed while the run is running and while the result waits to be recorded.
    The event loop, handler threads (reporting progress) and the heartbeat thread share
    this object; nothing else touches the runs or the progress.
    """

    def __init__(self, lease: float) -> None:
        self.lease = lease  # the worker's, for jobs whose type sets none
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        self._progress: dict[Lease, Progress] = {}
        # Runs claimed and held (renewed by the heartbeat) whose handlers the event loop
        # has not started yet, each with the older run of its job it replaces, if any.
        self._claimed: collections.deque[tuple[_Run, _Run | None]] = collections.deque()

    def __len__(self) -> int:
        return len(self._runs)

    def hold(self, run: _Run) -> _Run | None:
        """Hold ``run``'s lease; return the run of the same job held until now, if any."""
        with self._lock:
            previous = self._runs.get(run.job.id)
            self._runs[run.job.id] = run
            return previous

    def hold_claimed(self, jobs: Sequence[Job], sent: float) -> None:
        """Hold the leases of jobs just claimed, until the loop starts them (any thread)."""
        for job in jobs:
            run = _Run(job=job, lease=job.lease or self.lease, renewed_at=sent)
            self._claimed.append((run, self.hold(run)))

    def take_claimed(self) -> list[tuple[_Run, _Run | None]]:
        """The runs held since last called, each with the older run of its job, if any."""
        taken: list[tuple[_Run, _Run | None]] = []
        while self._claimed:
            taken.append(self._claimed.popleft())
        return taken

    def release(self, runs: Iterable[_Run]) -> None:
        """Forget these runs (not a newer run of the same job) and their progress."""
        with self._lock:
            held, progress = self._runs, self._progress
            for run in runs:
                if held.get(run.job.id) is run:
                    del held[run.job.id]
                if progress:
                    progress.pop(run.key, None)

    def snapshot(self) -> list[_Run]:
        """The runs held now, running or awaiting their settle."""
        with self._lock:
            return list(self._runs.values())

    def find(self, job_ids: Iterable[str]) -> list[_Run]:
        """The runs held now of these jobs."""
        with self._lock:
            return [r for r in map(self._runs.get, job_ids) if r is not None]

    def awaiting_settle(self) -> bool:
        with self._lock:
            return any(r.done for r in self._runs.values())

    def report_progress(self, key: Lease, progress: Progress) -> None:
        with self._lock:
            self._progress[key] = progress

    def has_progress(self) -> bool:
        return bool(self._progress)

    def pop_progress(self, key: Lease) -> Progress | None:
        """Take one run's buffered progress (it then goes with the run's result)."""
        if not self._progress:
            return None
        with self._lock:
            return self._progress.pop(key, None)

    def take_progress(self) -> dict[Lease, Progress]:
        """Take all buffered progress, for the heartbeat to write."""
        with self._lock:
            taken, self._progress = self._progress, {}
            return taken

    def restore_progress(self, progress: Mapping[Lease, Progress]) -> None:
        """Put back progress a heartbeat could not write; newer reports win."""
        with self._lock:
            for key, value in progress.items():
                run = self._runs.get(key.job_id)
                if run is not None and run.key == key:
                    self._progress.setdefault(key, value)


class _HandlerThreads:
    """Threads for sync handlers: an idle one is reused, or else a new one is started.

    A thread is never shared while busy, so a handler abandoned past its cancel grace,
    whose thread cannot be stopped, delays no other job: the job that takes its slot
    gets another thread at once. At most ``keep`` idle threads are kept.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0
        self._closed = False

    def submit(self, work: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker's handler threads are shut down")
            start = self._idle == 0
            if start:
                self._started += 1
                number = self._started
            else:
                self._idle -= 1  # one idle thread is now spoken for
        self._work.put(work)
        if start:
            threading.Thread(
                target=self._serve, name=f"conveyor-handler-{number}", daemon=True
            ).start()

    def _serve(self) -> None:
        while True:
            work = self._work.get()
            if work is None:
                return
            work()
            with self._lock:
                if self._closed or self._idle >= self._keep:
                    return
                self._idle += 1

    def shutdown(self) -> None:
        """Stop the idle threads; busy ones end when their handler returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, 0
        for _ in range(idle):
            self._work.put(None)


class Worker:
    """Claims and runs jobs for one application until stopped (or, in burst mode, idle)."""

    def __init__(self, app: WorkerHost, options: WorkerOptions) -> None:
        self.app = app
        self.options = options
        self.id = options.worker_id or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self.queues = options.queues or tuple(app.registry.queues())
        self.leases = _Leases(options.lease)
        self._active = 0
        self._outbox: list[tuple[_Run, Settlement]] = []
        self._phase = _Phase.RUNNING
        # Events bind to the loop of run() when first awaited (Python 3.10 and later).
        self._wakeup = asyncio.Event()  # claim again: a slot freed, a job is due, a stop
        self._settle_ready = asyncio.Event()
        self._idle = asyncio.Event()  # no handler runs
        self._stop_requested = asyncio.Event()
        self._maintenance_stop = asyncio.Event()
        self._store: Store | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = _HandlerThreads(keep=options.concurrency)
        self.processed = 0
        self._metrics: Metrics | None = app.metrics if options.metrics else None
        self._hooks = app.hooks
        self._traced = False  # whether attempts get spans (asked once per claim)
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
        loop = self._loop = asyncio.get_running_loop()
        store = self._store = self.app.new_store()
        await store.open()
        await store.register_worker(
            WorkerInfo(
                id=self.id,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                queues=self.queues,
                concurrency=self.options.concurrency,
                lease=self.options.lease,
                heartbeat_interval=self.options.lease / 3,
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
        heartbeat = _Heartbeat(
            worker_id=self.id,
            lease=self.options.lease,
            leases=self.leases,
            new_store=self.app.new_store,
            loop=loop,
            on_lost=self._on_lost,
            on_cancel_requested=self._on_cancel_requested,
            metrics=self._metrics,
        )
        heartbeat.start()
        tasks = [
            asyncio.create_task(self._settle_loop(store), name="conveyor-settle"),
            asyncio.create_task(self._listen(store), name="conveyor-listen"),
            *self._start_duties(store),
        ]
        try:
            await self._produce(store)
            await self._drain()
        finally:
            self._advance(_Phase.DRAINED)
            self._maintenance_stop.set()
            tasks[1].cancel()  # the listener
            self._settle_ready.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            heartbeat.stop()
            await loop.run_in_executor(None, heartbeat.join)
            try:
                await store.deregister_worker(self.id)
            except Exception as exc:
                log.warning("could not record worker %s as stopped: %s", self.id, exc)
            await store.close()
            self._threads.shutdown()
            log.info("worker %s stopped after %d jobs", self.id, self.processed)

    def _start_duties(self, store: Store) -> list[asyncio.Task[None]]:
        """Start the maintenance duties every worker runs (each is safe to run on all)."""
        options, stop = self.options, self._maintenance_stop
        duties = (
            ("conveyor-rescue", options.rescue_interval, Rescuer(store, metrics=self._metrics)),
            ("conveyor-finish-parents", options.rescue_interval, ParentFinisher(store)),
            (
                "conveyor-prune",
                options.prune_interval,
                Pruner(store, self.app.retention(options.retention)),
            ),
        )
        tasks = [
            asyncio.create_task(every(interval, duty, stop), name=name)
            for name, interval, duty in duties
        ]
        if options.fire_schedules:
            # Cron keeps to the wall clock: it sleeps to the next tick, not a fixed interval.
            cron = on_the_clock(CronFirer(store, interval=options.cron_interval), stop)
            tasks.append(asyncio.create_task(cron, name="conveyor-cron"))
        return tasks

    def stop(self) -> None:
        """Ask the worker to stop claiming and shut down gracefully (thread-safe)."""
        loop = self._loop
        if loop is None:
            self._advance(_Phase.STOPPING)
        elif loop.is_running():
            loop.call_soon_threadsafe(self._request_stop)

    def held(self) -> list[_Run]:
        """The runs whose leases this worker holds now: running or awaiting their settle."""
        return self.leases.snapshot()

    def _advance(self, phase: _Phase) -> None:
        self._phase = max(self._phase, phase)

    def _request_stop(self) -> None:
        if self._phase is _Phase.RUNNING:
            log.info("worker %s stopping: no new jobs; %d running", self.id, self._active)
        self._advance(_Phase.STOPPING)
        self._stop_requested.set()
        self._wakeup.set()

    # -- claiming -----------------------------------------------------------------------

    async def _produce(self, store: Store) -> None:
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
                self._on_cancel_requested(cancelled)
            self._wakeup.set()

    # -- running ------------------------------------------------------------------------

    def _start_claimed(self) -> None:
        """Start the handlers of the runs claimed since last called (on the loop)."""
        store = self._store
        # Once per claim, not per job: asking opentelemetry costs an environment lookup.
        self._traced = _tracing.enabled()
        if store is not None:
            for run, previous in self.leases.take_claimed():
                self._start(store, run, previous)

    def _start(self, store: Store, run: _Run, previous: _Run | None) -> None:
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
        stale = _may_have_expired(run, time.monotonic())
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

    def _started(self, run: _Run) -> None:
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

    async def _execute(self, run: _Run, job_type: JobType | None, store: Store) -> None:
        if not self._traced:
            await self._attempt(run, job_type, store)
            return
        with _tracing.attempt_span(run.job, self.id) as span:
            settlement = await self._attempt(run, job_type, store)
            if settlement is None:
                _tracing.end_attempt(span, "lost", None)
            else:
                outcome = None if settlement.outcome is None else settlement.outcome.value
                _tracing.end_attempt(span, outcome, settlement.error)

    async def _attempt(
        self, run: _Run, job_type: JobType | None, store: Store
    ) -> Settlement | None:
        """Run one attempt to its end; return its settlement (None: abandoned or lost)."""
        settlement: Settlement | None
        try:
            if not await _lease_current(run):
                if not run.done:
                    log.warning("job %s: lease not renewed in time; not started", run.job.id)
                    self._finish(run, None)
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

    async def _invoke(self, run: _Run, job_type: JobType | None, store: Store) -> Settlement | None:
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
        port = _Port(run, self.leases, store, self.app)
        ctx = run.ctx = JobContext(job, worker_id=self.id, port=port, loop=loop)
        if job.cancel_requested:
            self._interrupt(run, _Interrupt.CANCEL, job.error or "cancel requested")
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
                called = _in_thread(self._threads, loop, job_type.fn, ctx, kwargs, self._traced)
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

    def _arm_timeout(self, run: _Run, after: float | None = None) -> None:
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
            _Interrupt.TIMEOUT,
            f"timed out after {timeout:g}s",
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
        if kind is not _Interrupt.LOST:
            asyncio.get_running_loop().call_later(self.options.cancel_grace, self._abandon, run)

    def _abandon(self, run: _Run) -> None:
        if run.done:
            return
        log.warning(
            "job %s ignored %s for %.1fs: abandoned",
            run.job.id,
            run.reason,
            self.options.cancel_grace,
        )
        settlement = self._interrupted(run)
        if settlement is not None and run.interrupt is _Interrupt.HAND_BACK:
            # Its handler is still running, until this process exits: the job goes back
            # to the queue runnable only once its lease would have run out, as after a
            # crash, so that no other worker starts it alongside (no attempt is spent).
            left = run.lease - (time.monotonic() - run.renewed_at)
            settlement = dataclasses.replace(settlement, retry_delay=max(0.0, left))
        self._finish(run, settlement)

    def _finish(self, run: _Run, settlement: Settlement | None) -> None:
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
            progress = self.leases.pop_progress(run.key)
            if progress is not None:
                settlement = dataclasses.replace(settlement, progress=progress)
            self._outbox.append((run, settlement))
            self._settle_ready.set()
        if self._active == 0:
            self._idle.set()
        self._wakeup.set()

    def _lose(self, run: _Run) -> None:
        """Stop a run whose lease is gone and drop its result."""
        self._interrupt(run, _Interrupt.LOST, "lease lost")
        self._finish(run, None)

    # -- settling -----------------------------------------------------------------------

    async def _settle_loop(self, store: Store) -> None:
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

    def _recorded(self, run: _Run, s: Settlement, lines: JobLines | None) -> None:
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

    def _lost(self, run: _Run, why: str = "lease lost; its result is dropped") -> None:
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
                    self._interrupt(run, _Interrupt.HAND_BACK, "worker shutting down")
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

    # -- heartbeat hooks (called on the loop) -------------------------------------------

    def _on_lost(self, runs: Iterable[_Run]) -> None:
        """Stop runs whose leases the heartbeat could not renew (or may have expired)."""
        self._start_claimed()  # every run the heartbeat knows of is started first
        for run in runs:
            if not run.done:
                self._lose(run)

    def _on_cancel_requested(self, job_ids: Iterable[str]) -> None:
        self._start_claimed()
        for run in self.leases.find(job_ids):
            if not run.done:
                self._interrupt(run, _Interrupt.CANCEL, run.job.error or "cancel requested")


def _outcome_line(run: _Run, s: Settlement, retry_at: datetime | None) -> str:
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
    store: Store, batch: Sequence[tuple[_Run, Settlement]], refused: set[str]
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


class _Port:
    """A running job's way to the worker and the store; every write carries its lease."""

    def __init__(self, run: _Run, leases: _Leases, store: Store, app: WorkerHost) -> None:
        self.run = run
        self.leases = leases
        self.store = store
        self.app = app

    def report_progress(self, progress: Progress) -> None:
        self.leases.report_progress(self.run.key, progress)

    async def save_state(self, state: JSON) -> bool:
        json.dumps(state, allow_nan=False)
        if self.run.interrupt is _Interrupt.LOST:
            return False
        return await self.store.checkpoint(self.run.key, state)

    async def spawn(
        self,
        submissions: Sequence[Submission],
        callbacks: Mapping[str, Submission] | None = None,
    ) -> list[JobHandle] | None:
        if self.run.interrupt is _Interrupt.LOST:
            return None
        # Children belong to their parent's tenant, so that the API shows a tenant its
        # trees, and were submitted by whoever submitted it; the tenant is set before
        # prepare, so that their ids are qualified in that tenant's namespace.
        tenant = self.run.job.tenant
        if tenant is not None:
            submissions = [
                s if s.tenant else dataclasses.replace(s, tenant=tenant) for s in submissions
            ]
            callbacks = {
                kind: c if c.tenant else dataclasses.replace(c, tenant=tenant)
                for kind, c in (callbacks or {}).items()
            }
        jobs = [self._inherit(j) for j in self.app.prepare(submissions)]
        from conveyor._host import prepare_callback  # only handlers that spawn need it

        later = {
            kind: self._inherit(prepare_callback(self.app, c))
            for kind, c in (callbacks or {}).items()
        }
        spawned = await self.store.spawn(self.run.key, jobs, later)
        if spawned is None:
            return None
        return self.app.handles(jobs, spawned)

    def _inherit(self, job: NewJob) -> NewJob:
        parent = self.run.job
        return dataclasses.replace(
            job, tenant=job.tenant or parent.tenant, submitted_by=parent.submitted_by
        )

    async def dependency_results(self) -> dict[str, JSON]:
        depends_on = self.run.job.depends_on
        if not depends_on:
            return {}
        return {j.id: j.result for j in await self.store.get_many(depends_on)}


class _Heartbeat(threading.Thread):
    """Renews the worker's leases from a thread of its own, with its own connection.

    A beat is due every lease/3, and at once when a run's lease was last renewed (or
    claimed) longer ago than that: a claim that waited long for the database comes back
    with a lease counted from when it was sent. Between beats, a run whose lease may have
    expired is stopped: better stop early than run twice.
    """

    def __init__(
        self,
        *,
        worker_id: str,
        lease: float,
        leases: _Leases,
        new_store: Callable[[], Store],
        loop: asyncio.AbstractEventLoop,
        on_lost: Callable[[list[_Run]], None],
        on_cancel_requested: Callable[[frozenset[str]], None],
        metrics: Metrics | None = None,
    ) -> None:
        super().__init__(name="conveyor-heartbeat", daemon=True)
        self.latency = None if metrics is None else metrics.heartbeat_seconds
        self.worker_id = worker_id
        self.lease = lease
        self.leases = leases
        self.new_store = new_store  # its own store: its own connection
        self.loop = loop  # the worker's: what the beat learns is handed to it there
        self.on_lost = on_lost
        self.on_cancel_requested = on_cancel_requested
        self._stop_event = threading.Event()
        self.interval = self.lease / 3
        self.progress_interval = min(1.0, self.interval)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        store = self.new_store()
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
        last_beat = time.monotonic()
        last_progress = 0.0
        failures = 0
        tick = min(0.25, self.interval / 2)
        wait = tick
        while not self._stop_event.wait(wait):
            now = time.monotonic()
            runs = self.leases.snapshot()
            wait = _until_fence(runs, now, tick)
            interval = min([r.lease / 3 for r in runs] + [self.interval])
            stale = any(now - r.renewed_at >= r.lease / 3 for r in runs if not r.done)
            progress_due = (
                self.leases.has_progress() and now - last_progress >= self.progress_interval
            )
            if now - last_beat < interval and not stale and not progress_due:
                self._fence(runs, now)
                continue
            progress = self.leases.take_progress()
            started = time.monotonic()
            try:
                beat = self._send_beat(
                    loop,
                    store.heartbeat(
                        worker_id=self.worker_id,
                        leases=[r.key for r in runs],
                        lease=self.lease,
                        progress=progress,
                    ),
                    tick,
                )
            except Exception as exc:
                failures += 1
                if failures == 1:
                    log.error("heartbeat failed (%s); retrying until leases run out", exc)
                self.leases.restore_progress(progress)
                self._fence(runs, time.monotonic())
                continue
            if self.latency is not None:
                self.latency.observe(time.monotonic() - started)
            if failures:
                log.warning("heartbeat reaches the database again")
            failures = 0
            last_beat = started
            if progress:
                last_progress = started
            if not self._beaten(runs, beat, progress, started):
                return

    def _send_beat(
        self, loop: asyncio.AbstractEventLoop, beat: Coroutine[Any, Any, Beat], tick: float
    ) -> Beat:
        """Wait for a beat's answer, stopping runs whose leases may run out meanwhile: a
        database that is slow to answer (its write lock held by other processes, a
        restart) must not keep this thread from fencing."""
        task = loop.create_task(beat)
        wait = _until_fence(self.leases.snapshot(), time.monotonic(), tick)
        while True:
            loop.run_until_complete(asyncio.wait((task,), timeout=wait))
            if task.done():
                return task.result()
            runs, now = self.leases.snapshot(), time.monotonic()
            self._fence(runs, now)
            wait = _until_fence(runs, now, tick)

    def _beaten(
        self, runs: list[_Run], beat: Beat, progress: Mapping[Lease, Progress], started: float
    ) -> bool:
        """Take in what a beat learned; False once the worker's loop has closed."""
        if beat.busy:
            # Rows another transaction holds (a settle, a rescue) were neither renewed
            # nor found lost; their progress waits for the next beat.
            self.leases.restore_progress(
                {k: p for k, p in progress.items() if k.job_id in beat.busy}
            )
        lost = [r for r in runs if r.job.id in beat.lost]
        for run in runs:
            if run.job.id not in beat.lost and run.job.id not in beat.busy:
                run.renewed_at = started
        try:
            if lost:
                self.loop.call_soon_threadsafe(self.on_lost, lost)
            if beat.cancel_requested:
                self.loop.call_soon_threadsafe(self.on_cancel_requested, beat.cancel_requested)
        except RuntimeError:
            return False
        return True

    def _fence(self, runs: list[_Run], now: float) -> None:
        """Stop runs whose lease may have expired: better stop early than run twice."""
        expired = [r for r in runs if not r.done and _may_have_expired(r, now)]
        if expired:
            try:
                self.loop.call_soon_threadsafe(self.on_lost, expired)
            except RuntimeError:
                pass


def _limits(
    limited: Sequence[JobType], held: Iterable[_Run], tenants: Mapping[str, TenantLimit]
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


def _in_thread(
    threads: _HandlerThreads,
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Any],
    ctx: JobContext,
    kwargs: dict[str, Any],
    traced: bool,
) -> asyncio.Future[Any]:
    """Call a sync handler on a thread of its own; the future gets its outcome."""
    future: asyncio.Future[Any] = loop.create_future()

    def deliver(result: Any, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def call() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(ctx, **kwargs), None)
        except BaseException as exc:
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(deliver, *outcome)
        except RuntimeError:
            pass  # the loop is closed: an abandoned handler outlived its worker

    # A traced attempt's span is current in the handler's thread too.
    if traced:
        threads.submit(functools.partial(contextvars.copy_context().run, call))
    else:
        threads.submit(call)
    return future


async def _lease_current(run: _Run) -> bool:
    """Wait until ``run``'s lease is known current: False when it may have expired.

    A lease older than lease/3 (the loop was slow to start the run) is renewed by
    the heartbeat at once; the handler waits for that renewal rather than start on
    a lease another worker may be about to rescue.
    """
    while True:
        now = time.monotonic()
        if run.interrupt is _Interrupt.LOST or _may_have_expired(run, now):
            return False
        if now - run.renewed_at < run.lease / 3:
            return True
        await asyncio.sleep(0.01)


def _fence_at(run: _Run) -> float:
    """When (monotonic) ``run``'s lease may run out, with a margin: the run stops then."""
    return run.renewed_at + run.lease - min(run.lease / 6, 2.0)


def _until_fence(runs: Iterable[_Run], now: float, tick: float) -> float:
    """How long the heartbeat may wait: a tick, or less when a run must stop sooner (a
    tick late would eat the margin its handler has to stop before its lease runs out)."""
    fences = [f for f in (_fence_at(r) - now for r in runs if not r.done) if f > 0]
    return max(0.005, min([tick, *fences]))


def _may_have_expired(run: _Run, now: float) -> bool:
    """Whether ``run``'s lease may have run out by ``now`` (monotonic), with a margin."""
    return now > _fence_at(run)


def run_worker(app: WorkerHost, options: WorkerOptions) -> None:
    """Run a worker in this thread until it stops (a convenience for scripts)."""
    asyncio.run(Worker(app, options).run())


__all__ = ["Worker", "WorkerOptions", "run_worker"]
