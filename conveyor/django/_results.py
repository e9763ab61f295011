"""How a conveyor job reads as a Django ``TaskResult``: statuses, times, errors, priority.

Pure functions of a job and its attempts, so that ``get_result``, the worker's signals
and the context a task is given all say the same thing.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass
from datetime import datetime

import conveyor

# conveyor runs the lowest priority first; Django the highest. A Django priority p is
# stored as -p, so that Django's order holds and conveyor's tools show a plain number.
_SIGN = -1

# An exception's header line as ``traceback.format_exception`` ends a traceback with:
# the class (module-qualified unless builtins or __main__), then ``: message`` or nothing.
_HEADER = re.compile(r"^(?P<path>[A-Za-z_][\w.]*)(?::|$)")


def stored_priority(django_priority: int) -> int:
    """The conveyor priority of a Django priority (−100…100, higher first).

    >>> stored_priority(10), stored_priority(0)
    (-10, 0)
    """
    return _SIGN * django_priority


def django_priority(stored: int) -> int:
    """The Django priority of a job's stored priority.

    >>> django_priority(-10)
    10
    """
    return 0 if stored == 0 else _SIGN * stored


def django_status(status: conveyor.Status) -> str:
    """The ``TaskResultStatus`` value of a conveyor status.

    A job queued again after a failed attempt is READY ("ready to be executed again", in
    Django's words); one waiting for its children still runs; cancelled is FAILED (Django
    has no cancelled state).

    >>> [django_status(conveyor.Status(s)) for s in ("queued", "waiting", "cancelled")]
    ['READY', 'RUNNING', 'FAILED']
    """
    if status in (conveyor.Status.PENDING, conveyor.Status.QUEUED):
        return "READY"
    if status in (conveyor.Status.RUNNING, conveyor.Status.WAITING):
        return "RUNNING"
    if status is conveyor.Status.SUCCEEDED:
        return "SUCCESSFUL"
    return "FAILED"


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt as Django's ``TaskError`` carries it."""

    exception_class_path: str
    traceback: str


def exception_class_path(
    error: str | None, traceback: str | None, outcome: conveyor.Outcome
) -> str:
    """The dotted path of the exception class that ended an attempt.

    A handler's exception is named by the last header line of its traceback, which
    Python writes module-qualified (``shop.errors.OutOfStock: ...``) except for builtins.
    An attempt that raised nothing of the handler's (it timed out, its worker died, it
    was cancelled) is named by conveyor's view of what happened.

    >>> tb = 'Traceback (most recent call last):\\n  File "t.py", line 1\\nValueError: bad\\n'
    >>> exception_class_path("ValueError: bad", tb, conveyor.Outcome.FAILED)
    'builtins.ValueError'
    >>> tb = "...\\nshop.errors.OutOfStock: x\\n"
    >>> exception_class_path("OutOfStock: x", tb, conveyor.Outcome.FAILED)
    'shop.errors.OutOfStock'
    >>> exception_class_path("lease expired", None, conveyor.Outcome.LOST)
    'conveyor.LeaseLost'
    """
    if outcome is conveyor.Outcome.TIMED_OUT:
        return "builtins.TimeoutError"
    if outcome is conveyor.Outcome.LOST:
        return "conveyor.LeaseLost"
    if outcome is conveyor.Outcome.CANCELLED:
        return "conveyor.Cancel"
    name = (error or "").split(":", 1)[0].strip()
    for line in reversed((traceback or "").splitlines()):
        found = _HEADER.match(line)
        if found is None or line.startswith("Traceback"):
            continue
        path = found.group("path")
        if path.rsplit(".", 1)[-1] == name:
            if "." in path:
                return path
            return f"builtins.{path}" if hasattr(builtins, path) else f"__main__.{path}"
    # No traceback (the payload did not fit the task, no handler): conveyor refused it.
    return "conveyor.ConveyorError"


def failures(attempts: list[conveyor.Attempt]) -> list[Failure]:
    """Each failed attempt's exception class path and traceback, oldest first."""
    return [
        Failure(
            exception_class_path(a.error, a.traceback, a.outcome),
            a.traceback or (a.error or ""),
        )
        for a in attempts
        if a.outcome is not conveyor.Outcome.SUCCEEDED
    ]


def first_start(attempts: list[conveyor.Attempt], started_at: datetime | None) -> datetime | None:
    """When the task first started: its first attempt's start, else the running one's."""
    for attempt in attempts:
        if attempt.started_at is not None:
            return attempt.started_at
    return started_at
