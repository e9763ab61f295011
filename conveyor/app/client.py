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
import dataclasses
import os
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from conveyor.app._gcpause import collector_paused
from conveyor.app._results import inserted_handle, submitted_handles
from conveyor.app._stream import streamable, submit_large
from conveyor.app._submit import check_acyclic
from conveyor.app._submit import new_jobs as _new_jobs
from conveyor.app._submit import plain as _plain
from conveyor.app._submit import plain_job as _plain_job
from conveyor.app._sync import SyncConveyor
from conveyor.app._tokens import Tokens
from conveyor.app._trees import DEFAULT_RETRY_LIMIT, Trees
from conveyor.app.handles import (
    JobDefinition,
    JobHandle,
    JobPage,
    JobView,
    Submission,
    decode_cursor,
    encode_cursor,
)
from conveyor.app.health import Health
from conveyor.app.locks import NamedLease
from conveyor.app.ops import Operations
from conveyor.app.registry import (
    Authorize,
    JobOptions,
    JobType,
    Registry,
    check_queue,
    optional_seconds,
)
from conveyor.app.tenants import TenantLimits
from conveyor.core.auth import Principal, Role, Token
from conveyor.core.cron import CatchUp, Cron, Overlap, Schedule
from conveyor.core.durations import Duration
from conveyor.core.filter import FilterKeywords, JobFilter
from conveyor.core.flow import parse_rate
from conveyor.core.ids import new_id, qualify
from conveyor.core.model import JSON, Attempt, NewJob
from conveyor.core.retry import Backoff
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    JobNotFound,
    ScheduleNotFound,
)
from conveyor.observe import tracing
from conveyor.observe.hooks import AttemptEnded, AttemptStarted, Hooks
from conveyor.observe.metrics import Metrics
from conveyor.store import (
    Inserted,
    JobPageQuery,
    LeaseRecord,
    Pooling,
    QueueInfo,
    QueueLag,
    Retention,
    ScheduleInfo,
    Store,
    Submitted,
    UnservedType,
    WorkerInfo,
    create_store,
)
from conveyor.store.protocol import JobEvent
from conveyor.worker import Worker, WorkerOptions

P = ParamSpec("P")
R = TypeVar("R")

DEFAULT_URL = "sqlite:///conveyor.db"


