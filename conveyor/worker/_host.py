"""What a worker needs from the application it runs: :class:`WorkerHost`.

The worker types against this narrow protocol rather than the :class:`~conveyor.Conveyor`
facade, so that the facade can build workers without the two modules importing each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

from conveyor.app.handles import JobHandle, Submission
from conveyor.app.registry import Registry
from conveyor.core.cron import Schedule
from conveyor.core.flow import TenantLimit
from conveyor.core.model import NewJob
from conveyor.errors import ConfigurationError
from conveyor.observe.hooks import Hooks
from conveyor.observe.metrics import Metrics
from conveyor.store import Retention, Store, Submitted


class TenantLimitsSource(Protocol):
    """Where a worker reads the operator's per-tenant limits (an app's ``tenants``)."""

    @property
    def limits(self) -> Mapping[str, TenantLimit]: ...


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
    def tenants(self) -> TenantLimitsSource:
        """The operator's per-tenant limits, which each claim keeps."""
        ...

    def new_store(self) -> Store:
        """A new, unopened store on the application's database."""
        ...

    def retention(self, base: Retention | None = None) -> Retention:
        """The retention policy with the job types' overrides."""
        ...

    def prepare(
        self, submissions: Sequence[Submission], *, submitted_by: str = "local"
    ) -> list[NewJob]:
        """Validate submissions (a handler's spawns) into jobs ready to insert."""
        ...

    def handles(self, new_jobs: Sequence[NewJob], results: Sequence[Submitted]) -> list[JobHandle]:
        """Turn a store's submit results into handles."""
        ...


# What a completion callback finds in its payload, under "batch", when its batch ends.
BATCH_EXAMPLE = {
    "job_id": "",
    "status": "succeeded",
    "pending": 0,
    "queued": 0,
    "running": 0,
    "waiting": 0,
    "succeeded": 0,
    "failed": 0,
    "cancelled": 0,
    "done": 0,
    "total": 0,
}


def prepare_callback(host: WorkerHost, callback: Submission) -> NewJob:
    """Validate a completion callback as it will run, with ``batch`` in its payload (its
    handler must take it), and return it without: the store adds it when it fires."""
    if "batch" in callback.payload:
        raise ConfigurationError(
            f"the payload of callback {callback.type!r} has a 'batch' key: conveyor sets it "
            "when the batch ends; rename yours"
        )
    with_batch = dataclasses.replace(callback, payload={**callback.payload, "batch": BATCH_EXAMPLE})
    (job,) = host.prepare([with_batch])
    payload = {k: v for k, v in job.payload.items() if k != "batch"}
    return dataclasses.replace(job, payload=payload)


__all__ = ["BATCH_EXAMPLE", "WorkerHost", "prepare_callback"]
