"""The job model: what a job is, what an attempt is, and what a worker reports back.

Fields users can rely on are those of :class:`Job`; a job's definition (type, payload,
options) is immutable once submitted, only its status, progress, state, result and error
change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from operator import attrgetter
from typing import Any, overload

from conveyor.core.jsontext import compact
from conveyor.core.lifecycle import Event, Status, transition
from conveyor.core.retry import backoff_delay, should_retry

JSON = Any  # a value that json.dumps accepts


class Outcome(StrEnum):
    """How one attempt ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a running job says it is."""

    done: float
    total: float | None = None
    message: str | None = None

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return max(0.0, min(1.0, self.done / self.total))


@dataclass(slots=True)
class NewJob:
    """A job as submitted: everything the store needs to insert it; treat it as read-only.

    Not frozen: a frozen dataclass's ``__init__`` (an ``object.__setattr__`` per field)
    cost three times as much, once per submitted job. Derive a changed copy with
    ``dataclasses.replace``.
    """

    id: str
    type: str
    payload: dict[str, JSON]
    queue: str = "default"
    priority: int = 0
    run_at: datetime | None = None  # None: now, by the store's clock
    delay: float = 0.0  # seconds after the store's now, when run_at is None
    max_attempts: int = 3
    timeout: float | None = None
    lease: float | None = None
    backoff_base: float = 1.0
    backoff_cap: float = 3600.0
    tenant: str | None = None
    unique_key: str | None = None
    concurrency_key: str | None = None
    depends_on: tuple[str, ...] = ()
    parent_id: str | None = None
    root_id: str | None = None
    retry_of: str | None = None  # a manual retry: the first job of the retried chain
    state: JSON = None  # initial checkpoint, e.g. carried over by a manual retry
    trace_context: str | None = None  # the submitter's W3C traceparent, when traced
    retry_count: int = 0  # how many manual retries came before this job
    submitted_by: str = "local"  # who submitted it: "token:<id>", "local" from code, ...
    # The payload as compact JSON text (``json.dumps(payload, separators=(",", ":"))``),
    # when the submit's check wrote it already: a store writes it as it is rather than
    # encoding the payload again. Not an argument, so ``dataclasses.replace`` (which may
    # change the payload) leaves it None in the copy; set it only with the payload's text.
    payload_text: str | None = field(default=None, init=False, repr=False, compare=False)

    def stored(self, status: Status, run_at: datetime, created_at: datetime) -> Job:
        """The job as a store has just inserted it, with the times the store decided."""
        return _stored(self, status, run_at, created_at)

    def payload_json(self) -> str:
        """The payload as compact JSON text, as a store writes it: the check's text when
        it kept it (:attr:`payload_text`), else encoded now."""
        text = self.payload_text
        return compact(self.payload) if text is None else text


class SameJobs(Sequence[NewJob]):
    """Jobs submitted together that differ only in their ids and payloads: one job's
    other fields (``template``), and each job's id, payload and payload text.

    A large batch of one type's plain jobs, as its COPY writes it (PostgreSQL): the
    rows are written from these lists and the template's fields, and a job is made as
    a :class:`NewJob` only when read (``batch[i]``), which most never are. Read-only.
    """

    __slots__ = ("ids", "payloads", "template", "texts")

    def __init__(
        self,
        template: NewJob,
        ids: list[str],
        payloads: list[dict[str, JSON]],
        texts: list[str],
    ) -> None:
        if not len(ids) == len(payloads) == len(texts):
            raise ValueError("SameJobs takes one id, payload and payload text per job")
        self.template = template
        self.ids = ids
        self.payloads = payloads
        self.texts = texts

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> NewJob: ...

    @overload
    def __getitem__(self, index: slice) -> list[NewJob]: ...

    def __getitem__(self, index: int | slice) -> NewJob | list[NewJob]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        # By position: dataclasses.replace took 4 µs a job, more than the rest of a
        # handle's record.
        template = self.template
        job = NewJob(
            self.ids[index], template.type, self.payloads[index], *_after_payload(template)
        )
        job.payload_text = self.texts[index]
        return job

    def __iter__(self) -> Iterator[NewJob]:
        for i in range(len(self)):
            yield self[i]

    def stored(self, index: int, status: Status, run_at: datetime, created_at: datetime) -> Job:
        """``self[index].stored(...)``, without making the :class:`NewJob`."""
        job = self.template.stored(status, run_at, created_at)
        job.id = self.ids[index]
        job.payload = self.payloads[index]
        return job


# NewJob's fields after id, type and payload, as its __init__ takes them by position.
_after_payload = attrgetter(*[f.name for f in fields(NewJob) if f.init][3:])


@dataclass(slots=True, eq=True)
class Job:
    """A job as stored: a snapshot read from the store, to be treated as read-only.

    Not a frozen dataclass, unlike the other records: every claim builds one per job,
    and a frozen dataclass's ``__init__`` (an ``object.__setattr__`` call per field) costs
    more than twice as much for these 32 fields.
    """

    id: str
    type: str
    queue: str
    payload: dict[str, JSON]
    status: Status
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    timeout: float | None = None
    lease: float | None = None
    backoff_base: float = 1.0
    backoff_cap: float = 3600.0
    tenant: str | None = None
    progress: Progress | None = None
    state: JSON = None
    result: JSON = None
    result_ref: str | None = None
    error: str | None = None
    parent_id: str | None = None
    root_id: str | None = None
    depends_on: tuple[str, ...] = ()
    unique_key: str | None = None
    concurrency_key: str | None = None
    retry_of: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    lease_token: int = 0
    cancel_requested: bool = False
    trace_context: str | None = None  # the submitter's W3C traceparent, when traced
    retry_count: int = 0  # manual retries before this job (its retry_of is the first job)
    retried_by: str | None = None  # the manual retry that took this job's place
    submitted_by: str = "local"
    below: TreeCounts | None = None  # the jobs below it, when read as one job with any

    @property
    def terminal(self) -> bool:
        return self.status.terminal


def _stored_writer() -> Callable[[NewJob, Status, datetime, datetime], Job]:
    """Generate :meth:`NewJob.stored`: a :class:`Job` with the new job's value for each
    field it has, the store's status and times, attempt 0 and Job's default for the rest,
    passed by position (by keyword, the call cost twice as much, once per submitted job)."""
    own = {f.name for f in fields(NewJob)}
    scope: dict[str, Any] = {"Job": Job}
    values = []
    for f in fields(Job):
        if f.name in ("status", "run_at", "created_at"):
            values.append(f.name)
        elif f.name == "attempt":
            values.append("0")
        elif f.name in own:
            values.append(f"job.{f.name}")
        elif f.default is not MISSING:
            scope[f"default_{f.name}"] = f.default
            values.append(f"default_{f.name}")
        else:  # pragma: no cover - a new Job field without a default or a NewJob field
            raise TypeError(f"NewJob.stored: Job.{f.name} has no default and no new-job value")
    source = f"def stored(job, status, run_at, created_at):\n    return Job({', '.join(values)})\n"
    exec(compile(source, "<NewJob.stored>", "exec"), scope)
    stored: Callable[[NewJob, Status, datetime, datetime], Job] = scope["stored"]
    return stored


_stored = _stored_writer()


@dataclass(frozen=True, slots=True)
class TreeCounts:
    """The jobs below a parent by status, kept by the store as they change.

    A job a manual retry took the place of is no longer counted; its retry is. ``done``
    counts finished jobs, so ``done/total`` is the tree's progress.
    """

    pending: int = 0
    queued: int = 0
    running: int = 0
    waiting: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        return self.unfinished + self.done

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.cancelled

    @property
    def unfinished(self) -> int:
        return self.pending + self.queued + self.running + self.waiting

    def by_status(self) -> dict[str, int]:
        """Every status with its count (zeros included), in lifecycle order."""
        return {
            "pending": self.pending,
            "queued": self.queued,
            "running": self.running,
            "waiting": self.waiting,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "cancelled": self.cancelled,
        }

    def to_dict(self) -> dict[str, int]:
        """The counts with ``done`` and ``total``, as the API and callbacks show them."""
        return self.by_status() | {"done": self.done, "total": self.total}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job, kept as its own record."""

    job_id: str
    number: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: Outcome
    error: str | None = None
    traceback: str | None = None


