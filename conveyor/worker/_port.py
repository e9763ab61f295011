"""A running job's way to the worker and the store (:class:`JobPort` of its context)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.core.model import JSON, NewJob, Progress
from conveyor.store import WorkerStore
from conveyor.worker._leases import Interrupt, Leases, Run

if TYPE_CHECKING:
    from conveyor.app.handles import JobHandle, Submission
    from conveyor.worker._host import WorkerHost


def _outcome_ignored(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a write its caller stopped waiting for (it was fenced)."""
    if not task.cancelled():
        task.exception()


class Port:
    """A running job's way to the worker and the store; every write carries its lease."""

    def __init__(self, run: Run, leases: Leases, store: WorkerStore, app: WorkerHost) -> None:
        self.run = run
        self.leases = leases
        self.store = store
        self.app = app

    def report_progress(self, progress: Progress) -> None:
        self.leases.report_progress(self.run.key, progress)

    async def save_state(self, state: JSON) -> bool:
        json.dumps(state, allow_nan=False)
        if self.run.interrupt is Interrupt.LOST:
            return False
        # A run stopped while its checkpoint waits for a database that does not answer (a
        # partition) stops at once, not when the driver's cancel of the statement gives
        # up (seconds): the write goes on alone, fenced by the run's lease token.
        write = asyncio.ensure_future(self.store.checkpoint(self.run.key, state))
        try:
            return await asyncio.shield(write)
        except asyncio.CancelledError:
            write.add_done_callback(_outcome_ignored)
            raise

    async def spawn(
        self,
        submissions: Sequence[Submission],
        callbacks: Mapping[str, Submission] | None = None,
    ) -> list[JobHandle] | None:
        if self.run.interrupt is Interrupt.LOST:
            return None
        # Children belong to their parent's tenant, so that the API shows a tenant its
        # trees, and were submitted by whoever submitted it; the tenant is set before
        # prepare, so that their ids are qualified in that tenant's namespace.
        tenant = self.run.job.tenant
        if tenant is not None:
            submissions = [
                s if s.tenant else dataclasses.replace(s, tenant=tenant) for s in submissions
            ]
            callbacks = {
                kind: c if c.tenant else dataclasses.replace(c, tenant=tenant)
                for kind, c in (callbacks or {}).items()
            }
        jobs = [self._inherit(j) for j in self.app.prepare(submissions)]
        from conveyor.worker._host import prepare_callback  # only handlers that spawn need it

        later = {
            kind: self._inherit(prepare_callback(self.app, c))
            for kind, c in (callbacks or {}).items()
        }
        spawned = await self.store.spawn(self.run.key, jobs, later)
        if spawned is None:
            return None
        return self.app.handles(jobs, spawned)

    def _inherit(self, job: NewJob) -> NewJob:
        parent = self.run.job
        return dataclasses.replace(
            job, tenant=job.tenant or parent.tenant, submitted_by=parent.submitted_by
        )

    async def dependency_results(self) -> dict[str, JSON]:
        depends_on = self.run.job.depends_on
        if not depends_on:
            return {}
        return {j.id: j.result for j in await self.store.get_many(depends_on)}
