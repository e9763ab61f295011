"""The client facade: the one object application code, workers, the API and the CLI use.

::

    from conveyor import Conveyor

    app = Conveyor()  # CONVEYOR_DATABASE_URL, else sqlite:///conveyor.db

    @app.job(max_attempts=5, timeout="15m", backoff=("30s", "1h"), queue="media")
    async def convert_video(ctx, path: str, fmt: str = "mp4") -> dict:
        ...

    job = await convert_video.submit(path="a.mov")
    await job.wait(timeout=60)

Code that is not async uses ``app.sync`` (``app.sync.get(id)``), ``handler.submit_sync``
and ``job.sync.wait()``: the same code paths, run on a portal loop.
"""

from __future__ import annotations

import asyncio
import os
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from conveyor import _blocking
from conveyor._registry import JobOptions, JobType, Registry, optional_seconds
from conveyor._registry import _check_queue as check_queue
from conveyor.core.durations import Duration
from conveyor.core.ids import new_id
from conveyor.core.lifecycle import Status
from conveyor.core.model import JSON, Attempt, Job, NewJob, Progress, as_utc
from conveyor.core.retry import Backoff
from conveyor.errors import (
    ConfigurationError,
    IdempotencyConflict,
    InvalidDependency,
    InvalidPayload,
    JobNotFound,
)
from conveyor.store import JobQuery, QueueInfo, Store, Submitted, WorkerInfo, create_store

if TYPE_CHECKING:
    from conveyor.worker import Worker, WorkerOptions

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_URL = "sqlite:///conveyor.db"
_MAX_ID = 200


@dataclass(frozen=True, slots=True)
class Submission:
    """One job to submit with :meth:`Conveyor.submit_many`."""

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


class JobHandle:
    """A job as last read from the store, with the means to refresh it and wait for it."""

    def __init__(self, app: Conveyor, record: Job) -> None:
        self._app = app
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

    @property
    def sync(self) -> Any:
        """Blocking versions of this handle's coroutine methods."""
        return _blocking.Blocking(self)


class JobDefinition(Generic[P, R]):
    """A registered handler: call it like the function, or submit jobs of its type."""

    def __init__(self, app: Conveyor, job_type: JobType) -> None:
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
        return _blocking.run(self.submit(**payload))


