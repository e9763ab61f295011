"""Tenants, in one place: the operator's limits per tenant (:class:`TenantLimits`) and one
tenant's view of an application (:class:`TenantView`).

**Limits**: how many of a tenant's jobs may run at once, start
per period, and wait in the queues.

Set in Python on the application (``app.tenants.limit("acme", concurrency=5)``) or with
``--tenant-limit acme:concurrency=5,rate=100/m,max_queued=10000`` on ``conveyor worker``
and ``conveyor serve``; ``"*"`` sets the limit of every tenant without one of its own.
Concurrency and rate are kept by each claim, on both backends (store/_fairness.py);
``max_queued`` by each submit of a tenant's jobs, which is refused beyond it.

**Isolation**: what an API token may see and do.

:class:`TenantView` holds the rules every surface that acts for a principal obeys (the
REST API today; a dashboard or a CLI through a server tomorrow), so that tenant isolation
is decided, and tested, below HTTP:

- another tenant's job does not exist (:class:`JobNotFound`), so its existence is not
  revealed;
- a principal submits for its own tenant; only an admin names another;
- job ids, ``Idempotency-Key``-derived ids and unique keys are per tenant: a tenant's
  job is stored under ``tenant/id`` (core/ids.py), and a principal that is not an admin
  names and sees its jobs by their bare ids, so no name of one tenant is observable or
  occupiable by another; admins name jobs by their stored ids;
- a job id or ``Idempotency-Key`` reused with another definition is an
  :class:`IdempotencyConflict`, found before anything is stored; a list is stored in one
  transaction, all or nothing;
- a job may only wait for jobs of its own tenant;
- only unfinished jobs can be cancelled, only failed or cancelled ones retried, and a retry
  runs the job type's ``authorize=`` check again.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from conveyor.app.handles import JobHandle, JobPage, Submission
from conveyor.core.auth import Principal, Role, check_tenant
from conveyor.core.filter import JobFilter
from conveyor.core.flow import TenantLimit, parse_rate, parse_tenant_limit
from conveyor.core.ids import SEPARATOR, local, qualify
from conveyor.core.lifecycle import Status
from conveyor.core.model import Attempt, Job, NewJob
from conveyor.errors import (
    ConfigurationError,
    Forbidden,
    IdempotencyConflict,
    InvalidDependency,
    InvalidState,
    JobNotFound,
    TooManyQueued,
)
from conveyor.store import SubmitStore
from conveyor.store.protocol import (
    AuditEntry,
    JobEvent,
    LeaseRecord,
    MinuteStats,
    QueueInfo,
    ScheduleInfo,
    UnservedType,
    WorkerInfo,
)

if TYPE_CHECKING:
    from conveyor.app.client import Conveyor

BULK_LIMIT = 10_000  # the most jobs one bulk action or count reaches


def _parsed(filters: Mapping[str, Any]) -> JobFilter:
    """The filter of a bulk action's fields (the keywords of :meth:`JobFilter.of`)."""
    try:
        return JobFilter.of(**filters)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def keyed_id(tenant: str, key: str, index: int | None) -> str:
    """A job id derived from tenant and Idempotency-Key: the same key, the same job.

    ``index`` is the job's place in a submitted list (None for a single job), so that each
    job of a list gets its own id.

    >>> keyed_id("acme", "k1", None) == keyed_id("acme", "k1", None) != keyed_id("b", "k1", None)
    True
    """
    seed = f"{tenant}\x00{key}\x00{'' if index is None else index}"
    return "idem-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def as_its_tenant_sees(job: Job) -> Job:
    """``job`` with the ids its tenant knows it and its relatives by (without the prefix)."""
    tenant = job.tenant
    if tenant is None:
        return job
    return replace(
        job,
        id=local(tenant, job.id),
        parent_id=None if job.parent_id is None else local(tenant, job.parent_id),
        root_id=None if job.root_id is None else local(tenant, job.root_id),
        depends_on=tuple(local(tenant, d) for d in job.depends_on),
        retry_of=None if job.retry_of is None else local(tenant, job.retry_of),
        retried_by=None if job.retried_by is None else local(tenant, job.retried_by),
    )


