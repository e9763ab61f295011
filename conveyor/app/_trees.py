"""Trees of jobs, for the :class:`~conveyor.Conveyor` facade: manual retries that take the
place of the job retried (re-opening the parents it failed), retrying the failures of a
whole subtree, and reading a tree.

A manual retry is a new job whose ``retry_of`` is the first job of the chain and whose
``retry_count`` says how many retries came before it; a job type's ``retry_limit``
(default :data:`DEFAULT_RETRY_LIMIT`) caps the chain, and a refused retry says so on the
last failed job. See ``docs/trees.md``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from conveyor.app.handles import JobHandle, JobSource
from conveyor.app.registry import Registry
from conveyor.core.filter import JobFilter
from conveyor.core.lifecycle import Status
from conveyor.core.model import Job, NewJob
from conveyor.core.retry import retry_limit_note
from conveyor.errors import (
    Forbidden,
    InvalidState,
    JobNotFound,
    RetryLimitReached,
    UnknownJobType,
)
from conveyor.store.protocol import JobEvent, JobPageQuery, OperatorStore


class TreeHost(JobSource, Protocol):
    """What trees need of the application (a Conveyor satisfies it)."""

    @property
    def registry(self) -> Registry: ...

    async def store(self) -> OperatorStore: ...

    def new_job_id(self, tenant: str | None = None) -> str: ...


# Manual retries of one job (a chain of retries) allowed unless its type says otherwise.
DEFAULT_RETRY_LIMIT = 10
# The most jobs "retry failed children" retries in one call.
BULK_LIMIT = 10_000


class Trees:
    """Retries and tree reads of one application."""

    def __init__(self, app: TreeHost) -> None:
        self.app = app

    def retry_limit(self, job_type: str) -> int | None:
        """The manual retries a chain of this type may have (None: no limit)."""
        try:
            return self.app.registry.get(job_type).options.retry_limit
        except UnknownJobType:
            return DEFAULT_RETRY_LIMIT

    async def retry(self, job_id: str, *, submitted_by: str = "local") -> JobHandle:
        """Retry a failed or cancelled job as a new job that takes its place."""
        old = (await self.app.get(job_id)).record
        if old.status not in (Status.FAILED, Status.CANCELLED):
            raise InvalidState(
                f"job {job_id} is {old.status.value}: only failed or cancelled jobs can be retried"
            )
        if old.retried_by is not None:
            raise InvalidState(
                f"job {job_id} was already retried as {old.retried_by}: retry that job instead"
            )
        limit = self.retry_limit(old.type)
        if limit is not None and old.retry_count >= limit:
            await self._refuse(old, limit)
        store = await self.app.store()
        job = await store.retry(
            job_id, retry_job(old, self.app.new_job_id(old.tenant), submitted_by)
        )
        if job is None:
            raise JobNotFound(job_id)
        return JobHandle(self.app, job)

    async def _refuse(self, old: Job, limit: int) -> None:
        note = retry_limit_note(limit=limit, first_id=old.retry_of or old.id)
        if old.error is None or note not in old.error:
            error = note if not old.error else f"{old.error}; {note}"
            await (await self.app.store()).note_retry_limit(old.id, error)
        raise RetryLimitReached(
            f"job {old.id} cannot be retried: {note}, the limit of type {old.type!r} "
            f"(its retry_limit={limit}); submit a new job if it must run again"
        )

    async def retry_failed_children(
        self,
        job_id: str,
        *,
        limit: int = BULK_LIMIT,
        submitted_by: str = "local",
        check: Callable[[Job], Awaitable[None]] | None = None,
    ) -> list[JobHandle]:
        """Retry every failed job below ``job_id`` that a retry fixes (not the parents
        that failed because of them), in one transaction: its failed ancestors re-open
        once. A job at its retry limit, or that ``check`` refuses (raises Forbidden), is
        left out. Returns the new jobs."""
        await self.app.get(job_id)
        store = await self.app.store()
        failed = await store.get_many(await store.failed_below(job_id, limit=limit))
        retries = []
        for old in sorted(failed, key=lambda j: j.id):
            limit_of_type = self.retry_limit(old.type)
            if limit_of_type is not None and old.retry_count >= limit_of_type:
                try:
                    await self._refuse(old, limit_of_type)
                except RetryLimitReached:
                    continue
            if check is not None:
                try:
                    await check(old)
                except Forbidden:
                    continue
            new = retry_job(old, self.app.new_job_id(old.tenant), submitted_by)
            retries.append((old.id, new))
        return [JobHandle(self.app, j) for j in await store.retry_many(retries)]

    async def events(self, job_id: str) -> list[JobEvent]:
        """A job's events besides its attempts (``reopened``), oldest first."""
        await self.app.get(job_id)
        return await (await self.app.store()).job_events(job_id)

    async def tree(self, root_id: str, *, limit: int = 10_000) -> list[JobHandle]:
        """A job and every job below it (``root_id`` links them): the root first."""
        root = await self.app.get(root_id)
        query = JobPageQuery(JobFilter(root_id=root_id), newest_first=False, limit=limit)
        below = await (await self.app.store()).page_jobs(query)
        return [root, *sorted((JobHandle(self.app, j) for j in below), key=lambda h: h.id)]


def retry_job(old: Job, job_id: str, submitted_by: str) -> NewJob:
    """The job that retries ``old``: its definition and last checkpoint, in its place."""
    return NewJob(
        id=job_id,
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
        retry_of=old.retry_of or old.id,
        retry_count=old.retry_count + 1,
        state=old.state,
        submitted_by=submitted_by,
    )