@dataclass(slots=True, eq=True)
class Settlement:
    """What a worker reports when an attempt ends, fenced by the lease token; to be
    treated as read-only (``dataclasses.replace`` makes a changed one).

    ``outcome`` is None for a hand-back on graceful shutdown: no attempt is recorded
    and the attempt counter is given back.

    Not frozen, as :class:`Job` is not: a worker makes one per job it runs, and a frozen
    dataclass's ``__init__`` (an ``object.__setattr__`` call per field) took 2.1 µs
    against 0.8.
    """

    job_id: str
    token: int
    status: Status
    outcome: Outcome | None
    result: JSON = None
    result_ref: str | None = None
    error: str | None = None
    traceback: str | None = None
    retry_delay: float = 0.0  # seconds from the store's now, when status is queued
    progress: Progress | None = None  # the last progress not yet written by a heartbeat


def after_failure(
    *,
    job_id: str,
    token: int,
    attempt: int,
    max_attempts: int,
    outcome: Outcome,
    error: str | None,
    traceback: str | None = None,
    backoff_base: float,
    backoff_cap: float,
    jitter: float,
    retry_after: float | None = None,
    final: bool = False,
) -> Settlement:
    """Decide what follows a failed, timed out or lost attempt.

    The job is retried with backoff (or after ``retry_after`` seconds) while attempts
    remain and the error is not ``final``; otherwise it fails.

    >>> s = after_failure(job_id="j", token=1, attempt=1, max_attempts=3,
    ...     outcome=Outcome.FAILED, error="boom", backoff_base=30, backoff_cap=3600, jitter=0.5)
    >>> (s.status.value, s.retry_delay)
    ('queued', 15.0)
    >>> after_failure(job_id="j", token=1, attempt=3, max_attempts=3, outcome=Outcome.LOST,
    ...     error="lost", backoff_base=30, backoff_cap=3600, jitter=0.5).status.value
    'failed'
    """
    if not final and should_retry(attempt=attempt, max_attempts=max_attempts):
        status = transition(Status.RUNNING, Event.RETRY)
        if retry_after is not None:
            delay = max(0.0, retry_after)
        else:
            delay = backoff_delay(
                attempt=attempt, base=backoff_base, cap=backoff_cap, jitter=jitter
            )
    else:
        status = transition(Status.RUNNING, Event.FAIL)
        delay = 0.0
    return Settlement(
        job_id=job_id,
        token=token,
        status=status,
        outcome=outcome,
        error=error,
        traceback=traceback,
        retry_delay=delay,
    )


def as_utc(value: datetime) -> datetime:
    """Return an aware UTC datetime; a naive one is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


# The years a job may be scheduled in (in its own time zone): every backend stores them,
# and adding a delay or a backoff to one stays within what datetime holds.
FIRST_YEAR = 2000
LAST_YEAR = 8999
RUN_AT_PATTERN = r"^(20[0-9]{2}|2[1-9][0-9]{2}|[3-8][0-9]{3})-"  # the same, for OpenAPI


def check_run_at(value: object, name: str = "run_at") -> datetime:
    """Return ``value`` in UTC if it falls in the years 2000 to 8999, or raise ValueError.

    >>> check_run_at(datetime(9999, 12, 31))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: run_at must be in the years 2000 to 8999, not 9999-12-31T00:00:00
    """
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be a datetime, not {value!r}")
    if not FIRST_YEAR <= value.year <= LAST_YEAR:
        raise ValueError(
            f"{name} must be in the years {FIRST_YEAR} to {LAST_YEAR}, not {value.isoformat()}"
        )
    return as_utc(value)
