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
