"""The REST API's routes (SPEC §7), at module level: each parses, makes one call, answers.

The rules about who may see and do what live below HTTP in
:class:`~conveyor.app.tenants.TenantView`, which the auth dependencies (``Reader``, ``Writer``,
``Admin``) yield; the API's options and shared state are read from ``request.app.state``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pydantic
from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials
from starlette.responses import JSONResponse, Response

from conveyor.app.handles import JobPage, Submission
from conveyor.app.registry import Registry, json_text_problem
from conveyor.core.auth import Role
from conveyor.core.lifecycle import Status
from conveyor.core.model import Job
from conveyor.errors import DatabaseUnavailable
from conveyor.web import _pages as pages
from conveyor.web import _paths  # noqa: F401  (registers the job id path parameters)
from conveyor.web import _query as query
from conveyor.web import _responses as answer
from conveyor.web import _schemas as s
from conveyor.web._auth import ROLE_KEY, Admin, Reader, Writer, authenticate, conveyor_of
from conveyor.web._guards import within
from conveyor.web._metrics import CONTENT_TYPE, render, render_tenant
from conveyor.web._openapi import header, submit_body
from conveyor.web._problems import RETRY_AFTER, ProblemError
from conveyor.web._problems import problem_responses as problems
from conveyor.web._resource import job_resource

if TYPE_CHECKING:
    from conveyor.web._app import ApiOptions

_JSON_TYPES = ("application/json",)
_AUTH_ERRORS = (401, 403, 422, 503)


def _role(needed: Role | None) -> dict[str, Any]:
    return {ROLE_KEY: needed.value if needed else None}


def _options(request: Request) -> ApiOptions:
    options: ApiOptions = request.app.state.options
    return options


# A job's id; an admin names a tenant's job by its stored id, ``tenant/id`` (core/ids.py),
# so the routes take one or two path segments (web/_paths.py); GET /jobs/{id} is declared
# after the routes below a job.
JobId = Annotated[
    str, Path(min_length=1, max_length=301, pattern=s.NUL_FREE, description="The job's id.")
]
QueueName = Annotated[
    str, Path(min_length=1, max_length=100, pattern=s.NUL_FREE, description="A queue.")
]
Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many jobs.")]
Cursor = Annotated[
    str | None,
    Query(max_length=1000, pattern=s.NUL_FREE, description="The `next` of the last page."),
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        max_length=200,
        pattern=s.NUL_FREE,
        description=(
            "Makes the submit idempotent for this tenant: the same key with the same "
            "request again returns the job(s) it created (200); with another request (any "
            "field of the body) it is refused (409), naming what differs."
        ),
    ),
]


def _text(max_length: int, description: str | None = None) -> Any:
    return Query(min_length=1, max_length=max_length, pattern=s.NUL_FREE, description=description)


router = APIRouter()

# -- jobs -------------------------------------------------------------------------------------


@router.post(
    "/jobs",
    status_code=202,
    response_model=s.JobOut | list[s.JobOut],
    summary="Submit a job, or a list of jobs in one transaction",
    tags=["jobs"],
    responses={
        200: {
            "model": s.JobOut | list[s.JobOut],
            "description": "Every job existed already (same id or Idempotency-Key).",
        },
        202: {
            "description": "Accepted: the jobs are stored and will run.",
            "headers": {"Location": header("The new job's URL (single submits).")},
        },
        **problems(400, 401, 403, 409, 413, 415, 422, 503),
    },
    # The largest list is the API's max_batch; the document states it (web/_openapi.py).
    openapi_extra={**_role(Role.WRITE), "requestBody": submit_body(1000)},
)
async def submit_jobs(
    request: Request, view: Writer, idempotency_key: IdempotencyKey = None
) -> Response:
    options = _options(request)
    data = _parse_json(await _body(request), options.max_depth)
    listed = isinstance(data, list)
    submissions = _submissions(data, options.max_batch, conveyor_of(request).registry)
    results = await view.submit(submissions, idempotency_key=idempotency_key, listed=listed)
    return answer.submitted(request, [(h.record, new) for h, new in results], listed=listed)


@router.get(
    "/jobs",
    response_model=s.JobListOut,
    summary="List jobs, newest first, a page at a time",
    tags=["jobs"],
    responses={
        200: {"headers": {"Link": header('The next page, as rel="next".')}},
        **problems(*_AUTH_ERRORS),
    },
    openapi_extra=_role(Role.READ),
)
async def list_jobs(
    request: Request,
    view: Reader,
    status: Annotated[
        list[Status] | None, Query(description="Only these statuses (repeat the parameter).")
    ] = None,
    type: Annotated[str | None, _text(200)] = None,
    queue: Annotated[str | None, _text(100)] = None,
    parent: Annotated[str | None, _text(200, "Children of.")] = None,
    root: Annotated[str | None, _text(200, "Tree of.")] = None,
    tenant: Annotated[
        str | None, _text(100, "Admin tokens: one tenant's jobs (others see only their own).")
    ] = None,
    created_after: Annotated[datetime | None, Query(description="Created at or after.")] = None,
    created_before: Annotated[datetime | None, Query(description="Created before.")] = None,
    include_children: Annotated[
        bool, Query(description="Also jobs spawned by other jobs (implied by parent or root).")
    ] = False,
    sort: Annotated[
        Literal["-created_at", "created_at"],
        Query(description="Newest first (-created_at) or oldest first (created_at)."),
    ] = "-created_at",
    limit: Limit = 50,
    cursor: Cursor = None,
) -> Response:
    chosen = query.job_filter(
        status=status or (),
        type=type,
        queue=queue,
        tenant=tenant,
        parent=parent,
        root=root,
        created_after=created_after,
        created_before=created_before,
        include_children=include_children,
    )

    async def fetch(position: str | None, count: int) -> JobPage:
        return await view.page(
            chosen, newest_first=sort == "-created_at", cursor=position, limit=count
        )

    return await pages.page(
        request, fetch, cursor=cursor, limit=limit, scope=query.cursor_scope(view.principal)
    )


@router.get(
    "/jobs/{job_id:job}/attempts",
    response_model=s.AttemptListOut,
    summary="A job's attempts, oldest first, with errors and tracebacks",
    tags=["jobs"],
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra=_role(Role.READ),
)
async def job_attempts(job_id: JobId, view: Reader) -> Response:
    attempts = await view.attempts(job_id)
    return JSONResponse({"attempts": [answer.attempt(a) for a in attempts]})


@router.get(
    "/jobs/{job_id:job}/children",
    response_model=s.JobListOut,
    summary="The jobs a job spawned, newest first, a page at a time",
    tags=["jobs"],
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra=_role(Role.READ),
)
async def job_children(
    request: Request, job_id: JobId, view: Reader, limit: Limit = 50, cursor: Cursor = None
) -> Response:
    await view.get(job_id)

    async def fetch(position: str | None, count: int) -> JobPage:
        return await view.children(job_id, cursor=position, limit=count)

    return await pages.page(
        request, fetch, cursor=cursor, limit=limit, scope=query.cursor_scope(view.principal)
    )


@router.get(
    "/jobs/{job_id:job}/events",
    response_model=s.EventListOut,
    summary="A job's events besides its attempts (reopened), oldest first",
    tags=["jobs"],
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra=_role(Role.READ),
)
async def job_events(job_id: JobId, view: Reader) -> Response:
    events = await view.events(job_id)
    return JSONResponse({"events": [answer.event(e) for e in events]})


@router.get(
    "/jobs/{job_id:job_itself}",
    response_model=s.JobOut,
    summary="Read a job; ?wait=N long-polls until it ends",
    tags=["jobs"],
    responses={
        200: {
            "headers": {
                "ETag": header("Send it back as If-None-Match: 304 while unchanged."),
                "Retry-After": header("While not terminal: seconds before polling again."),
            }
        },
        304: {"description": "Not modified since the ETag sent in If-None-Match."},
        **problems(401, 403, 404, 422, 429, 503),
    },
    openapi_extra=_role(Role.READ),
)
async def get_job(
    request: Request,
    job_id: JobId,
    view: Reader,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=3600,  # the document states the API's own max_wait (web/_openapi.py)
            allow_inf_nan=False,
            description="Seconds to wait for the job to end before answering (long poll).",
        ),
    ] = 0,
) -> Response:
    longest = _options(request).max_wait
    if wait > longest:
        raise ProblemError(422, f"wait: at most {longest:g} seconds; poll again after that")
    job = await view.get(job_id)
    if wait > 0 and not job.terminal:
        job = view.shown(
            await _wait_for_end(request, view.stored_id(job_id), wait, view.principal.token_id)
        )
    return answer.polled_job(request, job)


@router.post(
    "/jobs/{job_id:job}/cancel",
    response_model=s.JobOut,
    summary="Cancel a job (a running one is asked to stop: 202)",
    tags=["jobs"],
    responses={
        202: {
            "model": s.JobOut,
            "description": "Running: its worker was asked to stop it (a waiting parent: the "
            "jobs running below it were, and it ends cancelled once they have stopped).",
        },
        **problems(401, 403, 404, 409, 422, 503),
    },
    openapi_extra=_role(Role.WRITE),
)
async def cancel_job(request: Request, job_id: JobId, view: Writer) -> Response:
    after = await view.cancel(job_id)
    code = 200 if after.status is Status.CANCELLED else 202
    return answer.job_answer(request, after, status_code=code)


@router.post(
    "/jobs/{job_id:job}/retry",
    status_code=202,
    response_model=s.JobOut,
    summary="Retry a failed or cancelled job as a new job (the old one is kept)",
    tags=["jobs"],
    responses={
        202: {"headers": {"Location": header("The new job's URL.")}},
        **problems(401, 403, 404, 409, 422, 503),
    },
    openapi_extra=_role(Role.WRITE),
)
async def retry_job(request: Request, job_id: JobId, view: Writer) -> Response:
    new = await view.retry(job_id)
    return answer.created(new, prefix=answer.jobs_prefix(request))


@router.post(
    "/jobs/{job_id:job}/retry-failed-children",
    response_model=s.RetriedOut,
    summary="Retry every failed job below a job; its failed ancestors wait again",
    tags=["jobs"],
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra=_role(Role.WRITE),
)
async def retry_failed_children(request: Request, job_id: JobId, view: Writer) -> Response:
    new = await view.retry_failed_children(job_id)
    prefix = answer.jobs_prefix(request)
    return JSONResponse({"retried": [job_resource(j, prefix) for j in new]})


# -- operations -------------------------------------------------------------------------------


@router.get(
    "/workers",
    response_model=s.WorkerListOut,
    summary="Worker processes, live ones first",
    tags=["operations"],
    responses=problems(*_AUTH_ERRORS),
    openapi_extra=_role(Role.READ),
)
async def list_workers(view: Reader) -> Response:
    workers = await view.workers()
    now = datetime.now(UTC)
    return JSONResponse({"workers": [answer.worker(w, now) for w in workers]})


@router.get(
    "/queues",
    response_model=s.QueueListOut,
    summary="Queues with their job counts per status",
    tags=["operations"],
    responses=problems(*_AUTH_ERRORS),
    openapi_extra=_role(Role.READ),
)
async def list_queues(view: Reader) -> Response:
    return JSONResponse({"queues": [answer.queue(q) for q in await view.queues()]})


@router.post(
    "/queues/{name}/pause",
    response_model=s.QueueOut,
    summary="Stop workers claiming from a queue (running jobs finish)",
    tags=["operations"],
    responses=problems(*_AUTH_ERRORS),
    openapi_extra=_role(Role.ADMIN),
)
async def pause_queue(name: QueueName, view: Admin) -> Response:
    await view.pause(name)
    return JSONResponse(answer.queue_named(await view.queues(), name))


@router.post(
    "/queues/{name}/resume",
    response_model=s.QueueOut,
    summary="Let workers claim from a paused queue again",
    tags=["operations"],
    responses=problems(*_AUTH_ERRORS),
    openapi_extra=_role(Role.ADMIN),
)
async def resume_queue(name: QueueName, view: Admin) -> Response:
    await view.resume(name)
    return JSONResponse(answer.queue_named(await view.queues(), name))


ScheduleName = Annotated[
    str, Path(min_length=1, max_length=200, pattern=s.NUL_FREE, description="A schedule.")
]


@router.get(
    "/schedules",
    response_model=s.ScheduleListOut,
    summary="Cron schedules with their next and last run",
    tags=["operations"],
    responses=problems(*_AUTH_ERRORS),
    openapi_extra=_role(Role.READ),
)
async def list_schedules(view: Reader) -> Response:
    return JSONResponse({"schedules": [answer.schedule(i) for i in await view.schedules()]})


@router.post(
    "/schedules/{name}/run",
    status_code=202,
    response_model=s.JobOut,
    summary="Submit a schedule's job now, outside its ticks",
    tags=["operations"],
    responses={
        202: {"headers": {"Location": header("The new job's URL.")}},
        **problems(401, 403, 404, 422, 503),
    },
    openapi_extra=_role(Role.ADMIN),
)
async def run_schedule(request: Request, name: ScheduleName, view: Admin) -> Response:
    job = await view.run_schedule(name)
    return answer.created(job, prefix=answer.jobs_prefix(request))


@router.post(
    "/schedules/{name}/enable",
    response_model=s.ScheduleOut,
    summary="Enable a schedule (its ticks restart from now)",
    tags=["operations"],
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra=_role(Role.ADMIN),
)
async def enable_schedule(name: ScheduleName, view: Admin) -> Response:
    return JSONResponse(answer.schedule(await view.enable_schedule(name, True)))


@router.post(
    "/schedules/{name}/disable",
    response_model=s.ScheduleOut,
    summary="Disable a schedule: it fires no more until enabled",
    tags=["operations"],
    responses=problems(401, 403, 404, 422, 503),
    openapi_extra=_role(Role.ADMIN),
)
async def disable_schedule(name: ScheduleName, view: Admin) -> Response:
    return JSONResponse(answer.schedule(await view.enable_schedule(name, False)))


# -- health and metrics -----------------------------------------------------------------------


@router.get(
    "/health/live",
    response_model=s.LiveOut,
    summary="The API process is up (no database access)",
    tags=["health"],
    openapi_extra=_role(None),
)
async def live() -> Response:
    return JSONResponse({"status": "alive"})


@router.get(
    "/health/ready",
    response_model=s.HealthOut,
    summary="The cluster's health: healthy, degraded or unhealthy (503)",
    tags=["health"],
    responses={
        503: {
            "model": s.HealthOut,
            "description": "Unhealthy: no fresh worker heartbeat, or no database.",
            "headers": {"Retry-After": header("Seconds before asking again.")},
        }
    },
    openapi_extra=_role(None),
)
async def ready(request: Request) -> Response:
    app = conveyor_of(request)
    timeout = _options(request).db_timeout
    retry = {"Retry-After": RETRY_AFTER}
    try:
        health = await within(timeout, app.health(), "the health check")
    except DatabaseUnavailable as exc:
        return JSONResponse({"status": "unhealthy", "error": str(exc)}, 503, headers=retry)
    status = answer.health_status(health)
    headers = retry if status == 503 else None
    body = {"status": health.status}
    # Counts only for a valid token (optional here): workers' for any, jobs' for an admin.
    scheme, _, presented = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and presented.strip():
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=presented.strip())
        try:
            found = await authenticate(app, credentials, Role.READ, timeout=timeout)
        except (ProblemError, DatabaseUnavailable):
            found = None
        if found is not None:
            body = answer.health(health, jobs=found.is_admin)
    return JSONResponse(body, status_code=status, headers=headers)


@router.get(
    "/metrics",
    summary="Prometheus metrics: requests, jobs per queue and status, workers, health",
    tags=["health"],
    response_class=Response,
    responses={
        200: {
            "description": "The Prometheus text exposition format.",
            "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
        },
        **problems(*_AUTH_ERRORS),
    },
    openapi_extra=_role(Role.READ),
)
async def prometheus_metrics(request: Request, view: Reader) -> Response:
    state = request.app.state
    if not view.principal.is_admin:  # a tenant's token: its own jobs' counts only
        return Response(render_tenant(await view.queues()), media_type=CONTENT_TYPE)
    text = await render(view.app, state.metrics, polls=state.waiters.polls)
    return Response(text, media_type=CONTENT_TYPE)


# -- reading requests -------------------------------------------------------------------------


async def _wait_for_end(request: Request, job_id: str, wait: float, token_id: str) -> Job:
    """Long-poll: the job (by its stored id) once it ends, or as it is after ``wait`` s."""
    state = request.app.state
    async with state.long_polls.slot(token_id):
        state.metrics.long_polls.inc()
        try:
            latest: Job | None = await state.waiters.wait(job_id, wait)
        finally:
            state.metrics.long_polls.dec()
    return latest if latest is not None else (await conveyor_of(request).get(job_id)).record


async def _body(request: Request) -> bytes:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in _JSON_TYPES and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise ProblemError(
            415,
            "the body must be JSON sent as Content-Type: application/json, not "
            f"{media or 'none'!r}",
        )
    return await request.body()


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON; numbers must be finite")


def _parse_json(body: bytes, max_depth: int) -> Any:
    """Parse a JSON body, refusing what the database cannot store faithfully."""
    if not body.strip():
        raise ProblemError(400, "the body is empty: send a JSON object, or an array of them")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProblemError(400, "the body is not UTF-8 text: send JSON encoded as UTF-8") from None
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ProblemError(400, f"the JSON nests deeper than {max_depth} levels") from None
    except ValueError as exc:
        raise ProblemError(400, f"the body is not valid JSON: {exc}") from None
    problem = json_text_problem(data, max_depth=max_depth)
    if problem is not None:
        raise ProblemError(422, problem)
    return data


def _located(where: list[str | int], exc: pydantic.ValidationError) -> list[dict[str, Any]]:
    return [
        {
            "loc": [*where, *(p if isinstance(p, int) else str(p) for p in e["loc"])],
            "msg": e["msg"],
            "type": e["type"],
        }
        for e in exc.errors()
    ]


def _strict_payload(registry: Registry, submission: s.JobSubmission) -> None:
    """Check a payload in pydantic's strict mode: over HTTP, ``true`` is not the number 1
    and ``"5"`` is not 5 (InvalidPayload, a 422)."""
    job_type = registry.find(submission.type)
    if job_type is not None:
        job_type.validate(submission.payload, strict=True)


def _submissions(data: Any, max_batch: int, registry: Registry) -> list[Submission]:
    """The submissions of a body: one JSON object, or a list of them."""
    prefix: list[str | int] | None
    if isinstance(data, dict):
        raw, prefix = [data], []
    elif isinstance(data, list):
        if not data:
            raise ProblemError(422, "the list of jobs is empty: send at least one")
        if len(data) > max_batch:
            raise ProblemError(
                422, f"at most {max_batch} jobs per request; split the list ({len(data)} sent)"
            )
        raw, prefix = data, None
    else:
        raise ProblemError(
            422, "the body must be a JSON object (one job) or an array of objects (many jobs)"
        )
    items: list[s.JobSubmission] = []
    errors: list[dict[str, Any]] = []
    for index, item in enumerate(raw):
        where: list[str | int] = ["body", *(prefix if prefix is not None else [index])]
        try:
            items.append(s.JobSubmission.model_validate(item))
        except pydantic.ValidationError as exc:
            errors.extend(_located(where, exc))
    if errors:
        described = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in errors[:5]
        )
        raise ProblemError(422, f"invalid job submission: {described}", errors=errors)
    for submission in items:
        _strict_payload(registry, submission)
    return [_submission(submission) for submission in items]


def _submission(item: s.JobSubmission) -> Submission:
    return Submission(
        type=item.type,
        payload=item.payload,
        id=item.id,
        queue=item.queue,
        priority=item.priority,
        run_at=item.run_at,
        delay=item.delay,
        max_attempts=item.max_attempts,
        timeout=item.timeout,
        unique_key=item.unique_key,
        tenant=item.tenant,
        depends_on=tuple(item.depends_on),
    )
