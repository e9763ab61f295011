"""One tenant's view of an application: what an API token may see and do.

:class:`TenantView` holds the rules every surface that acts for a principal obeys (the
REST API today; a dashboard or a CLI through a server tomorrow), so that tenant isolation
is decided, and tested, below HTTP:

- another tenant's job does not exist (:class:`JobNotFound`), so its existence is not
  revealed;
- a principal submits for its own tenant; only an admin names another;
- a job id or ``Idempotency-Key`` reused with another definition, or taken by another
  tenant's job, is an :class:`IdempotencyConflict`, found before anything is stored so a
  list is all or nothing;
- a job may only wait for jobs its submitter can see;
- only unfinished jobs can be cancelled, only failed or cancelled ones retried, and a retry
  runs the job type's ``authorize=`` check again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from conveyor._handles import JobHandle, JobPage, Submission
from conveyor.client import Conveyor
from conveyor.core.auth import Principal, Role, check_tenant
from conveyor.core.lifecycle import Status
from conveyor.core.model import Attempt, Job
from conveyor.errors import (
    ConfigurationError,
    Forbidden,
    IdempotencyConflict,
    InvalidDependency,
    InvalidState,
    JobNotFound,
)
from conveyor.store.protocol import (
    AuditEntry,
    JobEvent,
    LeaseRecord,
    MinuteStats,
    QueueInfo,
    ScheduleInfo,
    WorkerInfo,
)

BULK_LIMIT = 10_000  # the most jobs one bulk action or count reaches


def keyed_id(tenant: str, key: str, index: int | None) -> str:
    """A job id derived from tenant and Idempotency-Key: the same key, the same job.

    ``index`` is the job's place in a submitted list (None for a single job), so that each
    job of a list gets its own id.

    >>> keyed_id("acme", "k1", None) == keyed_id("acme", "k1", None) != keyed_id("b", "k1", None)
    True
    """
    seed = f"{tenant}\x00{key}\x00{'' if index is None else index}"
    return "idem-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


class TenantView:
    """The jobs of ``principal``'s tenant (of every tenant for an admin) in ``app``."""

    def __init__(self, app: Conveyor, principal: Principal) -> None:
        self.app = app
        self.principal = principal

    @property
    def who(self) -> str:
        """What jobs submitted or retried through this view record as ``submitted_by``."""
        return f"token:{self.principal.token_id}"

    def can_see(self, tenant: str | None) -> bool:
        """Whether a job of ``tenant`` is visible: its own tenant's, or any for an admin."""
        return self.principal.is_admin or tenant == self.principal.tenant

    # -- reading --------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        """Return a visible job; another tenant's job is :class:`JobNotFound`."""
        job = (await self.app.get(job_id)).record
        if not self.can_see(job.tenant):
            raise JobNotFound(job_id)
        return job

    async def attempts(self, job_id: str) -> list[Attempt]:
        """A visible job's attempts, oldest first."""
        await self.get(job_id)
        return await self.app.attempts(job_id)

    async def page(
        self,
        *,
        status: Iterable[Status | str] = (),
        type: str | None = None,
        queue: str | None = None,
        tenant: str | None = None,
        parent_id: str | None = None,
        root_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        include_children: bool = False,
        newest_first: bool = True,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JobPage:
        """One page of visible jobs (see :meth:`Conveyor.page_jobs`).

        Top-level jobs only, unless ``include_children`` or a ``parent_id``/``root_id``
        asks for a tree. ``tenant`` narrows an admin's view to one tenant; anyone else may
        only name their own.
        """
        if tenant is not None and not self.principal.is_admin and tenant != self.principal.tenant:
            raise Forbidden(
                f"this token sees only tenant {self.principal.tenant!r}'s jobs; leave out tenant"
            )
        return await self.app.page_jobs(
            status=status,
            type=type,
            queue=queue,
            tenant=tenant if self.principal.is_admin else self.principal.tenant,
            parent_id=parent_id,
            root_id=root_id,
            created_after=created_after,
            created_before=created_before,
            top_level=not (include_children or parent_id or root_id),
            newest_first=newest_first,
            cursor=cursor,
            limit=limit,
        )

    async def children(self, job_id: str, *, cursor: str | None = None, limit: int = 50) -> JobPage:
        """One page of the jobs a visible job spawned, newest first."""
        await self.get(job_id)
        return await self.app.page_jobs(parent_id=job_id, cursor=cursor, limit=limit)

    # -- writing --------------------------------------------------------------------------

    async def submit(
        self,
        submissions: Sequence[Submission],
        *,
        idempotency_key: str | None = None,
        listed: bool = False,
    ) -> list[tuple[JobHandle, bool]]:
        """Submit jobs for this tenant; say of each whether this call created it.

        A submission's ``tenant`` of None means the principal's own. With an
        ``idempotency_key``, jobs without an id get one derived from tenant and key
        (``listed``: the jobs came as a list, so each one's place is part of its id).
        """
        scoped = []
        for index, sub in enumerate(submissions):
            tenant = self._tenant_for(sub.tenant)
            job_id = sub.id
            if job_id is None and idempotency_key is not None:
                job_id = keyed_id(tenant, idempotency_key, index if listed else None)
            await self.app.authorize(self.principal, sub.type, sub.payload)
            scoped.append(replace(sub, tenant=tenant, id=job_id))
        await self._refuse_conflicts(scoped)
        await self._check_dependencies(scoped)
        results = await self.app.submit_many_reporting(scoped, submitted_by=self.who)
        for handle, created in results:
            if not created and not self.can_see(handle.record.tenant):
                raise IdempotencyConflict(
                    "the unique_key is held by an active job of another tenant: choose another key"
                )
        return results

    async def cancel(self, job_id: str) -> Job:
        """Cancel a visible, unfinished job; a running one is asked to stop (still running)."""
        job = await self.get(job_id)
        if job.terminal:
            raise InvalidState(
                f"job {job_id} is already {job.status.value}: only unfinished jobs can be "
                "cancelled" + ("; retry it instead" if job.status is not Status.SUCCEEDED else "")
            )
        self.require(Role.WRITE)
        reason = f"cancelled through the API (token {self.principal.token_id})"
        after = (await self.app.cancel(job_id, reason=reason)).record
        if after.terminal and after.status is not Status.CANCELLED:
            raise InvalidState(f"job {job_id} ended {after.status.value} before it was cancelled")
        await self.audit("job.cancel", job_id, after.status.value)
        return after

    async def retry(self, job_id: str) -> Job:
        """Retry a visible failed or cancelled job as a new job, checked as a new submit."""
        job = await self.get(job_id)
        if job.status not in (Status.FAILED, Status.CANCELLED):
            raise InvalidState(
                f"job {job_id} is {job.status.value}: only failed or cancelled jobs can be retried"
            )
        self.require(Role.WRITE)
        await self.app.authorize(self.principal, job.type, job.payload)
        new = (await self.app.retry(job_id, submitted_by=self.who)).record
        await self.audit("job.retry", job_id, f"as {new.id}")
        return new

    async def retry_failed_children(self, job_id: str, *, limit: int = BULK_LIMIT) -> list[Job]:
        """Retry every failed job below a visible job (the failures, not the parents they
        failed, which re-open) in one transaction; return the new jobs."""
        self.require(Role.WRITE)
        await self.get(job_id)

        async def check(old: Job) -> None:
            await self.app.authorize(self.principal, old.type, old.payload)

        handles = await self.app.retry_failed_children(
            job_id, limit=limit, submitted_by=self.who, check=check
        )
        new = [h.record for h in handles]
        await self.audit("job.retry_failed_children", job_id, f"{len(new)} children retried")
        return new

    # -- a filtered selection ---------------------------------------------------------------

    async def count(self, filters: Mapping[str, Any], *, limit: int = BULK_LIMIT) -> int:
        """How many visible jobs ``filters`` (the arguments of :meth:`page`) select, up to
        ``limit``: the number a bulk action would act on."""
        return len(await self._ids(filters, limit))

    async def bulk(
        self, action: str, filters: Mapping[str, Any], *, limit: int = BULK_LIMIT
    ) -> int:
        """Cancel (``action="cancel"``) the unfinished jobs, or retry (``"retry"``) the
        failed and cancelled ones, among those ``filters`` select; return how many."""
        self.require(Role.WRITE)
        if action not in ("cancel", "retry"):
            raise ConfigurationError(f"bulk action must be cancel or retry, not {action!r}")
        done = 0
        for job_id in await self._ids(filters, limit):
            try:
                if action == "cancel":
                    reason = f"cancelled in bulk (token {self.principal.token_id})"
                    await self.app.cancel(job_id, reason=reason)
                else:
                    await self._retry_one(job_id)
            except (InvalidState, JobNotFound, Forbidden):
                continue  # ended, changed or refused since it was counted
            done += 1
        described = ", ".join(f"{k}={v}" for k, v in sorted(filters.items()) if v)
        await self.audit(f"jobs.bulk_{action}", described or "all jobs", f"{done} jobs")
        return done

    async def _ids(self, filters: Mapping[str, Any], limit: int) -> list[str]:
        ids: list[str] = []
        cursor = None
        while len(ids) < limit:
            page = await self.page(**filters, cursor=cursor, limit=min(1000, limit - len(ids)))
            ids.extend(h.id for h in page.jobs)
            cursor = page.next
            if cursor is None:
                break
        return ids

    async def _retry_one(self, job_id: str) -> Job:
        job = await self.get(job_id)
        if job.status not in (Status.FAILED, Status.CANCELLED):
            raise InvalidState(f"job {job_id} is {job.status.value}")
        await self.app.authorize(self.principal, job.type, job.payload)
        return (await self.app.retry(job_id, submitted_by=self.who)).record

    async def _retry_quietly(self, job_id: str) -> Job | None:
        try:
            return await self._retry_one(job_id)
        except (InvalidState, JobNotFound, Forbidden):
            return None

    # -- queues, schedules, workers, leases: the cluster's, admins steer them ----------------

    async def queues(self) -> list[QueueInfo]:
        return await self.app.queues()

    async def workers(self) -> list[WorkerInfo]:
        return await self.app.workers()

    async def running_by_worker(self) -> dict[str, int]:
        """How many jobs each worker runs now (every tenant's: workers are the cluster's)."""
        return await self.app.running_by_worker()

    async def pause(self, queue: str) -> None:
        """Stop workers claiming from ``queue`` (admins)."""
        self.require(Role.ADMIN)
        await self.app.pause(queue)
        await self.audit("queue.pause", queue)

    async def resume(self, queue: str) -> None:
        """Let workers claim from ``queue`` again (admins)."""
        self.require(Role.ADMIN)
        await self.app.resume(queue)
        await self.audit("queue.resume", queue)

    async def schedules(self) -> list[ScheduleInfo]:
        return await self.app.list_schedules()

    async def run_schedule(self, name: str) -> Job:
        """Submit a schedule's job now (admins)."""
        self.require(Role.ADMIN)
        job = (await self.app.run_schedule(name)).record
        await self.audit("schedule.run", name, f"as {job.id}")
        return job

    async def enable_schedule(self, name: str, enabled: bool) -> ScheduleInfo:
        """Enable or disable a schedule (admins)."""
        self.require(Role.ADMIN)
        info = await self.app.enable_schedule(name, enabled)
        await self.audit("schedule.enable" if enabled else "schedule.disable", name)
        return info

    async def events(self, job_id: str) -> list[JobEvent]:
        """A visible job's events besides its attempts, oldest first."""
        await self.get(job_id)
        return await self.app.events(job_id)

    async def leases(self) -> list[tuple[str, list[LeaseRecord]]]:
        """Every named lease with its current and last holders, newest first."""
        return await self.app.leases()

    async def minute_stats(self, since: datetime) -> list[MinuteStats]:
        """What ended per minute since ``since``, across the cluster."""
        return await self.app.minute_stats(since)

    # -- the audit log ----------------------------------------------------------------------

    async def audit(self, action: str, target: str, detail: str | None = None) -> None:
        """Record an action of this principal in the audit log."""
        entry = AuditEntry(
            at=await self.app.now(),
            tenant=self.principal.tenant,
            token_id=self.principal.token_id,
            action=action,
            target=target,
            detail=detail,
        )
        await self.app.record_audit(entry)

    async def audit_log(
        self, *, before_id: int | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        """The audit log, newest first: every tenant's for an admin, else the tenant's own."""
        tenant = None if self.principal.is_admin else self.principal.tenant
        return await self.app.audit_log(tenant=tenant, before_id=before_id, limit=limit)

    def require(self, role: Role) -> None:
        """Refuse (:class:`Forbidden`) a principal whose role is below ``role``."""
        if not self.principal.role.allows(role):
            raise Forbidden(
                f"this needs a token with role {role.value!r} or above; token "
                f"{self.principal.token_id} has role {self.principal.role.value!r}"
            )

    # -- the rules ------------------------------------------------------------------------

    def _tenant_for(self, asked: str | None) -> str:
        principal = self.principal
        if asked is None or asked == principal.tenant:
            return principal.tenant
        if not principal.is_admin:
            raise Forbidden(
                f"this token submits for tenant {principal.tenant!r} only; leave out tenant"
            )
        try:
            return check_tenant(asked)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None

    async def _refuse_conflicts(self, submissions: list[Submission]) -> None:
        """Refuse a reused id with another definition before anything is stored.

        Checked first so that a list is all or nothing: a conflict found after the insert
        would leave the rest of the list stored.
        """
        ids = [sub.id for sub in submissions if sub.id is not None]
        if not ids:
            return
        new = {job.id: job for job in self.app.prepare(submissions)}
        for existing in await self.app.get_many(ids):
            job = existing.record
            if not self.can_see(job.tenant):
                raise IdempotencyConflict(
                    f"job id {job.id!r} is taken by another tenant's job: choose another id"
                )
            mine = new[job.id]
            if job.type != mine.type or job.payload != mine.payload:
                raise IdempotencyConflict(
                    f"job {job.id!r} exists with another type or payload; use a new id (or "
                    "Idempotency-Key) for a different job"
                )

    async def _check_dependencies(self, submissions: list[Submission]) -> None:
        """A job may only wait for jobs its submitter can see."""
        if self.principal.is_admin:
            return
        batch = {sub.id for sub in submissions if sub.id}
        wanted = {d for sub in submissions for d in sub.depends_on if d not in batch}
        if not wanted:
            return
        found = await self.app.get_many(sorted(wanted))
        visible = {h.id for h in found if self.can_see(h.record.tenant)}
        missing = sorted(wanted - visible)
        if missing:
            raise InvalidDependency(
                f"depends_on names jobs that do not exist: {', '.join(missing[:10])}"
            )


__all__ = ["TenantView", "keyed_id"]