class Conveyor:
    """An application: its job types and its connection to the store."""

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        migrate: bool = True,
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_DATABASE_URL") or DEFAULT_URL
        self.clock = clock
        self.migrate_on_open = migrate
        # Parse the URL now so a malformed one fails at start-up, not at the first submit.
        create_store(self.url, clock=clock, migrate=migrate)
        self.registry = Registry()
        self._stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Store] = (
            weakref.WeakKeyDictionary()
        )
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<Conveyor {self.url}>"

    # -- job types ----------------------------------------------------------------------

    @overload
    def job(self, fn: Callable[P, R], /) -> JobDefinition[P, R]: ...

    @overload
    def job(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: Duration | None = None,
        lease: Duration | None = None,
        backoff: Backoff | tuple[Duration, Duration] | Duration = (1, 3600),
        priority: int = 0,
        non_retryable: Iterable[type[BaseException]] = (),
        isolation: str | None = None,
    ) -> Callable[[Callable[P, R]], JobDefinition[P, R]]: ...

    def job(
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 3,
        timeout: Duration | None = None,
        lease: Duration | None = None,
        backoff: Backoff | tuple[Duration, Duration] | Duration = (1, 3600),
        priority: int = 0,
        non_retryable: Iterable[type[BaseException]] = (),
        isolation: str | None = None,
    ) -> JobDefinition[P, R] | Callable[[Callable[P, R]], JobDefinition[P, R]]:
        """Register a handler as a job type (usable as ``@app.job`` or ``@app.job(...)``).

        ``isolation="process"`` runs each attempt in a child process that can be killed
        on timeout or cancel, and whose crash only fails the attempt.
        """

        def register(handler: Callable[P, R]) -> JobDefinition[P, R]:
            try:
                parsed_backoff = Backoff.parse(backoff)
            except ValueError as exc:
                raise ConfigurationError(f"backoff: {exc}") from None
            options = JobOptions(
                name=name or str(getattr(handler, "__name__", "")),
                queue=queue,
                max_attempts=max_attempts,
                timeout=optional_seconds(timeout, "timeout"),
                lease=optional_seconds(lease, "lease"),
                backoff=parsed_backoff,
                priority=priority,
                non_retryable=tuple(non_retryable),
                isolation=isolation,
            )
            job_type = JobType(handler, options)
            self.registry.add(job_type)
            return JobDefinition(self, job_type)

        return register(fn) if fn is not None else register

    # -- store --------------------------------------------------------------------------

    async def store(self) -> Store:
        """Return this event loop's open store, opening it on first use."""
        loop = asyncio.get_running_loop()
        store = self._stores.get(loop)
        if store is not None:
            return store
        lock = self._opening.setdefault(loop, asyncio.Lock())
        async with lock:
            store = self._stores.get(loop)
            if store is None:
                store = self.new_store()
                await store.open()
                self._stores[loop] = store
        return store

    def new_store(self) -> Store:
        """Return a new, unopened store on this application's database."""
        return create_store(self.url, clock=self.clock, migrate=self.migrate_on_open)

    async def close(self) -> None:
        """Close this event loop's store."""
        store = self._stores.pop(asyncio.get_running_loop(), None)
        if store is not None:
            await store.close()

    async def migrate(self) -> list[str]:
        """Apply pending migrations; return the names applied."""
        store = create_store(self.url, clock=self.clock, migrate=False)
        try:
            return await store.migrate()
        finally:
            await store.close()

    # -- submitting ---------------------------------------------------------------------

    async def submit(
        self,
        type: str | JobDefinition[Any, Any],
        payload: Mapping[str, JSON] | None = None,
        *,
        id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        run_at: datetime | None = None,
        delay: Duration | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        unique_key: str | None = None,
        tenant: str | None = None,
        depends_on: Sequence[str] = (),
        connection: Any = None,
    ) -> JobHandle:
        """Submit one job; it is committed when this returns.

        A client ``id`` makes the call idempotent: the same id again returns the existing
        job (a different type or payload under the same id raises IdempotencyConflict).
        While an active job holds ``unique_key``, that job is returned instead.
        On PostgreSQL, ``connection`` (a psycopg connection) writes the job in the
        application's own transaction instead: it exists only if that transaction commits.
        """
        name = type.name if isinstance(type, JobDefinition) else type
        submission = Submission(
            type=name,
            payload=payload if payload is not None else {},
            id=id,
            queue=queue,
            priority=priority,
            run_at=run_at,
            delay=delay,
            max_attempts=max_attempts,
            timeout=timeout,
            unique_key=unique_key,
            tenant=tenant,
            depends_on=tuple(depends_on),
        )
        return (await self.submit_many([submission], connection=connection))[0]

    def prepare(self, submissions: Sequence[Submission]) -> list[NewJob]:
        """Validate submissions into jobs ready to insert (raises on bad input)."""
        new_jobs = [self._prepare(s) for s in submissions]
        _check_acyclic(new_jobs)
        return new_jobs

    def handles(self, new_jobs: Sequence[NewJob], results: Sequence[Submitted]) -> list[JobHandle]:
        """Turn a store's submit results into handles, refusing an id reused differently."""
        handles = []
        for new, submitted in zip(new_jobs, results, strict=True):
            job = submitted.job
            same_id = not submitted.created and job.id == new.id
            if same_id and (job.type != new.type or job.payload != new.payload):
                raise IdempotencyConflict(
                    f"job {new.id!r} exists with another type or payload; "
                    "use a new id for a different job"
                )
            handles.append(JobHandle(self, job))
        return handles

    async def submit_many(
        self, submissions: Sequence[Submission], *, connection: Any = None
    ) -> list[JobHandle]:
        """Submit many jobs in one transaction: all of them are stored, or none.

        ``connection``: as for :meth:`submit`, the application's own transaction.
        """
        new_jobs = self.prepare(submissions)
        store = await self.store()
        results = await store.submit(new_jobs, connection=connection)
        return self.handles(new_jobs, results)

    def _prepare(self, s: Submission) -> NewJob:
        job_type = self.registry.get(s.type)
        options = job_type.options
        payload = job_type.validate(s.payload)
        if s.id is not None and (
            not isinstance(s.id, str) or not s.id or len(s.id) > _MAX_ID or "\x00" in s.id
        ):
            raise InvalidPayload(s.type, f"a job id must be 1 to {_MAX_ID} characters")
        queue = s.queue if s.queue is not None else options.queue
        check_queue(queue)
        max_attempts = s.max_attempts if s.max_attempts is not None else options.max_attempts
        if not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, not {max_attempts!r}")
        priority = s.priority if s.priority is not None else options.priority
        if not isinstance(priority, int):
            raise ConfigurationError(f"priority must be an integer, not {priority!r}")
        timeout = optional_seconds(s.timeout, "timeout")
        delay = optional_seconds(s.delay, "delay") or 0.0
        return NewJob(
            id=s.id or new_id(self._wallclock()),
            type=s.type,
            payload=payload,
            queue=queue,
            priority=priority,
            run_at=as_utc(s.run_at) if s.run_at is not None else None,
            delay=delay,
            max_attempts=max_attempts,
            timeout=timeout if timeout is not None else options.timeout,
            lease=options.lease,
            backoff_base=options.backoff.base,
            backoff_cap=options.backoff.cap,
            tenant=s.tenant,
            unique_key=s.unique_key,
            depends_on=_dependency_ids(s.depends_on),
        )

    def _wallclock(self) -> float:
        return self.clock() if self.clock is not None else time.time()

    # -- reading and steering -----------------------------------------------------------

    async def get(self, job_id: str) -> JobHandle:
        """Return the job with this id; raise JobNotFound."""
        job = await (await self.store()).get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return JobHandle(self, job)

    async def list_jobs(
        self,
        *,
        status: Iterable[Status | str] = (),
        type: str | None = None,
        queue: str | None = None,
        before_id: str | None = None,
        limit: int = 50,
    ) -> list[JobHandle]:
        """Return jobs, newest first."""
        try:
            statuses = tuple(Status(s) for s in status)
        except ValueError as exc:
            known = ", ".join(s.value for s in Status)
            raise ConfigurationError(f"{exc}; known statuses: {known}") from None
        if not 1 <= limit <= 1000:
            raise ConfigurationError("limit must be between 1 and 1000")
        query = JobQuery(status=statuses, type=type, queue=queue, before_id=before_id, limit=limit)
        jobs = await (await self.store()).list_jobs(query)
        return [JobHandle(self, j) for j in jobs]

    async def attempts(self, job_id: str) -> list[Attempt]:
        """Return a job's attempts, oldest first."""
        await self.get(job_id)
        return await (await self.store()).attempts(job_id)

    async def cancel(self, job_id: str, *, reason: str = "cancelled by request") -> JobHandle:
        """Cancel a job: at once if it has not started, else ask its worker to stop it."""
        job = await (await self.store()).cancel(job_id, reason=reason)
        if job is None:
            raise JobNotFound(job_id)
        return JobHandle(self, job)

    async def retry(self, job_id: str) -> JobHandle:
        """Retry a failed or cancelled job as a new job with ``retry_of`` set.

        The old row is not changed; the new job starts with the old one's last checkpoint.
        """
        old = (await self.get(job_id)).record
        new = NewJob(
            id=new_id(self._wallclock()),
            type=old.type,
            payload=old.payload,
            queue=old.queue,
            priority=old.priority,
            max_attempts=old.max_attempts,
            timeout=old.timeout,
            lease=old.lease,
            backoff_base=old.backoff_base,
            backoff_cap=old.backoff_cap,
            tenant=old.tenant,
            unique_key=old.unique_key,
            concurrency_key=old.concurrency_key,
            parent_id=old.parent_id,
            root_id=old.root_id,
            retry_of=old.id,
            state=old.state,
        )
        job = await (await self.store()).retry(job_id, new)
        if job is None:
            raise JobNotFound(job_id)
        return JobHandle(self, job)

    async def children(self, job_id: str, *, limit: int = 1000) -> list[JobHandle]:
        """Return a job's direct children, newest first."""
        jobs = await (await self.store()).list_jobs(JobQuery(parent_id=job_id, limit=limit))
        return [JobHandle(self, j) for j in jobs]

    async def tree(self, root_id: str, *, limit: int = 10_000) -> list[JobHandle]:
        """Return a job and every job below it (``root_id`` links them), oldest first."""
        root = await self.get(root_id)
        below = await (await self.store()).list_jobs(JobQuery(root_id=root_id, limit=limit))
        return [root, *sorted((JobHandle(self, j) for j in below), key=lambda h: h.id)]

    async def workers(self) -> list[WorkerInfo]:
        return await (await self.store()).workers()

    async def queues(self) -> list[QueueInfo]:
        return await (await self.store()).queues()

    async def pause(self, queue: str) -> None:
        """Stop workers from claiming jobs of ``queue``; running jobs finish."""
        check_queue(queue)
        await (await self.store()).set_paused(queue, True)

    async def resume(self, queue: str) -> None:
        check_queue(queue)
        await (await self.store()).set_paused(queue, False)

    # -- workers ------------------------------------------------------------------------

    def worker(self, options: WorkerOptions | None = None) -> Worker:
        """Return a worker for this application (run it with ``await worker.run()``)."""
        from conveyor.worker import Worker, WorkerOptions

        return Worker(self, options or WorkerOptions())

    @property
    def sync(self) -> Any:
        """Blocking versions of this application's coroutine methods, e.g. ``app.sync.get``."""
        return _blocking.Blocking(self)


def _dependency_ids(value: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
        raise InvalidDependency("depends_on takes a list of job ids, e.g. depends_on=[a.id, b.id]")
    return tuple(dict.fromkeys(value))


def _check_acyclic(jobs: Sequence[NewJob]) -> None:
    """Refuse dependency cycles among jobs submitted together (or a job on itself).

    Jobs already stored cannot be part of a cycle: they cannot depend on a job that does
    not exist yet.
    """
    edges = {job.id: [d for d in job.depends_on] for job in jobs if job.depends_on}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == 2 or node not in edges:
            return
        if state.get(node) == 1:
            cycle = " -> ".join([*path[path.index(node):], node])
            raise InvalidDependency(f"dependency cycle: {cycle}; a job cannot wait for itself")
        state[node] = 1
        for upstream in edges[node]:
            visit(upstream, [*path, node])
        state[node] = 2

    for node in edges:
        visit(node, [])


__all__ = ["Conveyor", "JobDefinition", "JobHandle", "Submission"]

