"""Callbacks an application registers to hear about each attempt: alerts, Sentry, metrics.

::

    @app.on_attempt_end
    def report(event: AttemptEnded) -> None:
        if event.status == "failed":
            sentry_sdk.capture_message(f"{event.job.type} {event.job.id}: {event.error}")

``on_attempt_start`` hears of each attempt as the worker starts it; ``on_attempt_end``
once its outcome is recorded in the database (or its lease was lost);
``on_final_failure`` when an attempt left the job ``failed`` for good. Callbacks are
plain functions run on the worker's event loop: keep them quick, and hand slow work
(a network call) to a thread or a queue of your own. An exception in a callback is
logged on ``conveyor.hooks`` and otherwise ignored: it never stops the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from conveyor.core.model import Job

log = logging.getLogger("conveyor.hooks")


@dataclass(frozen=True, slots=True)
class AttemptStarted:
    """An attempt the worker starts now (``job.attempt`` is its number)."""

    job: Job
    worker_id: str


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """How an attempt ended, once recorded.

    ``status`` is the job's status after it: ``succeeded``, ``failed``, ``cancelled``,
    ``waiting`` (for children), ``queued`` (to be retried at ``retry_at``, or handed
    back on shutdown), or ``lost`` (the worker lost the lease; nothing was recorded).
    ``outcome`` is the attempt's: ``succeeded``, ``failed``, ``timed_out``,
    ``cancelled``, or None (handed back, lost).
    """

    job: Job
    worker_id: str
    status: str
    outcome: str | None
    duration: float
    error: str | None = None
    traceback: str | None = None
    retry_at: datetime | None = None


E = TypeVar("E", AttemptStarted, AttemptEnded)


class Hooks:
    """The callbacks of one application."""

    def __init__(self) -> None:
        self.attempt_start: list[Callable[[AttemptStarted], object]] = []
        self.attempt_end: list[Callable[[AttemptEnded], object]] = []
        self.final_failure: list[Callable[[AttemptEnded], object]] = []

    def started(self, event: AttemptStarted) -> None:
        for fn in self.attempt_start:
            _call(fn, event)

    def ended(self, event: AttemptEnded) -> None:
        for fn in self.attempt_end:
            _call(fn, event)
        if event.status == "failed":
            for fn in self.final_failure:
                _call(fn, event)


def _call(fn: Callable[[E], object], event: E) -> None:
    try:
        fn(event)
    except Exception:
        log.exception("hook %s raised; ignored", getattr(fn, "__qualname__", fn))


__all__ = ["AttemptEnded", "AttemptStarted", "Hooks"]
