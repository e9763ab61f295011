"""The heartbeat: renews a worker's job leases from a thread of its own, with its own
database connection, and stops runs whose lease may have run out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

from conveyor.core.model import Progress
from conveyor.observe.metrics import Metrics
from conveyor.store import Beat, Lease, Store
from conveyor.worker._leases import Leases, Run, may_have_expired, until_fence

log = logging.getLogger("conveyor.worker")
T = TypeVar("T")


class Heartbeat(threading.Thread):
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
        leases: Leases,
        new_store: Callable[[], Store],
        loop: asyncio.AbstractEventLoop,
        on_lost: Callable[[list[Run]], None],
        on_fenced: Callable[[list[Run]], None],
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
        self.on_lost = on_lost  # the database says these leases are gone
        self.on_fenced = on_fenced  # these leases may run out before a renewal can come
        self.on_cancel_requested = on_cancel_requested
        self._stop_event = threading.Event()
        self._opened = False  # the store: see _open
        self.interval = self.lease / 3
        self.progress_interval = min(1.0, self.interval)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        loop = asyncio.new_event_loop()
        store = self.new_store()
        try:
            self._beat_forever(loop, store)
        finally:
            if self._opened:
                loop.run_until_complete(store.close())
            loop.close()

    def _open(self, loop: asyncio.AbstractEventLoop, store: Store, tick: float) -> None:
        """Open the heartbeat's store, once: when the worker first holds a lease, not at
        its start. A worker's start-up then makes only its own connections (its first
        claim and jobs do not share the process with this store's schema check and pool:
        about 0.15 s of spawn to first job on PostgreSQL), and a store that cannot be
        opened is a failed beat, tried again at the next one like any other."""
        if not self._opened:
            self._send_beat(loop, store.open(), tick)
            self._opened = True

    def _beat_forever(self, loop: asyncio.AbstractEventLoop, store: Store) -> None:
        last_beat = time.monotonic()
        last_progress = 0.0
        failures = 0
        tick = min(0.25, self.interval / 2)
        wait = tick
        while not self._stop_event.wait(wait):
            now = time.monotonic()
            runs = self.leases.snapshot()
            interval = min([r.lease / 3 for r in runs] + [self.interval])
            # Wake for the next beat when it is due, not at the tick after: a beat late by
            # a tick would leave a run that much less of its lease to ride out an outage.
            wait = min(until_fence(runs, now, tick), max(0.005, last_beat + interval - now))
            if runs and not self._opened:
                # Connect once there is a lease to renew: its first beat is then due a
                # third of a lease later. A failure here is the first beat's to report.
                with contextlib.suppress(Exception):
                    self._open(loop, store, tick)
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
                self._open(loop, store, tick)
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
                # The next try after a tick (or a fence), not at once: a refused
                # connection fails fast.
                wait = until_fence(self.leases.snapshot(), time.monotonic(), tick)
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
        self, loop: asyncio.AbstractEventLoop, beat: Coroutine[Any, Any, T], tick: float
    ) -> T:
        """Wait for a beat's answer, stopping runs whose leases may run out meanwhile: a
        database that is slow to answer (its write lock held by other processes, a
        restart) must not keep this thread from fencing."""
        task = loop.create_task(beat)
        wait = until_fence(self.leases.snapshot(), time.monotonic(), tick)
        while True:
            loop.run_until_complete(asyncio.wait((task,), timeout=wait))
            if task.done():
                return task.result()
            runs, now = self.leases.snapshot(), time.monotonic()
            self._fence(runs, now)
            wait = until_fence(runs, now, tick)

    def _beaten(
        self, runs: list[Run], beat: Beat, progress: Mapping[Lease, Progress], started: float
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

    def _fence(self, runs: list[Run], now: float) -> None:
        """Stop runs whose lease may have expired: better stop early than run twice."""
        expired = [r for r in runs if not r.done and may_have_expired(r, now)]
        if expired:
            try:
                self.loop.call_soon_threadsafe(self.on_fenced, expired)
            except RuntimeError:
                pass
