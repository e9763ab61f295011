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
import dataclasses
import os
import socket
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from conveyor.core.lifecycle import Event
from conveyor.core.model import Settlement
from conveyor.observe.metrics import Metrics
from conveyor.store import Store, WorkerInfo
from conveyor.worker._base import _Phase, log
from conveyor.worker._completer import Completer
from conveyor.worker._executor import Executor
from conveyor.worker._heartbeat import Heartbeat
from conveyor.worker._leases import Interrupt, Leases, Run
from conveyor.worker._maintenance import (
    CronFirer,
    ParentFinisher,
    Pruner,
    Rescuer,
    WorkerForgetter,
    every,
    on_the_clock,
)
from conveyor.worker._producer import Producer
from conveyor.worker._threads import HandlerThreads
from conveyor.worker.options import WorkerOptions

if TYPE_CHECKING:
    from conveyor.worker._host import WorkerHost


class Worker(Producer, Executor, Completer):
    """Claims and runs jobs for one application until stopped (or, in burst mode, idle)."""

    def __init__(self, app: WorkerHost, options: WorkerOptions) -> None:
        self.app = app
        self.options = options
        self.id = options.worker_id or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self.queues = options.queues or tuple(app.registry.queues())
        # The only types it claims: during a rolling deploy, a type that only newer code
        # knows waits for a worker that has its handler, its attempts unspent.
        self.types = tuple(app.registry.names())
        self.leases = Leases(options.lease)
        self._active = 0
        self._outbox: list[tuple[Run, Settlement]] = []
        self._phase = _Phase.RUNNING
        # Events bind to the loop of run() when first awaited (Python 3.10 and later).
        self._wakeup = asyncio.Event()  # claim again: a slot freed, a job is due, a stop
        self._settle_ready = asyncio.Event()
        self._idle = asyncio.Event()  # no handler runs
        self._stop_requested = asyncio.Event()
        self._maintenance_stop = asyncio.Event()
        self._store: Store | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads = HandlerThreads(keep=options.concurrency)
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
                types=self.types,
                forget_after=self.options.forget_after,
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
        heartbeat = Heartbeat(
            worker_id=self.id,
            lease=self.options.lease,
            leases=self.leases,
            new_store=self.app.new_store,
            loop=loop,
            on_lost=self._on_lost,
            on_fenced=self._on_fenced,
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
            ("conveyor-forget-workers", options.prune_interval, WorkerForgetter(store)),
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

    def held(self) -> list[Run]:
        """The runs whose leases this worker holds now: running or awaiting their settle."""
        return self.leases.snapshot()

    def _request_stop(self) -> None:
        if self._phase is _Phase.RUNNING:
            log.info("worker %s stopping: no new jobs; %d running", self.id, self._active)
        self._advance(_Phase.STOPPING)
        self._stop_requested.set()
        self._wakeup.set()

    # -- heartbeat hooks (called on the loop) -------------------------------------------

    def _on_lost(self, runs: Iterable[Run]) -> None:
        """Stop runs whose leases the heartbeat could not renew (or may have expired)."""
        self._start_claimed()  # every run the heartbeat knows of is started first
        for run in runs:
            if not run.done:
                self._lose(run)

    def _on_fenced(self, runs: Iterable[Run]) -> None:
        """Stop runs whose leases may run out before the heartbeat can renew them (the
        database does not answer: a partition, a failover) and hand their jobs back.

        Nothing says the job was taken from this worker, so unlike a lost lease this costs
        no attempt: the hand-back is fenced by the lease token like any settle, so it is
        refused if the job was rescued meanwhile, and it makes the job runnable only once
        the lease would have run out, so no other worker starts it while a stopping
        handler may still be running.
        """
        self._start_claimed()
        now = time.monotonic()
        for run in runs:
            if run.done:
                continue
            log.warning(
                "job %s: lease not renewed in time (the database did not answer); "
                "stopped, and handed back once the database answers",
                run.job.id,
            )
            self._interrupt(run, Interrupt.LOST, "lease not renewed in time")
            settlement = self._settlement(run, Event.HAND_BACK, None)
            left = max(0.0, run.lease - (now - run.renewed_at))
            self._finish(run, dataclasses.replace(settlement, retry_delay=left))

    def _on_cancel_requested(self, job_ids: Iterable[str]) -> None:
        self._start_claimed()
        for run in self.leases.find(job_ids):
            if not run.done:
                self._interrupt(run, Interrupt.CANCEL, run.job.error or "cancel requested")


def run_worker(app: WorkerHost, options: WorkerOptions) -> None:
    """Run a worker in this thread until it stops (a convenience for scripts)."""
    asyncio.run(Worker(app, options).run())


__all__ = ["Worker", "WorkerOptions", "run_worker"]
