"""The job leases a worker holds: each claimed run, its lease and buffered progress, and
the checks that a lease is still current (a run stops before its lease could run out)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from conveyor.core.model import Job, Progress
from conveyor.observe.logs import job_fields
from conveyor.observe.metrics import TypeMetrics
from conveyor.store import Lease
from conveyor.worker.context import JobContext


class Interrupt(Enum):
    CANCEL = "cancel"  # a cancel request
    TIMEOUT = "timeout"
    HAND_BACK = "hand_back"  # graceful shutdown
    LOST = "lost"  # the lease is gone: drop everything


@dataclass(eq=False, slots=True)
class Run:
    job: Job
    lease: float
    # When the claim that leased the job was sent: the lease counts from no earlier.
    renewed_at: float
    ctx: JobContext | None = None
    task: asyncio.Task[None] | None = None
    is_async: bool = True
    interrupt: Interrupt | None = None
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


class Leases:
    """The leases a worker holds, their buffered progress, and the lock over both.

    A lease is held from its claim until its result is settled (or it is found lost), so
    it is renewed while the run is running and while the result waits to be recorded.
    The event loop, handler threads (reporting progress) and the heartbeat thread share
    this object; nothing else touches the runs or the progress.
    """

    def __init__(self, lease: float) -> None:
        self.lease = lease  # the worker's, for jobs whose type sets none
        self._lock = threading.Lock()
        self._runs: dict[str, Run] = {}
        self._progress: dict[Lease, Progress] = {}
        # Runs claimed and held (renewed by the heartbeat) whose handlers the event loop
        # has not started yet, each with the older run of its job it replaces, if any.
        self._claimed: collections.deque[tuple[Run, Run | None]] = collections.deque()

    def __len__(self) -> int:
        return len(self._runs)

    def hold(self, run: Run) -> Run | None:
        """Hold ``run``'s lease; return the run of the same job held until now, if any."""
        with self._lock:
            return self._swap(run)

    def hold_claimed(self, jobs: Sequence[Job], sent: float) -> None:
        """Hold the leases of jobs just claimed, until the loop starts them (any thread)."""
        runs = [Run(job=job, lease=job.lease or self.lease, renewed_at=sent) for job in jobs]
        with self._lock:  # once for the claim, not once a job
            self._claimed.extend((run, self._swap(run)) for run in runs)

    def _swap(self, run: Run) -> Run | None:
        """Hold ``run`` in place of its job's run held until now (returned); the lock
        held."""
        previous = self._runs.get(run.job.id)
        self._runs[run.job.id] = run
        return previous

    def take_claimed(self) -> list[tuple[Run, Run | None]]:
        """The runs held since last called, each with the older run of its job, if any."""
        taken: list[tuple[Run, Run | None]] = []
        while self._claimed:
            taken.append(self._claimed.popleft())
        return taken

    def release(self, runs: Iterable[Run]) -> None:
        """Forget these runs (not a newer run of the same job) and their progress."""
        with self._lock:
            held, progress = self._runs, self._progress
            for run in runs:
                if held.get(run.job.id) is run:
                    del held[run.job.id]
                if progress:
                    progress.pop(run.key, None)

    def snapshot(self) -> list[Run]:
        """The runs held now, running or awaiting their settle."""
        with self._lock:
            return list(self._runs.values())

    def find(self, job_ids: Iterable[str]) -> list[Run]:
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

    def pop_progress(self, run: Run) -> Progress | None:
        """Take one run's buffered progress (it then goes with the run's result). The
        run's lease key is made only when some run has progress buffered: a run seldom
        has, and every finished run asks."""
        if not self._progress:
            return None
        with self._lock:
            return self._progress.pop(run.key, None)

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


def lease_fresh(run: Run, now: float) -> bool:
    """Whether ``run``'s lease is known current without waiting: claimed or renewed less
    than lease/3 ago (it cannot have expired then), and not lost."""
    return run.interrupt is not Interrupt.LOST and now - run.renewed_at < run.lease / 3


async def lease_current(run: Run) -> bool:
    """Wait until ``run``'s lease is known current: False when it may have expired.

    A lease older than lease/3 (the loop was slow to start the run) is renewed by
    the heartbeat at once; the handler waits for that renewal rather than start on
    a lease another worker may be about to rescue.
    """
    while True:
        now = time.monotonic()
        if lease_fresh(run, now):
            return True
        if run.interrupt is Interrupt.LOST or may_have_expired(run, now):
            return False
        await asyncio.sleep(0.01)


def fence_at(run: Run) -> float:
    """When (monotonic) ``run``'s lease may run out, with a margin: the run stops then."""
    return run.renewed_at + run.lease - min(run.lease / 6, 2.0)


def until_fence(runs: Iterable[Run], now: float, tick: float) -> float:
    """How long the heartbeat may wait: a tick, or less when a run must stop sooner (a
    tick late would eat the margin its handler has to stop before its lease runs out)."""
    fences = [f for f in (fence_at(r) - now for r in runs if not r.done) if f > 0]
    return max(0.005, min([tick, *fences]))


def may_have_expired(run: Run, now: float) -> bool:
    """Whether ``run``'s lease may have run out by ``now`` (monotonic), with a margin."""
    return now > fence_at(run)
