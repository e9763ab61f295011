"""The job state machine: every change of a job's status is a transition in this table.

See ``docs/state-machine.md`` for the diagram. Backends never invent statuses: the worker
and the maintenance duties ask :func:`transition` for the next status, which raises
:class:`IllegalTransition` for a move the table does not allow.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """Where a job is in its life."""

    PENDING = "pending"  # waits for the jobs it depends on
    QUEUED = "queued"  # runnable once run_at has passed
    RUNNING = "running"  # leased by one worker
    WAITING = "waiting"  # handler returned; waits for the children it spawned
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
ACTIVE = frozenset({Status.PENDING, Status.QUEUED, Status.RUNNING, Status.WAITING})


class Event(StrEnum):
    """Something that happens to a job."""

    DEPENDENCIES_MET = "dependencies_met"
    DEPENDENCY_FAILED = "dependency_failed"
    CLAIM = "claim"
    SUCCEED = "succeed"  # handler returned and nothing is left to wait for
    AWAIT_CHILDREN = "await_children"  # handler returned with unfinished children
    CHILDREN_SUCCEEDED = "children_succeeded"
    CHILDREN_FAILED = "children_failed"
    RETRY = "retry"  # an attempt failed, timed out or was lost, and attempts remain
    FAIL = "fail"  # an attempt failed and no attempt remains, or the error is final
    HAND_BACK = "hand_back"  # graceful shutdown returns the job without spending an attempt
    CANCEL = "cancel"
    REOPEN = "reopen"  # a manual retry of a failed job below it: it waits for that retry


class IllegalTransition(ValueError):
    """Raised when an event is not allowed in a job's current status."""

    def __init__(self, status: Status, event: Event) -> None:
        super().__init__(f"a {status.value} job cannot take the event {event.value!r}")
        self.status = status
        self.event = event


TRANSITIONS: dict[tuple[Status, Event], Status] = {
    (Status.PENDING, Event.DEPENDENCIES_MET): Status.QUEUED,
    (Status.PENDING, Event.DEPENDENCY_FAILED): Status.CANCELLED,
    (Status.PENDING, Event.CANCEL): Status.CANCELLED,
    (Status.QUEUED, Event.CLAIM): Status.RUNNING,
    (Status.QUEUED, Event.CANCEL): Status.CANCELLED,
    (Status.RUNNING, Event.SUCCEED): Status.SUCCEEDED,
    (Status.RUNNING, Event.AWAIT_CHILDREN): Status.WAITING,
    (Status.RUNNING, Event.RETRY): Status.QUEUED,
    (Status.RUNNING, Event.FAIL): Status.FAILED,
    (Status.RUNNING, Event.HAND_BACK): Status.QUEUED,
    (Status.RUNNING, Event.CANCEL): Status.CANCELLED,
    (Status.WAITING, Event.CHILDREN_SUCCEEDED): Status.SUCCEEDED,
    (Status.WAITING, Event.CHILDREN_FAILED): Status.FAILED,
    (Status.WAITING, Event.CANCEL): Status.CANCELLED,
    (Status.FAILED, Event.REOPEN): Status.WAITING,
}


def transition(status: Status, event: Event) -> Status:
    """Return the status a job in ``status`` moves to on ``event``.

    >>> transition(Status.QUEUED, Event.CLAIM)
    <Status.RUNNING: 'running'>
    >>> transition(Status.SUCCEEDED, Event.CLAIM)
    Traceback (most recent call last):
    ...
    conveyor.core.lifecycle.IllegalTransition: a succeeded job cannot take the event 'claim'
    """
    try:
        return TRANSITIONS[(status, event)]
    except KeyError:
        raise IllegalTransition(status, event) from None


def sources(event: Event) -> frozenset[Status]:
    """Return the statuses from which ``event`` is legal (used to fence SQL updates)."""
    return frozenset(s for (s, e) in TRANSITIONS if e is event)


def children_event(counts: dict[Status, int]) -> Event | None:
    """Decide a parent's fate from its children's statuses; None while any is unfinished.

    ``counts`` are those of every job below the parent, where a job that a manual retry
    took the place of is no longer counted: a child that failed and was retried to
    success (automatically or by hand) counts as succeeded.

    >>> children_event({Status.SUCCEEDED: 3})
    <Event.CHILDREN_SUCCEEDED: 'children_succeeded'>
    >>> children_event({Status.SUCCEEDED: 2, Status.FAILED: 1})
    <Event.CHILDREN_FAILED: 'children_failed'>
    >>> children_event({Status.SUCCEEDED: 2, Status.RUNNING: 1}) is None
    True
    """
    if any(n and status not in TERMINAL for status, n in counts.items()):
        return None
    if all(status is Status.SUCCEEDED for status, n in counts.items() if n):
        return Event.CHILDREN_SUCCEEDED
    return Event.CHILDREN_FAILED


def returned_event(children: dict[Status, int]) -> Event:
    """Decide what a handler's return means for its job, given its children so far.

    >>> returned_event({})
    <Event.SUCCEED: 'succeed'>
    >>> returned_event({Status.QUEUED: 1})
    <Event.AWAIT_CHILDREN: 'await_children'>
    >>> returned_event({Status.CANCELLED: 1})
    <Event.FAIL: 'fail'>
    """
    decided = children_event(children)
    if decided is None:
        return Event.AWAIT_CHILDREN
    return Event.SUCCEED if decided is Event.CHILDREN_SUCCEEDED else Event.FAIL


def children_error(counts: dict[Status, int]) -> str:
    """Describe why a parent failed, from the statuses of the jobs below it."""
    failed = counts.get(Status.FAILED, 0)
    cancelled = counts.get(Status.CANCELLED, 0)
    total = sum(counts.values())
    return f"{failed} failed and {cancelled} cancelled of {total} jobs below it"


def dependency_event(dependency: Status) -> Event | None:
    """What a finished dependency means for a pending dependent (None: not yet decided).

    >>> dependency_event(Status.FAILED)
    <Event.DEPENDENCY_FAILED: 'dependency_failed'>
    >>> dependency_event(Status.SUCCEEDED) is None
    True
    """
    if dependency in (Status.FAILED, Status.CANCELLED):
        return Event.DEPENDENCY_FAILED
    return None
