"""What a handler gets as its first argument, and the exceptions it raises to steer retries.

A handler reports progress with ``ctx.progress(done, total, message)``: the call only
buffers, so it is cheap in a tight loop, and the worker writes the latest value with its
next heartbeat. ``await ctx.checkpoint(state)`` saves state at once, fenced by the lease;
the next attempt finds it in ``ctx.state``. Sync handlers run in a thread and use
``ctx.checkpoint_sync(state)`` and ``ctx.cancelled`` / ``ctx.raise_if_cancelled()``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from conveyor.app.handles import Submission
from conveyor.core.durations import Duration, seconds
from conveyor.core.model import JSON, Job, Progress
from conveyor.errors import ConfigurationError, LeaseLost
from conveyor.observe.logs import JobLogger, job_fields

if TYPE_CHECKING:
    from conveyor.app.handles import JobHandle


class Retry(Exception):
    """Raise from a handler to retry the job after a chosen delay (counts as an attempt)."""

    def __init__(self, after: Duration = 0, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.after = seconds(after)
        self.reason = reason


class Cancel(Exception):
    """Raise from a handler to end the job as ``cancelled`` without further attempts."""

    def __init__(self, reason: str = "cancelled by its handler") -> None:
        super().__init__(reason)
        self.reason = reason


class _Done:
    """An awaitable that is already done, so ``ctx.progress`` works with or without await."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover - makes this a generator


_DONE = _Done()


class JobPort(Protocol):
    """What a context needs from the worker running it; every write is lease-fenced."""

    def report_progress(self, progress: Progress) -> None: ...

    async def save_state(self, state: JSON) -> bool: ...

    async def spawn(
        self,
        submissions: Sequence[Submission],
        callbacks: Mapping[str, Submission] | None = None,
    ) -> list[JobHandle] | None: ...

    async def dependency_results(self) -> dict[str, JSON]: ...


class JobContext:
    """The running job as its handler sees it."""

    def __init__(
        self,
        job: Job,
        *,
        worker_id: str,
        port: JobPort,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.job = job
        self.worker_id = worker_id
        self.state: JSON = job.state
        self.result_ref: str | None = None
        self._port = port
        self._loop = loop
        # A plain flag, not a threading.Event: nothing waits on it, sync handlers poll
        # it from their thread, and assigning a bool is atomic. The reason is stored
        # before the flag, so a handler that sees the flag sees the reason.
        self._cancelled = False
        self.cancel_reason: str | None = None
        self._log: JobLogger | None = None
        self._progress: Progress | None = job.progress

    @property
    def log(self) -> JobLogger:
        """The logger of this job's type, ``conveyor.job.<type>``; its lines carry the job's
        fields (``job_id``, ``job_type``, ``queue``, ``attempt``, ``worker``)."""
        if self._log is None:
            job = self.job
            self._log = JobLogger(
                logging.getLogger(f"conveyor.job.{job.type}"),
                job_fields(job.id, job.type, job.queue, job.attempt, self.worker_id),
            )
        return self._log

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def payload(self) -> dict[str, JSON]:
        return self.job.payload

    def progress(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> _Done:
        """Record progress; written with the next heartbeat. Await it or not, as you like.
        Read it back with :attr:`last_progress`."""
        self._progress = Progress(float(done), None if total is None else float(total), message)
        self._port.report_progress(self._progress)
        return _DONE

    @property
    def last_progress(self) -> Progress | None:
        """The progress this attempt last recorded, else the job's as stored when it was
        claimed (an earlier attempt's), else None: ``ctx.progress(...)`` records it."""
        return self._progress

    async def checkpoint(self, state: JSON) -> None:
        """Save ``state`` (JSON) now; the next attempt of this job starts with it in ctx.state.

        Raises :class:`LeaseLost` when this worker no longer holds the job.
        """
        if not await self._port.save_state(state):
            raise LeaseLost(f"job {self.id} is no longer leased by this worker; state not saved")
        self.state = state

    def checkpoint_sync(self, state: JSON) -> None:
        """Save ``state`` from a sync handler (which runs in a thread)."""
        asyncio.run_coroutine_threadsafe(self.checkpoint(state), self._loop).result()

    async def spawn(
        self,
        type: str,
        payload: Mapping[str, JSON] | None = None,
        *,
        id: str | None = None,
        depends_on: Sequence[str] = (),
        queue: str | None = None,
        priority: int | None = None,
    ) -> JobHandle:
        """Create a child job in a write fenced by this job's lease.

        When the handler returns while children are unfinished, the job becomes
        ``waiting``, and it ends when its last child ends: ``succeeded`` if every child
        succeeded, else ``failed``. Give children ids derived from this job's (for
        example ``f"{ctx.id}.part-{n}"``) so that a retried attempt does not spawn them
        twice.
        """
        submission = Submission(
            type=type,
            payload=payload or {},
            id=id,
            depends_on=tuple(depends_on),
            queue=queue,
            priority=priority,
        )
        return (await self.spawn_many([submission]))[0]

    async def spawn_many(
        self,
        submissions: Sequence[Submission],
        *,
        on_complete: Submission | str | None = None,
        on_success: Submission | str | None = None,
    ) -> list[JobHandle]:
        """Create many children in one fenced write.

        ``on_complete`` is a job submitted once everything below this job has ended,
        whatever the outcome; ``on_success`` only if all of it succeeded (a job type name,
        or a :class:`Submission`). Either gets ``batch`` in its payload: this job's id, its
        ``status`` and the counts (``succeeded``, ``failed``, ``cancelled``, ``total``...).
        Callbacks are top-level jobs, not children: they do not hold this job waiting.
        """
        callbacks = {
            kind: Submission(job, {}) if isinstance(job, str) else job
            for kind, job in (("complete", on_complete), ("success", on_success))
            if job is not None
        }
        if callbacks and not submissions:
            raise ConfigurationError(
                "on_complete/on_success fire when the children spawned end: spawn at least one"
            )
        spawned = await self._port.spawn(submissions, callbacks)
        if spawned is None:
            raise LeaseLost(f"job {self.id} is no longer leased by this worker; nothing spawned")
        return spawned

    def spawn_sync(
        self, type: str, payload: Mapping[str, JSON] | None = None, **kw: Any
    ) -> JobHandle:
        """Spawn a child from a sync handler (which runs in a thread)."""
        future = asyncio.run_coroutine_threadsafe(self.spawn(type, payload, **kw), self._loop)
        return future.result()

    async def dependency_results(self) -> dict[str, JSON]:
        """Return the results of the jobs this one depends on, by id (for fan-in steps)."""
        return await self._port.dependency_results()

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out or handed back on shutdown."""
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        """Raise :class:`Cancel` in a sync handler once the job should stop."""
        if self._cancelled:
            raise Cancel(self.cancel_reason or "cancelled")

    def _mark_cancelled(self, reason: str) -> None:
        if not self._cancelled:
            self.cancel_reason = reason
            self._cancelled = True
