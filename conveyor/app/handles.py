"""The values application code holds: submissions, job handles, registered handlers, pages.

A leaf module: it imports only the core, the errors and the blocking adapter, so that the
worker, the job context and process isolation can hand out handles without importing the
:class:`~conveyor.Conveyor` facade. A handle reaches back to whatever made it through the
small :class:`JobSource` protocol.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

from conveyor.app import blocking
from conveyor.core.durations import Duration
from conveyor.core.ids import qualify
from conveyor.core.lifecycle import Status
from conveyor.core.model import (
    JSON,
    Attempt,
    Job,
    NewJob,
    Progress,
    SameJobs,
    TreeCounts,
    as_utc,
)
from conveyor.errors import ConfigurationError

if TYPE_CHECKING:
    from starlette.responses import JSONResponse

    from conveyor.app.registry import JobType

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(slots=True)
class Submission:
    """One job to submit with :meth:`Conveyor.submit_many`; submitting does not change it.

    Not frozen: a frozen dataclass's ``__init__`` (an ``object.__setattr__`` per field)
    cost six times as much, and an application building a batch of thousands makes one
    per job.
    """

    type: str
    payload: Mapping[str, JSON]
    id: str | None = None
    queue: str | None = None
    priority: int | None = None
    run_at: datetime | None = None
    delay: Duration | None = None
    max_attempts: int | None = None
    timeout: Duration | None = None
    unique_key: str | None = None
    tenant: str | None = None
    depends_on: tuple[str, ...] = ()
    concurrency_key: str | None = None


class JobView:
    """The fields of a job as last read, shared by local and remote job handles."""

    def __init__(self, record: Job) -> None:
        self.record = record

    def __repr__(self) -> str:
        return f"<Job {self.record.id} {self.record.type} {self.record.status.value}>"

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def type(self) -> str:
        return self.record.type

    @property
    def status(self) -> Status:
        return self.record.status

    @property
    def result(self) -> JSON:
        return self.record.result

    @property
    def error(self) -> str | None:
        return self.record.error

    @property
    def attempt(self) -> int:
        return self.record.attempt

    @property
    def progress(self) -> Progress | None:
        return self.record.progress

    @property
    def state(self) -> JSON:
        return self.record.state

    @property
    def terminal(self) -> bool:
        return self.record.terminal

    @property
    def below(self) -> TreeCounts | None:
        """The jobs below this one by status, with ``done`` and ``total`` (None: none, or
        not read as one job); kept by the store as they change, read with the job."""
        return self.record.below

    @property
    def parent_id(self) -> str | None:
        return self.record.parent_id

    @property
    def root_id(self) -> str | None:
        return self.record.root_id

    @property
    def retry_of(self) -> str | None:
        """A manual retry: the first job of its chain of retries."""
        return self.record.retry_of

    @property
    def retry_count(self) -> int:
        """Manual retries before this job in its chain."""
        return self.record.retry_count

    @property
    def submitted_by(self) -> str:
        """Who submitted it: ``"token:<id>"`` through the API, ``"local"`` from code."""
        return self.record.submitted_by


class JobSource(Protocol):
    """What a :class:`JobHandle` reads and steers its job through (the facade)."""

    async def get(self, job_id: str) -> JobHandle: ...

    async def attempts(self, job_id: str) -> list[Attempt]: ...

    async def cancel(self, job_id: str, *, reason: str = ...) -> JobHandle: ...

    async def children(self, job_id: str, *, limit: int = ...) -> list[JobHandle]: ...


class JobHandle(JobView):
    """A job as last read from the store, with the means to refresh it and wait for it."""

    def __init__(self, app: JobSource, record: Job) -> None:
        # JobView's __init__ by hand: one handle is made per job submitted or listed.
        self.record = record
        self._app = app

    async def refresh(self) -> JobHandle:
        """Read the job again; return self."""
        self.record = (await self._app.get(self.id)).record
        return self

    async def wait(self, timeout: float | None = None, *, poll: float = 0.5) -> JobHandle:
        """Wait until the job is terminal; raise TimeoutError after ``timeout`` seconds."""
        interval = 0.01
        async with asyncio.timeout(timeout):
            while not (await self.refresh()).terminal:
                await asyncio.sleep(interval)
                interval = min(poll, interval * 2)
        return self

    async def attempts(self) -> list[Attempt]:
        return await self._app.attempts(self.id)

    async def cancel(self, reason: str = "cancelled by request") -> JobHandle:
        return await self._app.cancel(self.id, reason=reason)

    async def children(self, *, limit: int = 1000) -> list[JobHandle]:
        """The jobs this one spawned, newest first."""
        return await self._app.children(self.id, limit=limit)

    def to_dict(self) -> dict[str, Any]:
        """The job as last read, as JSON values: every field (times in ISO 8601, the status
        by name, ``progress`` with its fraction, ``below`` with ``done`` and ``total``) but
        the lease's internals, for logs and an application's own answers."""
        record = self.record
        document = {
            f.name: _json_value(getattr(record, f.name))
            for f in dataclasses.fields(record)
            if f.name not in _LEASE_FIELDS
        }
        if record.progress is not None:
            document["progress"]["fraction"] = record.progress.fraction
        return document

    @property
    def sync(self) -> Any:
        """Blocking versions of this handle's coroutine methods."""
        return blocking.Blocking(self)

    def accepted(
        self,
        *,
        prefix: str | None = None,
        location: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> JSONResponse:
        """Return a ``202 Accepted`` response with the job resource as body.

        For an application's own Starlette or FastAPI endpoints. ``prefix`` is where the
        application serves the conveyor API's jobs (``"/api/jobs"`` when
        ``create_api`` is mounted at ``/api``): then ``Location`` and the resource's
        links point there, as ``POST /jobs`` answers. Without it the resource has no
        links (the application may serve no such routes), and ``location`` names a
        route of its own for ``Location``, if it has one.
        """
        # Imported here: the web layer (and Starlette) load only for applications that answer
        # HTTP themselves.
        from conveyor.web import accepted

        return accepted(self.record, prefix=prefix, location=location, headers=headers)


class InsertedHandle(JobHandle):
    """A handle on a job a batch's submit has just inserted (``jobs[index]``), its record
    made from the job as submitted when first read.

    A large batch's handles are mostly never read, and a :class:`Job` made per job cost
    the client more than the rest of its submit. Once made, the record is an attribute
    like any handle's (``refresh`` replaces it).
    """

    def __init__(
        self,
        app: JobSource,
        jobs: Sequence[NewJob],
        index: int,
        run_at: datetime,
        creation: Callable[[int], datetime],
        nth: int,
    ) -> None:
        """``creation(nth)`` is the job's creation time (:meth:`Inserted.creation`; the
        job is the batch's ``nth``), made with the record."""
        self._app = app
        self._inserted = (jobs, index, run_at, creation, nth)

    @functools.cached_property
    def record(self) -> Job:  # type: ignore[override]
        jobs, index, run_at, creation, nth = self._inserted
        created_at = creation(nth)
        if isinstance(jobs, SameJobs):
            return jobs.stored(index, Status.QUEUED, run_at, created_at)
        return jobs[index].stored(Status.QUEUED, run_at, created_at)

    @property
    def id(self) -> str:
        # Without making the record: the one field an application often reads of each.
        jobs, index = self._inserted[0], self._inserted[1]
        return jobs.ids[index] if isinstance(jobs, SameJobs) else jobs[index].id


# A lease's token and owner are the worker's business: a holder of them could settle it.
_LEASE_FIELDS = frozenset({"lease_token", "lease_owner", "lease_expires_at"})


def _json_value(value: Any) -> Any:
    if isinstance(value, TreeCounts):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _json_value(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Status):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [_json_value(v) for v in value]
    return value


class Submitter(Protocol):
    """What a :class:`JobDefinition` submits its jobs through (the facade)."""

    async def submit(self, type: str, payload: Mapping[str, JSON] | None = None) -> JobHandle: ...


class JobDefinition(Generic[P, R]):
    """A registered handler: call it like the function, or submit jobs of its type."""

    def __init__(self, app: Submitter, job_type: JobType) -> None:
        self._app = app
        self.job_type = job_type
        self.name = job_type.name
        self.__wrapped__ = job_type.fn
        self.__doc__ = job_type.fn.__doc__

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self.job_type.fn(*args, **kwargs)
        return result

    async def submit(self, **payload: Any) -> JobHandle:
        """Submit a job of this type with the handler's keyword arguments as payload."""
        return await self._app.submit(self.name, payload)

    def submit_sync(self, **payload: Any) -> JobHandle:
        """Blocking :meth:`submit`, for code that is not async."""
        return blocking.run(self.submit(**payload))


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of jobs and the cursor of the next page (None on the last page)."""

    jobs: list[JobHandle]
    next: str | None


def encode_cursor(job: Job) -> str:
    """The opaque cursor of the page that follows ``job``: its ``(created_at, id)``, with
    the id as stored (a job shown to its tenant under its bare id is qualified again)."""
    stored = qualify(job.tenant, job.id)
    raw = json.dumps([job.created_at.isoformat(), stored], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Return the ``(created_at, id)`` a cursor stands for; raise ConfigurationError."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, job_id = json.loads(raw)
        if not isinstance(job_id, str) or not isinstance(created, str):
            raise ValueError(cursor)
        return as_utc(datetime.fromisoformat(created)), job_id
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ConfigurationError(
            "cursor is not one this server handed out: use the `next` of the previous page, "
            "or leave it out for the first page"
        ) from None


__all__ = [
    "JobDefinition",
    "JobHandle",
    "JobPage",
    "JobSource",
    "JobView",
    "Submission",
    "Submitter",
    "decode_cursor",
    "encode_cursor",
]
