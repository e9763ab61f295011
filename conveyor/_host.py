"""What a worker needs from the application it runs: :class:`WorkerHost`.

The worker types against this narrow protocol rather than the :class:`~conveyor.Conveyor`
facade, so that the facade can build workers without the two modules importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from conveyor._handles import JobHandle, Submission
from conveyor._registry import Registry
from conveyor._tenants import TenantLimits
from conveyor.core.cron import Schedule
from conveyor.core.model import NewJob
from conveyor.hooks import Hooks
from conveyor.metrics import Metrics
from conveyor.store import Retention, Store, Submitted


class WorkerHost(Protocol):
    """The job types, schedules and database a worker runs for (a Conveyor satisfies it)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def schedules(self) -> Mapping[str, Schedule]: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def hooks(self) -> Hooks: ...

    @property
    def tenants(self) -> TenantLimits:
        """The operator's per-tenant limits, which each claim keeps."""
        ...

    def new_store(self) -> Store:
        """A new, unopened store on the application's database."""
        ...

    def retention(self, base: Retention | None = None) -> Retention:
        """The retention policy with the job types' overrides."""
        ...

    def prepare(self, submissions: Sequence[Submission]) -> list[NewJob]:
        """Validate submissions (a handler's spawns) into jobs ready to insert."""
        ...

    def handles(self, new_jobs: Sequence[NewJob], results: Sequence[Submitted]) -> list[JobHandle]:
        """Turn a store's submit results into handles."""
        ...


__all__ = ["WorkerHost"]
