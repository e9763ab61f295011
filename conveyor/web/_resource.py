"""A job as the REST API shows it: a JSON object with links to what can be done with it.

Shared by the API and by :meth:`conveyor.JobHandle.accepted`, so that an application's
own ``202 Accepted`` answers carry exactly the resource the API serves.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from conveyor.core.lifecycle import Status
from conveyor.core.model import Job


def job_url(prefix: str, job_id: str) -> str:
    """Return the path of a job's resource under ``prefix`` (where ``/jobs`` is served).

    >>> job_url("/api/jobs/", "a/b")
    '/api/jobs/a%2Fb'
    """
    return f"{prefix.rstrip('/')}/{quote(job_id, safe='')}"


def iso(value: datetime | None) -> str | None:
    """Return a time as the API writes it (ISO 8601 with its offset), or None."""
    return None if value is None else value.isoformat()


def job_resource(job: Job, prefix: str = "/jobs") -> dict[str, Any]:
    """Return the JSON resource of ``job``, with links under ``prefix``."""
    here = job_url(prefix, job.id)
    progress = None
    if job.progress is not None:
        p = job.progress
        progress = {
            "done": p.done,
            "total": p.total,
            "message": p.message,
            "fraction": p.fraction,
        }
    return {
        "id": job.id,
        "type": job.type,
        "queue": job.queue,
        "tenant": job.tenant,
        "status": job.status.value,
        "terminal": job.terminal,
        "payload": job.payload,
        "priority": job.priority,
        "attempts": job.attempt,
        "max_attempts": job.max_attempts,
        "progress": progress,
        "result": job.result,
        "result_ref": job.result_ref,
        "error": job.error,
        "cancel_requested": job.cancel_requested,
        "parent_id": job.parent_id,
        "root_id": job.root_id,
        "depends_on": list(job.depends_on),
        "unique_key": job.unique_key,
        "retry_of": job.retry_of,
        "retry_count": job.retry_count,
        "retried_by": job.retried_by,
        "submitted_by": job.submitted_by,
        "below": None if job.below is None else job.below.to_dict(),
        "timeout": job.timeout,
        "run_at": iso(job.run_at),
        "created_at": iso(job.created_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "links": {
            "self": here,
            "attempts": f"{here}/attempts",
            "children": f"{here}/children",
            "parent": job_url(prefix, job.parent_id) if job.parent_id else None,
            "root": job_url(prefix, job.root_id) if job.root_id else None,
            "cancel": None if job.terminal else f"{here}/cancel",
            "retry": (
                f"{here}/retry"
                if job.status in (Status.FAILED, Status.CANCELLED) and job.retried_by is None
                else None
            ),
            "events": f"{here}/events",
            "retry_failed_children": f"{here}/retry-failed-children",
        },
    }
