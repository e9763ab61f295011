"""The API's answers: jobs, pages, attempts, workers and queues as JSON documents."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from conveyor.app.health import Health
from conveyor.app.tenants import as_its_tenant_sees
from conveyor.core.lifecycle import Status
from conveyor.core.model import Attempt, Job
from conveyor.store import QueueInfo, ScheduleInfo, WorkerInfo
from conveyor.store.protocol import JobEvent
from conveyor.web._resource import iso, job_resource, job_url


def accepted(
    job: Job,
    *,
    prefix: str | None = None,
    location: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A ``202 Accepted`` answer with the job's resource.

    What :meth:`conveyor.JobHandle.accepted` returns, for an application's own endpoints:
    a tenant's job as its tenant's token reads it (its id without the tenant prefix).
    Links and ``Location`` point into the conveyor API only when ``prefix`` says where the
    application serves it (its jobs' path, ``"/conveyor/jobs"``); without it the resource
    has no links, since the application may serve no such routes. ``location`` sets
    ``Location`` to a route of the application's own.
    """
    shown = as_its_tenant_sees(job)
    if prefix is not None:
        response = created(shown, prefix=prefix, headers=headers)
        if location is not None:
            response.headers["Location"] = location
        return response
    body = job_resource(shown)
    body["links"] = None
    extra = {"Location": location} if location is not None else {}
    return JSONResponse(body, status_code=202, headers={**extra, **(headers or {})})


def created(
    job: Job, *, prefix: str = "/jobs", headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A ``202 Accepted`` answer with the job's resource as the API's caller sees it."""
    return JSONResponse(
        job_resource(job, prefix),
        status_code=202,
        headers={"Location": job_url(prefix, job.id), **(headers or {})},
    )


def jobs_prefix(request: Request) -> str:
    """Where this API serves ``/jobs``, with the prefix it is mounted at."""
    return f"{request.scope.get('root_path', '')}/jobs"


def submitted(request: Request, results: list[tuple[Job, bool]], *, listed: bool) -> Response:
    """202 if any job is new, else 200 (every job existed); one job has a ``Location``."""
    prefix = jobs_prefix(request)
    bodies = [job_resource(job, prefix) for job, _ in results]
    status = 202 if any(created for _, created in results) else 200
    if listed:
        return JSONResponse(bodies, status_code=status)
    location = {"Location": job_url(prefix, results[0][0].id)}
    return JSONResponse(bodies[0], status_code=status, headers=location)


def job_answer(request: Request, job: Job, *, status_code: int = 200) -> Response:
    """A job's resource, as cancel answers it (200 cancelled, 202 asked to stop)."""
    return JSONResponse(job_resource(job, jobs_prefix(request)), status_code=status_code)


def _retry_after(job: Job) -> int:
    """Seconds a poller should wait: until run_at for a job due later, else one."""
    if job.status is Status.QUEUED:
        # Display only, like the CLI's status text: the poller's hint, not a lease decision.
        ahead = (job.run_at - datetime.now(UTC)).total_seconds()
        return max(1, min(60, math.ceil(ahead)))
    return 1


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = [t.strip() for t in header.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags)


def polled_job(request: Request, job: Job) -> Response:
    """A job for a poller: with ``ETag`` (304 while unchanged) and ``Retry-After``."""
    body = json.dumps(job_resource(job, jobs_prefix(request)), separators=(",", ":")).encode()
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if not job.terminal:
        headers["Retry-After"] = str(_retry_after(job))
    if _etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def attempt(a: Attempt) -> dict[str, Any]:
    return {
        "job_id": a.job_id,
        "number": a.number,
        "worker_id": a.worker_id,
        "started_at": iso(a.started_at),
        "finished_at": iso(a.finished_at),
        "outcome": a.outcome.value,
        "error": a.error,
        "traceback": a.traceback,
    }


def event(e: JobEvent) -> dict[str, Any]:
    return {"job_id": e.job_id, "at": iso(e.at), "event": e.event, "detail": e.detail}


def worker(w: WorkerInfo, now: datetime) -> dict[str, Any]:
    return {
        "id": w.id,
        "hostname": w.hostname or None,  # withheld from tokens that are not admins'
        "pid": w.pid or None,
        "queues": list(w.queues),
        "concurrency": w.concurrency,
        "started_at": iso(w.started_at),
        "heartbeat_at": iso(w.heartbeat_at),
        "stopped_at": iso(w.stopped_at),
        "state": "stopped" if w.stopped_at else "running",
        "live": w.state(now) == "live",
    }


def queue(q: QueueInfo) -> dict[str, Any]:
    return {"name": q.name, "paused": q.paused, "counts": dict(q.counts)}


def queue_named(queues: list[QueueInfo], name: str) -> dict[str, Any]:
    """The queue called ``name`` (an empty one if no job ever used it)."""
    for q in queues:
        if q.name == name:
            return queue(q)
    return {"name": name, "paused": False, "counts": {}}


def schedule(info: ScheduleInfo) -> dict[str, Any]:
    sched = info.schedule
    return {
        "name": sched.name,
        "cron": sched.cron.expression,
        "timezone": sched.cron.timezone,
        "type": sched.type,
        "queue": sched.queue,
        "overlap": sched.overlap.value,
        "skipped_ticks": info.skipped_ticks,
        "enabled": info.enabled,
        "next_run_at": iso(info.next_run_at),
        "last_run_at": iso(info.last_run_at),
    }


_JOB_COUNTS = ("queued", "due", "running", "stale_running")


def health(h: Health, *, jobs: bool = True) -> dict[str, Any]:
    """The cluster's health with its counts, as ``/health/ready`` answers it to a token;
    without ``jobs`` (a token of one tenant), the workers' counts only."""
    document = h.to_dict()
    if not jobs:
        for name in _JOB_COUNTS:
            document.pop(name)
    return document


def health_status(h: Health) -> int:
    """503 for an unhealthy cluster, so that load balancers and probes need no parsing."""
    return 503 if h.status == "unhealthy" else 200