class Conveyor:
    """An application: its job types and its connection to the store.

    On PostgreSQL behind PgBouncer in transaction mode, ``pooler="transaction"`` (env
    ``CONVEYOR_POOLER``) keeps session state off the pooled URL, and ``listen_url`` (env
    ``CONVEYOR_LISTEN_URL``), a direct URL of the same database, carries LISTEN wake-ups.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        clock: Callable[[], float] | None = None,
        migrate: bool = True,
        pooler: str | None = None,
        listen_url: str | None = None,
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_DATABASE_URL") or DEFAULT_URL
        self.clock = clock
        self.migrate_on_open = migrate
        self.pooling = Pooling.configured(pooler=pooler, listen_url=listen_url)
        # Parse the URL now so a malformed one fails at start-up, not at the first submit.
        create_store(self.url, clock=clock, migrate=migrate, pooling=self.pooling)
        self.registry = Registry()
        self.schedules: dict[str, Schedule] = {}
        self._stores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Store] = (
            weakref.WeakKeyDictionary()
        )
        self._opening: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._tokens = Tokens(self.store, self.registry)
        self._trees = Trees(self)
        self.tenants = TenantLimits()  # the operator's per-tenant limits (app/tenants.py)
        # What the REST API and the dashboard need beyond this API (app/ops.py).
        self.ops = Operations(self)
        self.metrics = Metrics()
        self.hooks = Hooks()

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
        authorize: Authorize | None = None,
        concurrency: int | None = None,
        global_concurrency: int | None = None,
        key_concurrency: int | None = None,
        rate_limit: str | None = None,
        retention: Mapping[str, Duration] | None = None,
        retry_limit: int | None = DEFAULT_RETRY_LIMIT,
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
        authorize: Authorize | None = None,
        concurrency: int | None = None,
        global_concurrency: int | None = None,
        key_concurrency: int | None = None,
        rate_limit: str | None = None,
        retention: Mapping[str, Duration] | None = None,
        retry_limit: int | None = DEFAULT_RETRY_LIMIT,
    ) -> JobDefinition[P, R] | Callable[[Callable[P, R]], JobDefinition[P, R]]:
        """Register a handler as a job type (usable as ``@app.job`` or ``@app.job(...)``).

        ``isolation="process"`` runs each attempt in a child process that can be killed
        on timeout or cancel, and whose crash only fails the attempt. Flow control:
        ``concurrency`` (per worker process), ``global_concurrency`` (across the cluster;
        1 makes a singleton), ``key_concurrency`` (per ``concurrency_key`` given at
        submit), ``rate_limit`` such as ``"100/m"`` (starts, across the cluster).
        ``retention`` overrides how long finished jobs are kept, e.g. ``{"succeeded": "1h"}``.
        ``retry_limit``: manual retries a job may have in a chain (None: no limit).
        ``authorize(principal, payload) -> bool`` is an extra check for submits through
        the REST API: returning False or raising refuses the job with 403.
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
                authorize=authorize,
                concurrency=concurrency,
                global_concurrency=global_concurrency,
                key_concurrency=key_concurrency,
                rate_limit=_rate(rate_limit),
                retry_limit=retry_limit,
                retention=tuple(
                    (status, optional_seconds(value, f"retention {status}") or 0.0)
                    for status, value in (retention or {}).items()
                ),
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

    def use_database(
        self, url: str, *, pooler: str | None = None, listen_url: str | None = None
    ) -> None:
        """Point this application at another database (or route) before its first use.

        For tools that load an application and are told its database separately (the
        CLI's ``--database-url``, ``--pooler``, ``--listen-url``; None keeps what the
        application has). The URL is checked as the constructor checks it, and a change
        is refused while a store is open on a running event loop: jobs would be split
        between two databases.
        """
        pooling = self.pooling.changed(pooler=pooler, listen_url=listen_url)
        if url == self.url and pooling == self.pooling:
            return
        create_store(url, clock=self.clock, migrate=self.migrate_on_open, pooling=pooling)
        if any(not loop.is_closed() for loop in self._stores):
            raise ConfigurationError(
                f"this application already uses {self.url}; it cannot move to another database"
            )
        self.url = url
        self.pooling = pooling

    def new_store(self) -> Store:
        """Return a new, unopened store on this application's database."""
        return create_store(
            self.url, clock=self.clock, migrate=self.migrate_on_open, pooling=self.pooling
        )

    async def close(self) -> None:
        """Close this event loop's store."""
        store = self._stores.pop(asyncio.get_running_loop(), None)
        if store is not None:
            await store.close()

    async def migrate(self) -> list[str]:
        """Apply pending migrations; return the names applied."""
        store = create_store(self.url, clock=self.clock, migrate=False, pooling=self.pooling)
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
        concurrency_key: str | None = None,
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
        if (
            id is None
            and queue is None
            and priority is None
            and run_at is None
            and delay is None
            and max_attempts is None
            and timeout is None
            and unique_key is None
            and tenant is None
            and not depends_on
            and concurrency_key is None
            and connection is None
            and not tracing.enabled()
        ):
            return await self._submit_plain(name, {} if payload is None else payload)
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
            concurrency_key=concurrency_key,
        )
        return (await self.submit_many([submission], connection=connection))[0]

    def prepare(
        self, submissions: Sequence[Submission], *, submitted_by: str = "local"
    ) -> list[NewJob]:
        """Validate submissions into jobs ready to insert (raises on bad input);
        ``submitted_by`` says who submits them (``"local"``: code, ``"token:<id>"``...)."""
        # Inside a submit span, the jobs carry its trace context; in a handler, the
        # attempt's (its children's runs then appear under it).
        traceparent = tracing.current_traceparent()
        now = self._wallclock()
        if len(submissions) == 1 and _plain(submissions[0]):  # the common submit
            s = submissions[0]
            return [_plain_job(self.registry, s.type, s.payload, now, traceparent, submitted_by)]
        new_jobs = _new_jobs(self.registry, submissions, now, traceparent, submitted_by)
        check_acyclic(new_jobs)
        return new_jobs

    def handles(self, new_jobs: Sequence[NewJob], results: Sequence[Submitted]) -> list[JobHandle]:
        """Turn a store's submit results into handles, refusing an id reused differently."""
        return submitted_handles(self, self.metrics, new_jobs, results)

    async def submit_many(
        self, submissions: Sequence[Submission], *, connection: Any = None
    ) -> list[JobHandle]:
        """Submit many jobs in one transaction: all of them are stored, or none.

        ``connection``: as for :meth:`submit`, the application's own transaction. A large
        batch holds the cyclic garbage collector off while it runs (app/_gcpause.py).
        """
        if (
            len(submissions) == 1
            and connection is None
            and _plain(submissions[0])
            and not tracing.enabled()
        ):
            s = submissions[0]
            return [await self._submit_plain(s.type, s.payload)]
        with collector_paused(len(submissions)), tracing.submit_span(submissions):
            store = self._stores.get(asyncio.get_running_loop())  # open already?
            if store is not None and streamable(submissions, connection):
                streamed = await submit_large(
                    self, self.metrics, store, self.registry, submissions, self._wallclock()
                )
                if streamed is not None:
                    return streamed
            new_jobs = self.prepare(submissions)
            store = await self.store()
            await self.tenants.check_room(store, new_jobs)
            results = await store.submit(new_jobs, connection=connection)
            return self.handles(new_jobs, results)

    async def _submit_plain(self, name: str, payload: Mapping[str, JSON]) -> JobHandle:
        """Submit one job of type ``name`` that sets nothing but its payload (the common
        submit): no check of a batch, a tenant or a span applies to it. A store that
        inserts a job as it was submitted (SQLite's ``submit_new``) returns it as such,
        and the handle makes the job's record when it is first read."""
        traceparent = tracing.current_traceparent()
        job = _plain_job(self.registry, name, payload, self._wallclock(), traceparent, "local")
        store = self._stores.get(asyncio.get_running_loop()) or await self.store()
        submit_new = getattr(store, "submit_new", None)
        if submit_new is not None:
            inserted: Inserted | None = await submit_new(job)
            if inserted is not None:
                return inserted_handle(self, self.metrics, inserted)
        return self.handles([job], await store.submit([job]))[0]

    def new_job_id(self, tenant: str | None = None) -> str:
        """A new time-sortable job id, as stored for a job of ``tenant``."""
        return qualify(tenant, new_id(self._wallclock()))

    def _wallclock(self) -> float:
        return self.clock() if self.clock is not None else time.time()

    # -- reading and steering -----------------------------------------------------------

    async def get(self, job_id: str) -> JobHandle:
        """Return the job with this id; raise JobNotFound."""
        job = await (await self.store()).get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        return JobHandle(self, job)

    async def page_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        newest_first: bool = True,
        cursor: str | None = None,
        limit: int = 50,
        **keywords: Unpack[FilterKeywords],
    ) -> JobPage:
        """Return one page of jobs in creation order and the cursor of the next page.

        Which jobs: a :class:`~conveyor.JobFilter`, or its keywords (``status``, ``type``,
        ``queue``, ``tenant``, ``parent_id``, ``root_id``, ``created_after``,
        ``created_before``, ``include_children``, ``top_level``). Top-level jobs only,
        unless ``include_children`` or a ``parent_id``/``root_id`` asks for jobs spawned
        by others (``top_level`` decides it explicitly).

        Pages are keyset-paginated on ``(created_at, id)``: pass the page's ``next`` as
        ``cursor`` (with the same filters) for the following page; ``next`` is None on
        the last page.
        """
        if filter is None:
            try:
                filter = JobFilter.of(**keywords)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        elif keywords:
            raise ConfigurationError(
                f"pass a JobFilter or filter keywords, not both (got {sorted(keywords)})"
            )
        if not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise ConfigurationError(f"limit must be between 1 and 1000, not {limit!r}")
        query = JobPageQuery(
            filter=filter,
            newest_first=newest_first,
            after=decode_cursor(cursor) if cursor else None,
            limit=limit + 1,
        )
        jobs = await (await self.store()).page_jobs(query)
        more = len(jobs) > limit
        jobs = jobs[:limit]
        following = encode_cursor(jobs[-1]) if more and jobs else None
        return JobPage([JobHandle(self, j) for j in jobs], following)

    async def list_jobs(
        self,
        filter: JobFilter | None = None,
        *,
        limit: int = 50,
        **keywords: Unpack[FilterKeywords],
    ) -> list[JobHandle]:
        """Return jobs, newest first: the first page of :meth:`page_jobs` (top-level jobs
        unless ``include_children``, or the children of a parent or the tree of a root)."""
        page = await self.page_jobs(filter, limit=limit, **keywords)
        return page.jobs

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

    async def retry(self, job_id: str, *, submitted_by: str = "local") -> JobHandle:
        """Retry a failed or cancelled job as a new job that takes its place below its
        parents (which re-open); ``retry_of`` is the chain's first job, ``retry_count``
        the retries before it. Past the type's ``retry_limit``: :class:`RetryLimitReached`.
        The old row only records ``retried_by``; the new job starts from its checkpoint.
        """
        return await self._trees.retry(job_id, submitted_by=submitted_by)

    async def retry_failed_children(self, job_id: str, **kw: Any) -> list[JobHandle]:
        """Retry every failed job below ``job_id`` (the failures, not the parents they
        failed) in one transaction, re-opening its ancestors once; return the new jobs.
        Options: see :meth:`conveyor.app._trees.Trees.retry_failed_children`."""
        return await self._trees.retry_failed_children(job_id, **kw)

    async def events(self, job_id: str) -> list[JobEvent]:
        """A job's events besides its attempts (``reopened``), oldest first."""
        return await self._trees.events(job_id)

    async def children(self, job_id: str, *, limit: int = 1000) -> list[JobHandle]:
        """Return a job's direct children, newest first."""
        return (await self.page_jobs(parent_id=job_id, limit=limit)).jobs

    async def tree(self, root_id: str, *, limit: int = 10_000) -> list[JobHandle]:
        """Return a job and every job below it (``root_id`` links them), the root first."""
        return await self._trees.tree(root_id, limit=limit)

    async def workers(self) -> list[WorkerInfo]:
        return await (await self.store()).workers()

    async def unserved_types(self) -> list[UnservedType]:
        """The types of queued jobs that no live worker serves (during a rolling deploy:
        a type only the new release knows, while only old workers run)."""
        return await (await self.store()).unserved_types()

    async def queues(self, *, tenant: str | None = None) -> list[QueueInfo]:
        return await (await self.store()).queues(tenant=tenant)

    async def queue_lag(self) -> list[QueueLag]:
        """Per queue with due jobs: how many, and how long the oldest has waited."""
        return await (await self.store()).queue_lag()

    async def pause(self, queue: str) -> None:
        """Stop workers from claiming jobs of ``queue``; running jobs finish."""
        check_queue(queue)
        await (await self.store()).set_paused(queue, True)

    async def resume(self, queue: str) -> None:
        check_queue(queue)
        await (await self.store()).set_paused(queue, False)

    # -- schedules ----------------------------------------------------------------------

    def schedule(
        self,
        name: str,
        cron: str,
        job: str | JobDefinition[Any, Any],
        payload: Mapping[str, JSON] | None = None,
        *,
        timezone: str = "UTC",
        catch_up: str = "skip",
        backfill_limit: int = 10,
        grace: Duration | None = None,
        queue: str | None = None,
        priority: int | None = None,
        overlap: str = "allow",
    ) -> Schedule:
        """Declare a cron schedule; workers sync it to the database when they start.

        Each tick fires exactly once across all workers. ``catch_up`` says what happens
        to ticks missed while no worker ran: ``skip`` them, run ``once`` for all of
        them, or ``backfill`` each (the latest ``backfill_limit``). ``overlap`` says what
        a tick does while the previous run is still pending, queued, running or waiting:
        ``allow`` fires it anyway, ``skip`` skips it (counted in ``skipped_ticks``).
        """
        type_name = job.name if isinstance(job, JobDefinition) else job
        job_type = self.registry.get(type_name)
        options = job_type.options
        try:
            schedule = Schedule(
                name=name,
                cron=Cron(cron, timezone),
                type=type_name,
                payload=job_type.validate(payload or {}),
                queue=queue if queue is not None else options.queue,
                priority=priority if priority is not None else options.priority,
                max_attempts=options.max_attempts,
                timeout=options.timeout,
                lease=options.lease,
                backoff_base=options.backoff.base,
                backoff_cap=options.backoff.cap,
                catch_up=CatchUp(catch_up),
                backfill_limit=backfill_limit,
                grace=optional_seconds(grace, "grace"),
                overlap=Overlap(overlap),
            )
        except ValueError as exc:
            if isinstance(exc, ConveyorError):
                raise
            raise ConfigurationError(f"schedule {name!r}: {exc}") from None
        if name in self.schedules and self.schedules[name] != schedule:
            raise ConfigurationError(f"schedule {name!r} is declared twice")
        self.schedules[name] = schedule
        return schedule

    async def sync_schedules(self) -> None:
        """Write the schedules declared in code to the database."""
        if self.schedules:
            await (await self.store()).sync_schedules(list(self.schedules.values()))

    async def list_schedules(self) -> list[ScheduleInfo]:
        return await (await self.store()).schedules()

    async def enable_schedule(self, name: str, enabled: bool = True) -> ScheduleInfo:
        """Enable (or, with ``enabled=False``, disable) a schedule."""
        info = await (await self.store()).set_schedule_enabled(name, enabled)
        if info is None:
            raise ScheduleNotFound(name)
        return info

    async def run_schedule(self, name: str) -> JobHandle:
        """Submit a schedule's job now, outside its ticks."""
        job = await (await self.store()).run_schedule(name)
        if job is None:
            raise ScheduleNotFound(name)
        return JobHandle(self, job)

    # -- named leases and retention -----------------------------------------------------

    def lease(self, name: str, *, ttl: Duration = 60, owner: str | None = None) -> NamedLease:
        """A named distributed lease: ``async with app.lease("export", ttl="60s") as lease:``.

        Raises :class:`LeaseHeld` when another holder has it. The lease renews itself in
        the background every ttl/3; ``lease.token`` is a fencing token, and ``lease.lost``
        turns true if renewal fails. Use ``with`` instead of ``async with`` in code that is
        not async.
        """
        return NamedLease(self.store, name, ttl=optional_seconds(ttl, "ttl") or 60.0, owner=owner)

    async def lease_history(self, name: str) -> list[LeaseRecord]:
        """The current and last holders of a named lease, newest first."""
        return await (await self.store()).lease_history(name)

    def retention(self, base: Retention | None = None) -> Retention:
        """The retention policy: ``base`` (or the defaults) with the job types' overrides."""
        base = base or Retention()
        per_type = {
            t.name: dict(t.options.retention)
            for t in (self.registry.get(n) for n in self.registry.names())
            if t.options.retention
        }
        return dataclasses.replace(base, per_type={**base.per_type, **per_type})

    async def prune(self, retention: Retention | None = None, *, batch: int = 500) -> int:
        """Delete finished job trees older than their retention, in small batches."""
        store = await self.store()
        policy = self.retention(retention)
        total = 0
        while True:
            deleted = await store.prune(policy, limit=batch)
            total += deleted
            if deleted == 0:
                return total

    # -- workers ------------------------------------------------------------------------

    def on_attempt_start(
        self, fn: Callable[[AttemptStarted], object]
    ) -> Callable[[AttemptStarted], object]:
        """Call ``fn`` as a worker starts each attempt (a decorator; see conveyor.hooks)."""
        self.hooks.attempt_start.append(fn)
        return fn

    def on_attempt_end(
        self, fn: Callable[[AttemptEnded], object]
    ) -> Callable[[AttemptEnded], object]:
        """Call ``fn`` once each attempt's outcome is recorded (a decorator)."""
        self.hooks.attempt_end.append(fn)
        return fn

    def on_final_failure(
        self, fn: Callable[[AttemptEnded], object]
    ) -> Callable[[AttemptEnded], object]:
        """Call ``fn`` when an attempt leaves its job failed for good (a decorator)."""
        self.hooks.final_failure.append(fn)
        return fn

    def worker(self, options: WorkerOptions | None = None) -> Worker:
        """Return a worker for this application (run it with ``await worker.run()``)."""
        return Worker(self, options or WorkerOptions())

    @property
    def sync(self) -> Any:
        """Blocking versions of this application's coroutine methods, e.g. ``app.sync.get``."""
        return SyncConveyor(self)

    # -- health, API tokens --------------------------------------------------------------

    async def health(self) -> Health:
        """Report the cluster's health: counts and ``healthy``, ``degraded`` or ``unhealthy``.

        Each worker is judged by its own lease: live while its newest heartbeat is younger
        than its lease, dead once silent for longer (see :mod:`conveyor.core.health`).
        """
        return Health.of(await (await self.store()).health())

    async def create_token(
        self, *, tenant: str, role: Role | str, name: str | None = None, expires: Any = None
    ) -> tuple[Token, str]:
        """Create an API token (``expires``: a duration; None: never); show its secret once."""
        return await self._tokens.create(tenant=tenant, role=role, name=name, expires=expires)

    async def rotate_token(self, token_id: str, *, grace: Any = 0) -> tuple[Token, str]:
        """Give a token a new secret (shown once); the old one works ``grace`` longer."""
        return await self._tokens.rotate(token_id, grace=grace)

    async def authenticate(self, presented: str) -> Principal | None:
        """Return the principal of a presented API token, or None if it is not valid."""
        return await self._tokens.authenticate(presented)

    async def list_tokens(self) -> list[Token]:
        """Return every API token (revoked ones too), newest first."""
        return await self._tokens.list()

    async def revoke_token(self, token_id: str) -> Token:
        """Revoke an API token: requests bearing it are refused from now on."""
        return await self._tokens.revoke(token_id)

    async def authorize(self, principal: Principal, type: str, payload: Mapping[str, JSON]) -> None:
        """Run the ``authorize=`` check of a job type for ``principal``; raise Forbidden."""
        await self._tokens.authorize(principal, type, payload)


def _rate(value: str | None) -> tuple[int, float] | None:
    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


__all__ = [
    "Conveyor",
    "JobDefinition",
    "JobHandle",
    "JobPage",
    "JobView",
    "NamedLease",
    "Submission",
]