# A worker's id carries its host name and process id (worker.py); a principal that is not an
# admin sees an opaque label instead, the same for one worker on every page and every server
# of one database: an HMAC of the id under a key derived from the database's own secret.
_LABEL_KEYS: weakref.WeakKeyDictionary[Conveyor, bytes] = weakref.WeakKeyDictionary()
# Where a worker's id appears in text a tenant may read: the error of a rescued attempt.
_WORKER_IN_TEXT = re.compile(r"\bworker (\S+) stopped heartbeating")


def worker_label(key: bytes, worker_id: str) -> str:
    """The label a tenant sees for the worker ``worker_id``: opaque, and stable for a key.

    >>> worker_label(b"k" * 32, "vm-22506-d251cc")
    'worker-444703315244'
    """
    return "worker-" + hmac.new(key, worker_id.encode(), hashlib.sha256).hexdigest()[:12]


async def _label_key(app: Conveyor) -> bytes:
    key = _LABEL_KEYS.get(app)
    if key is None:
        secret = await (await app.store()).server_secret("cursor")
        # Without the migrations' secret, one of this process: labels then differ by server.
        seed = secret.encode() if secret is not None else secrets.token_bytes(32)
        key = _LABEL_KEYS[app] = hmac.new(seed, b"worker labels", hashlib.sha256).digest()
    return key


# What a submission sets of a job, compared field by field when an id or key is reused;
# the values of these are shown in the refusal (the payload and links are only named).
_SHOWN_FIELDS = ("type", "queue", "priority", "max_attempts", "timeout", "unique_key")
_SAME_TIME = 0.001  # seconds: the stores keep times to the microsecond (PostgreSQL)


def request_differences(job: Job, new: NewJob) -> list[str]:
    """What of the request ``new`` differs from the one that stored ``job``, as
    ``"queue: 'default' before, 'media' now"``; empty when it is the same request.

    Every field a submission sets is compared, with the job type's defaults filled in on
    both sides (leaving out ``queue`` is asking for the type's queue). The time (``run_at``
    or ``delay``) is compared while the job has not started: its first run is then still
    the one asked for, whereas a retry moves it.
    """
    found: list[str] = []
    for name in _SHOWN_FIELDS:
        before, now = getattr(job, name), getattr(new, name)
        if before != now:
            found.append(f"{name}: {before!r} before, {now!r} now")
    if job.payload != new.payload:
        found.append("payload: another one")
    if sorted(job.depends_on) != sorted(new.depends_on):
        found.append("depends_on: other jobs")
    if job.attempt == 0:
        if new.run_at is not None:
            if abs((job.run_at - new.run_at).total_seconds()) > _SAME_TIME:
                found.append(
                    f"run_at: {job.run_at.isoformat()} before, {new.run_at.isoformat()} now"
                )
        else:
            asked = (job.run_at - job.created_at).total_seconds()
            if abs(asked - new.delay) > _SAME_TIME:
                found.append(f"delay: {asked:g} s before, {new.delay:g} s now")
    return found


