"""Scripts of completion callbacks: the job a parent's on_complete submits when it ends."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from conveyor.core.lifecycle import (
    Status,
)
from conveyor.core.model import (
    JSON,
    NewJob,
    TreeCounts,
)
from conveyor.store.scripts.base import Dialect, Script

# -- completion callbacks ----------------------------------------------------------------


def callback_definition(job: NewJob) -> str:
    """A callback's definition as stored until its batch ends (JSON text)."""
    return json.dumps(
        {
            "type": job.type,
            "payload": job.payload,
            "queue": job.queue,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "timeout": job.timeout,
            "lease": job.lease,
            "backoff_base": job.backoff_base,
            "backoff_cap": job.backoff_cap,
            "tenant": job.tenant,
            "concurrency_key": job.concurrency_key,
            "submitted_by": job.submitted_by,
            "trace_context": job.trace_context,
        },
        separators=(",", ":"),
    )


def callback_job(
    parent_id: str, kind: str, fired: int, definition: Mapping[str, Any], batch: JSON
) -> NewJob:
    """The job a callback submits, with the batch's outcome as ``batch`` in its payload.

    Its id comes from the parent's, so that it is submitted once per end of the batch: a
    re-opened parent that ends again fires it again, as ``<id>.on_<kind>.<n>``.
    """
    suffix = "" if fired <= 1 else f".{fired}"
    return NewJob(
        id=f"{parent_id}.on_{kind}{suffix}",
        type=definition["type"],
        payload={**definition["payload"], "batch": batch},
        queue=definition["queue"],
        priority=definition["priority"],
        max_attempts=definition["max_attempts"],
        timeout=definition["timeout"],
        lease=definition["lease"],
        backoff_base=definition["backoff_base"],
        backoff_cap=definition["backoff_cap"],
        tenant=definition["tenant"],
        concurrency_key=definition["concurrency_key"],
        submitted_by=definition["submitted_by"],
        trace_context=definition["trace_context"],
    )


def fire_callbacks(
    dialect: Dialect, job_id: str, status: Status, counts: Mapping[Status, int]
) -> Script[None]:
    """Submit a parent's callbacks now that its batch ended: ``complete`` whatever the
    outcome, ``success`` only if it succeeded. They are top-level jobs, not children."""
    kinds = ["complete", "success"] if status is Status.SUCCEEDED else ["complete"]
    rows = yield "fire_callbacks", {"job_id": job_id, "kinds": kinds}
    if not rows:
        return
    finished = TreeCounts(
        succeeded=counts.get(Status.SUCCEEDED, 0),
        failed=counts.get(Status.FAILED, 0),
        cancelled=counts.get(Status.CANCELLED, 0),
    )
    batch = {"job_id": job_id, "status": status.value, **finished.to_dict()}
    jobs = [
        callback_job(job_id, r["kind"], int(r["fired"]), json.loads(r["job"]), batch)
        for r in sorted(rows, key=lambda r: str(r["kind"]))
    ]
    yield from dialect.submit(jobs)
