"""The operator service, ``app.ops``: what the REST API and the dashboard need beyond the
application API, kept off the :class:`~conveyor.Conveyor` facade.

Application code submits and reads jobs through the facade. The surfaces that act for a
principal (the REST API and the dashboard, both through
:class:`~conveyor.app.tenants.TenantView`) also need the store's clock, the audit log,
per-minute statistics, named locks and per-worker counts, and a submit that reports
whether each job was created. Those live here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from conveyor.app._gcpause import collector_paused
from conveyor.app.handles import JobHandle, Submission
from conveyor.observe import tracing
from conveyor.store.protocol import (
    AuditEntry,
    LeaseRecord,
    MinuteStats,
    OperatorStore,
    SubmitStore,
)

if TYPE_CHECKING:
    from conveyor.app.client import Conveyor


class Operations:
    """Operator reads and records of one application (``app.ops``)."""

    def __init__(self, app: Conveyor) -> None:
        self._app = app

    async def _store(self) -> OperatorStore:
        """The application's store, in the role the operator's reads and records use."""
        return await self._app.store()

    # -- the REST API's submits and reads -------------------------------------------------

    async def submit_many_reporting(
        self, submissions: Sequence[Submission], *, submitted_by: str = "local"
    ) -> list[tuple[JobHandle, bool]]:
        """Submit as :meth:`submit_many`; also say whether each job was created by this call.

        False means an existing job was returned: the same id, or an active job holding
        the same ``unique_key``.
        """
        with collector_paused(len(submissions)), tracing.submit_span(submissions):
            new_jobs = self._app.prepare(submissions, submitted_by=submitted_by)
            store: SubmitStore = await self._app.store()
            await self._app.tenants.check_room(store, new_jobs)
            results = await store.submit(new_jobs)
            handles = self._app.handles(new_jobs, results)
        return [(h, r.created) for h, r in zip(handles, results, strict=True)]

    async def get_many(self, job_ids: Sequence[str]) -> list[JobHandle]:
        """Return the jobs that exist among ``job_ids``, in one query, in no given order."""
        if not job_ids:
            return []
        jobs = await (await self._store()).get_many(list(dict.fromkeys(job_ids)))
        return [JobHandle(self._app, j) for j in jobs]

    # -- what the dashboard reads and records -------------------------------------------

    async def now(self) -> datetime:
        """The store's clock (the database's, where it has one)."""
        return await (await self._store()).now()

    async def record_audit(self, entry: AuditEntry) -> None:
        """Append an action to the audit log."""
        await (await self._store()).record_audit(entry)

    async def audit_log(
        self, *, tenant: str | None = None, before_id: int | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        """The audit log, newest first (``tenant``: only that tenant's entries)."""
        return await (await self._store()).audit_log(
            tenant=tenant, before_id=before_id, limit=limit
        )

    async def minute_stats(
        self, since: datetime, *, tenant: str | None = None
    ) -> list[MinuteStats]:
        """Jobs ended and failed, and their mean queue wait, per minute since ``since``:
        across the cluster, or of ``tenant``'s jobs only."""
        return await (await self._store()).minute_stats(since, tenant=tenant)

    async def locks(self) -> list[tuple[str, list[LeaseRecord]]]:
        """Every named lock (``app.lease``) with its current and last holders, newest first."""
        store = await self._store()
        return [(name, await store.lease_history(name)) for name in await store.lease_names()]

    async def running_by_worker(self, *, tenant: str | None = None) -> dict[str, int]:
        """How many jobs each worker is running now (``tenant``: of that tenant's jobs)."""
        return await (await self._store()).running_by_worker(tenant=tenant)