class TenantView:
    """The jobs of ``principal``'s tenant (of every tenant for an admin) in ``app``."""

    def __init__(self, app: Conveyor, principal: Principal, *, surface: str = "the API") -> None:
        self.app = app
        self.principal = principal
        # Where the principal acts from, as a cancel's reason names it ("the dashboard").
        self.surface = surface

    @property
    def who(self) -> str:
        """What jobs submitted or retried through this view record as ``submitted_by``."""
        return f"token:{self.principal.token_id}"

    def can_see(self, tenant: str | None) -> bool:
        """Whether a job of ``tenant`` is visible: its own tenant's, or any for an admin."""
        return self.principal.is_admin or tenant == self.principal.tenant

    # -- names: the principal's ids and the stored ones ---------------------------------------

    def stored_id(self, job_id: str) -> str:
        """The stored id of the job this principal calls ``job_id``.

        An admin names jobs by their stored ids; anyone else by their ids in its tenant
        (a ``/`` in one names no job of theirs: :class:`JobNotFound`).
        """
        if self.principal.is_admin:
            return job_id
        try:
            return qualify(self.principal.tenant, job_id)
        except ValueError:
            raise JobNotFound(job_id) from None

    def _filter_id(self, job_id: str) -> str:
        """A stored id to filter by: a name outside the tenant matches no job (no error)."""
        try:
            return self.stored_id(job_id)
        except JobNotFound:
            return f"{self.principal.tenant}{SEPARATOR}{job_id}"

    def shown(self, job: Job) -> Job:
        """``job`` with the ids this principal knows it and its relatives by, and its
        worker's id as this principal may see it."""
        if self.principal.is_admin:
            return job
        job = as_its_tenant_sees(job)
        if job.lease_owner is None and job.error is None:
            return job
        owner = None if job.lease_owner is None else self.worker_name(job.lease_owner)
        return replace(job, lease_owner=owner, error=self._named_in(job.error))

    # -- workers: an admin sees their ids; anyone else an opaque label --------------------

    async def _know_workers(self) -> None:
        """Read the key of workers' labels once per application (for :meth:`worker_name`)."""
        if not self.principal.is_admin:
            await _label_key(self.app)

    def worker_name(self, worker_id: str) -> str:
        """How this principal sees the worker ``worker_id``: by its id (which carries its
        host name and process id) if an admin, else by an opaque label."""
        if self.principal.is_admin or not worker_id:
            return worker_id
        key = _LABEL_KEYS.get(self.app)
        return "worker" if key is None else worker_label(key, worker_id)

    def _named_in(self, text: str | None) -> str | None:
        """``text`` with the worker ids it holds as this principal sees them."""
        if text is None or self.principal.is_admin:
            return text
        return _WORKER_IN_TEXT.sub(
            lambda m: f"worker {self.worker_name(m.group(1))} stopped heartbeating", text
        )

    def _shown_page(self, page: JobPage) -> JobPage:
        if self.principal.is_admin:
            return page
        return JobPage([JobHandle(self.app, self.shown(h.record)) for h in page.jobs], page.next)

    # -- reading --------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job:
        """Return a visible job; another tenant's job is :class:`JobNotFound`."""
        return self.shown(await self._get_stored(job_id))

    async def _get_stored(self, job_id: str) -> Job:
        """A visible job as stored (the principal's ``job_id``)."""
        await self._know_workers()
        try:
            job = (await self.app.get(self.stored_id(job_id))).record
        except JobNotFound:
            raise JobNotFound(job_id) from None
        if not self.can_see(job.tenant):
            raise JobNotFound(job_id)
        return job

    async def attempts(self, job_id: str) -> list[Attempt]:
        """A visible job's attempts, oldest first."""
        job = await self._get_stored(job_id)
        attempts = await self.app.attempts(job.id)
        if self.principal.is_admin:
            return attempts
        return [
            replace(
                a,
                job_id=local(job.tenant, a.job_id),
                worker_id=None if a.worker_id is None else self.worker_name(a.worker_id),
                error=self._named_in(a.error),
            )
            for a in attempts
        ]

    async def page(
        self,
        filter: JobFilter,
        *,
        newest_first: bool = True,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JobPage:
        """One page of visible jobs (see :meth:`Conveyor.page_jobs`).

        ``filter.tenant`` narrows an admin's view to one tenant; anyone else may only name
        their own. Its ``parent_id`` and ``root_id`` are ids as the principal names them.
        """
        found = await self._page_stored(
            self._stored(filter), newest_first=newest_first, cursor=cursor, limit=limit
        )
        return self._shown_page(found)

    async def _page_stored(
        self,
        filter: JobFilter,
        *,
        newest_first: bool = True,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JobPage:
        """:meth:`page` with stored ids, in and out."""
        await self._know_workers()
        tenant = filter.tenant
        if tenant is not None and not self.principal.is_admin and tenant != self.principal.tenant:
            raise Forbidden(
                f"this token sees only tenant {self.principal.tenant!r}'s jobs; leave out tenant"
            )
        if not self.principal.is_admin:
            filter = replace(filter, tenant=self.principal.tenant)
        return await self.app.page_jobs(
            filter, newest_first=newest_first, cursor=cursor, limit=limit
        )

    async def children(self, job_id: str, *, cursor: str | None = None, limit: int = 50) -> JobPage:
        """One page of the jobs a visible job spawned, newest first."""
        job = await self._get_stored(job_id)
        found = await self.app.page_jobs(parent_id=job.id, cursor=cursor, limit=limit)
        return self._shown_page(found)

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
        await self._know_workers()
        scoped = []
        for index, sub in enumerate(submissions):
            tenant = self._tenant_for(sub.tenant)
            job_id = sub.id
            if job_id is None and idempotency_key is not None:
                job_id = keyed_id(tenant, idempotency_key, index if listed else None)
            await self.app.authorize(self.principal, sub.type, sub.payload)
            scoped.append(replace(sub, tenant=tenant, id=job_id))
        # Ids and the ids waited for are qualified with the tenant here (core/ids.py).
        prepared = self.app.prepare(scoped)
        await self._refuse_conflicts(prepared)
        await self._check_dependencies(prepared)
        # One transaction: a refusal in the store (a job of another tenant returned for a
        # name, which the namespaces rule out) rolls the whole list back.
        results = await self.app.ops.submit_many_reporting(scoped, submitted_by=self.who)
        return [(JobHandle(self.app, self.shown(h.record)), new) for h, new in results]

    async def cancel(self, job_id: str) -> Job:
        """Cancel a visible, unfinished job; a running one is asked to stop (still running)."""
        job = await self._get_stored(job_id)
        if job.terminal:
            raise InvalidState(
                f"job {job_id} is already {job.status.value}: only unfinished jobs can be "
                "cancelled" + ("; retry it instead" if job.status is not Status.SUCCEEDED else "")
            )
        self.require(Role.WRITE)
        reason = f"cancelled through {self.surface} (token {self.principal.token_id})"
        after = (await self.app.cancel(job.id, reason=reason)).record
        if after.terminal and after.status is not Status.CANCELLED:
            raise InvalidState(f"job {job_id} ended {after.status.value} before it was cancelled")
        await self.audit("job.cancel", job_id, after.status.value)
        return self.shown(after)

    async def retry(self, job_id: str) -> Job:
        """Retry a visible failed or cancelled job as a new job, checked as a new submit."""
        job = await self._get_stored(job_id)
        if job.status not in (Status.FAILED, Status.CANCELLED):
            raise InvalidState(
                f"job {job_id} is {job.status.value}: only failed or cancelled jobs can be retried"
            )
        self.require(Role.WRITE)
        await self.app.authorize(self.principal, job.type, job.payload)
        new = self.shown((await self.app.retry(job.id, submitted_by=self.who)).record)
        await self.audit("job.retry", job_id, f"as {new.id}")
        return new

    async def retry_failed_children(self, job_id: str, *, limit: int = BULK_LIMIT) -> list[Job]:
        """Retry every failed job below a visible job (the failures, not the parents they
        failed, which re-open) in one transaction; return the new jobs."""
        self.require(Role.WRITE)
        parent = await self._get_stored(job_id)

        async def check(old: Job) -> None:
            await self.app.authorize(self.principal, old.type, old.payload)

        handles = await self.app.retry_failed_children(
            parent.id, limit=limit, submitted_by=self.who, check=check
        )
        new = [self.shown(h.record) for h in handles]
        await self.audit("job.retry_failed_children", job_id, f"{len(new)} children retried")
        return new

    # -- a filtered selection ---------------------------------------------------------------

    async def count(self, filters: Mapping[str, Any], *, limit: int = BULK_LIMIT) -> int:
        """How many visible jobs ``filters`` (the arguments of :meth:`page`) select, up to
        ``limit``: the number a bulk action would act on."""
        return len(await self._ids(self._stored(_parsed(filters)), limit))

    async def bulk(
        self, action: str, filters: Mapping[str, Any], *, limit: int = BULK_LIMIT
    ) -> int:
        """Cancel (``action="cancel"``) the unfinished jobs, or retry (``"retry"``) the
        failed and cancelled ones, among those ``filters`` select; return how many."""
        self.require(Role.WRITE)
        if action not in ("cancel", "retry"):
            raise ConfigurationError(f"bulk action must be cancel or retry, not {action!r}")
        done = 0
        for job_id in await self._ids(self._stored(_parsed(filters)), limit):
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

    def _stored(self, filter: JobFilter) -> JobFilter:
        """``filter`` with the principal's ids made stored ids."""
        return replace(
            filter,
            parent_id=None if filter.parent_id is None else self._filter_id(filter.parent_id),
            root_id=None if filter.root_id is None else self._filter_id(filter.root_id),
        )

    async def _ids(self, filter: JobFilter, limit: int) -> list[str]:
        """The stored ids of the visible jobs ``filter`` (with stored ids) selects."""
        ids: list[str] = []
        cursor = None
        while len(ids) < limit:
            page = await self._page_stored(filter, cursor=cursor, limit=min(1000, limit - len(ids)))
            ids.extend(h.id for h in page.jobs)
            cursor = page.next
            if cursor is None:
                break
        return ids

    async def _retry_one(self, job_id: str) -> Job:
        job = await self._get_stored(job_id)
        if job.status not in (Status.FAILED, Status.CANCELLED):
            raise InvalidState(f"job {job_id} is {job.status.value}")
        await self.app.authorize(self.principal, job.type, job.payload)
        return (await self.app.retry(job_id, submitted_by=self.who)).record

    # -- queues, schedules, workers, locks: the cluster's, admins steer them ----------------

    # A principal that is not an admin sees the counts of its own tenant's jobs only, and
    # the workers without their hosts and process ids (the operator's, not the tenant's):
    # not even inside their ids, which it sees as labels (worker_name).

    async def queues(self) -> list[QueueInfo]:
        """The queues with their job counts: the tenant's jobs only, unless an admin."""
        if self.principal.is_admin:
            return await self.app.queues()
        return await self.app.queues(tenant=self.principal.tenant)

    async def unserved_types(self) -> list[UnservedType]:
        """The types no live worker serves: an admin's concern (none for a tenant)."""
        return await self.app.unserved_types() if self.principal.is_admin else []

    async def workers(self) -> list[WorkerInfo]:
        """The workers; a principal that is not an admin does not see hosts and pids."""
        workers = await self.app.workers()
        if self.principal.is_admin:
            return workers
        await self._know_workers()
        return [replace(w, id=self.worker_name(w.id), hostname="", pid=0) for w in workers]

    async def running_by_worker(self) -> dict[str, int]:
        """How many jobs each worker runs now: of the tenant's jobs, unless an admin."""
        if self.principal.is_admin:
            return await self.app.ops.running_by_worker()
        await self._know_workers()
        counts = await self.app.ops.running_by_worker(tenant=self.principal.tenant)
        return {self.worker_name(w): n for w, n in counts.items()}

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
        job = await self._get_stored(job_id)
        return [replace(e, job_id=job_id) for e in await self.app.events(job.id)]

    async def locks(self) -> list[tuple[str, list[LeaseRecord]]]:
        """Every named lock (``app.lease``) with its current and last holders, newest first;
        its holders are workers or other processes, named as :meth:`worker_name` names
        workers."""
        locks = await self.app.ops.locks()
        if self.principal.is_admin:
            return locks
        await self._know_workers()
        return [
            (name, [replace(h, owner=self.worker_name(h.owner)) for h in holders])
            for name, holders in locks
        ]

    async def minute_stats(self, since: datetime) -> list[MinuteStats]:
        """What ended per minute since ``since``: of the tenant's jobs, unless an admin (then
        across the cluster). Another tenant's throughput is not the principal's to see."""
        if self.principal.is_admin:
            return await self.app.ops.minute_stats(since)
        return await self.app.ops.minute_stats(since, tenant=self.principal.tenant)

    # -- the audit log ----------------------------------------------------------------------

    async def audit(self, action: str, target: str, detail: str | None = None) -> None:
        """Record an action of this principal in the audit log."""
        entry = AuditEntry(
            at=await self.app.ops.now(),
            tenant=self.principal.tenant,
            token_id=self.principal.token_id,
            action=action,
            target=target,
            detail=detail,
        )
        await self.app.ops.record_audit(entry)

    async def audit_log(
        self, *, before_id: int | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        """The audit log, newest first: every tenant's for an admin, else the tenant's own."""
        tenant = None if self.principal.is_admin else self.principal.tenant
        return await self.app.ops.audit_log(tenant=tenant, before_id=before_id, limit=limit)

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

    async def _refuse_conflicts(self, jobs: list[NewJob]) -> None:
        """Refuse a reused id with another definition before anything is stored.

        The ids are the tenant's own (qualified), so an existing job found here is one of
        the same tenant's; checked first, so that nothing of a refused list is stored.
        """
        new = {job.id: job for job in jobs}
        for existing in await self.app.ops.get_many(list(new)):
            job = existing.record
            mine = new[job.id]
            if job.tenant != mine.tenant:  # a row that predates the namespaces
                raise IdempotencyConflict(
                    f"job id {local(mine.tenant, mine.id)!r} is taken: choose another id"
                )
            differences = request_differences(job, mine)
            if differences:
                raise IdempotencyConflict(
                    f"job {local(job.tenant, job.id)!r} was submitted with another request "
                    f"(its id or Idempotency-Key is reused): {'; '.join(differences)}. Send "
                    "the same request again to get the job back, or use a new id (or "
                    "Idempotency-Key) for a different job"
                )

    async def _check_dependencies(self, jobs: list[NewJob]) -> None:
        """A job may only wait for jobs of its own tenant (its ids are qualified with it)."""
        batch = {job.id for job in jobs}
        wanted = {d for job in jobs for d in job.depends_on if d not in batch}
        if not wanted:
            return
        found = await self.app.ops.get_many(sorted(wanted))
        visible = {h.id for h in found if self.can_see(h.record.tenant)}
        missing = sorted(wanted - visible)
        if missing:
            shown = [d if self.principal.is_admin else d.partition(SEPARATOR)[2] for d in missing]
            raise InvalidDependency(
                f"depends_on names jobs that do not exist: {', '.join(shown[:10])}"
            )


__all__ = ["TenantLimits", "TenantView", "as_its_tenant_sees", "keyed_id", "request_differences"]


class TenantLimits:
    """Each tenant's :class:`TenantLimit` (``"*"``: of every tenant without its own)."""

    def __init__(self) -> None:
        self._limits: dict[str, TenantLimit] = {}

    @property
    def limits(self) -> Mapping[str, TenantLimit]:
        return self._limits

    def limit(
        self,
        tenant: str,
        *,
        concurrency: int | None = None,
        rate: str | None = None,
        max_queued: int | None = None,
    ) -> TenantLimit:
        """Limit ``tenant``'s jobs: at most ``concurrency`` running across the cluster, at
        most ``rate`` starts (``"100/m"``), at most ``max_queued`` queued. None: no limit."""
        try:
            limit = TenantLimit(
                concurrency=concurrency,
                rate=None if rate is None else parse_rate(rate),
                max_queued=max_queued,
            )
        except ValueError as exc:
            raise ConfigurationError(f"tenant {tenant!r}: {exc}") from None
        self._limits[tenant] = limit
        return limit

    def parse(self, specs: Sequence[str]) -> None:
        """Apply ``TENANT:concurrency=N,rate=COUNT/PERIOD,max_queued=N`` specifications."""
        for spec in specs:
            try:
                tenant, limit = parse_tenant_limit(spec)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
            self._limits[tenant] = limit

    def of(self, tenant: str) -> TenantLimit | None:
        return self._limits.get(tenant, self._limits.get("*"))

    async def check_room(self, store: SubmitStore, jobs: Sequence[NewJob]) -> None:
        """Refuse (:class:`TooManyQueued`) jobs that would take a tenant past its
        ``max_queued``; checked before the submit, so concurrent submits may each pass."""
        wanted = Counter(job.tenant for job in jobs if job.tenant is not None)
        for tenant, n in wanted.items():
            limit = self.of(tenant)
            if limit is None or limit.max_queued is None:
                continue
            queued = await store.count_queued(tenant)
            if queued + n > limit.max_queued:
                raise TooManyQueued(
                    f"tenant {tenant!r} has {queued} jobs queued and may have at most "
                    f"{limit.max_queued}: submit again once some have run"
                )
