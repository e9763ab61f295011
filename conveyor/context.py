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
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from conveyor.core.durations import Duration, seconds
from conveyor.core.model import JSON, Job, Progress
from conveyor.errors import LeaseLost


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


class JobContext:
    """The running job as its handler sees it."""

    def __init__(
        self,
        job: Job,
        *,
        worker_id: str,
        report_progress: Callable[[Progress], None],
        save_state: Callable[[JSON], Awaitable[bool]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.job = job
        self.worker_id = worker_id
        self.state: JSON = job.state
        self.log = logging.getLogger(f"conveyor.job.{job.type}")
        self._report_progress = report_progress
        self._save_state = save_state
        self._loop = loop
        self._cancelled = threading.Event()
        self.cancel_reason: str | None = None

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
        """Record progress; written with the next heartbeat. Await it or not, as you like."""
        self._report_progress(
            Progress(float(done), None if total is None else float(total), message)
        )
        return _DONE

    async def checkpoint(self, state: JSON) -> None:
        """Save ``state`` (JSON) now; the next attempt of this job starts with it in ctx.state.

        Raises :class:`LeaseLost` when this worker no longer holds the job.
        """
        if not await self._save_state(state):
            raise LeaseLost(f"job {self.id} is no longer leased by this worker; state not saved")
        self.state = state

    def checkpoint_sync(self, state: JSON) -> None:
        """Save ``state`` from a sync handler (which runs in a thread)."""
        future = asyncio.run_coroutine_threadsafe(self.checkpoint(state), self._loop)
        future.result()

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out or handed back on shutdown."""
        return self._cancelled.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`Cancel` in a sync handler once the job should stop."""
        if self._cancelled.is_set():
            raise Cancel(self.cancel_reason or "cancelled")

    def _mark_cancelled(self, reason: str) -> None:
        if not self._cancelled.is_set():
            self.cancel_reason = reason
            self._cancelled.set()
