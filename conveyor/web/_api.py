"""The REST API (SPEC §7): routes over the :class:`~conveyor.Conveyor` facade, nothing else."""

import hashlib
import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

import pydantic
from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from starlette.responses import JSONResponse, Response

from conveyor._resource import job_resource, job_url
from conveyor.client import Conveyor, JobPage, Submission
from conveyor.core.auth import Principal, Role, check_tenant
from conveyor.core.lifecycle import Status
from conveyor.core.model import Attempt, Job
from conveyor.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidState,
)
from conveyor.store import QueueInfo, WorkerInfo
from conveyor.web import _schemas as s
from conveyor.web._auth import ROLE_KEY, can_see, check_visible, requires
from conveyor.web._limits import BodyLimit
from conveyor.web._metrics import CONTENT_TYPE, ApiMetrics, MetricsMiddleware, render
from conveyor.web._problems import FieldError, Problem, ProblemError, install_handlers
from conveyor.web._problems import problem_responses as problems
from conveyor.web._waiters import JobWaiters

_NO_NUL = r"^[^\x00]*$"
_JSON_TYPES = ("application/json",)


@dataclass(frozen=True, slots=True)
class ApiOptions:
    """Settings of the REST API, validated when built."""

    max_body_bytes: int = 1024 * 1024  # a request body over this is refused with 413
    max_depth: int = 32  # JSON nested deeper than this is refused with 422
    max_batch: int = 1000  # jobs in one list body
    max_wait: float = 60.0  # the longest ?wait= a long poll may ask for, in seconds
    wait_tick: float = 0.1  # how often the shared long-poll loop reads waited-for jobs
    heartbeat_stale_after: float = 60.0  # a worker heartbeat older than this is stale
    title: str = "conveyor"

    def __post_init__(self) -> None:
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ConfigurationError("max_body_bytes must be an integer of at least 1024")
        if not isinstance(self.max_depth, int) or not 2 <= self.max_depth <= 1000:
            raise ConfigurationError("max_depth must be between 2 and 1000")
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ConfigurationError("max_batch must be at least 1")
        if not 0 < self.max_wait <= 3600:
            raise ConfigurationError("max_wait must be between 0 and 3600 seconds")
        if not 0.005 <= self.wait_tick <= 10:
            raise ConfigurationError("wait_tick must be between 0.005 and 10 seconds")
        if self.heartbeat_stale_after <= 0:
            raise ConfigurationError("heartbeat_stale_after must be positive")


def create_api(app: Conveyor, *, options: ApiOptions | None = None) -> FastAPI:
    """Return the REST API of ``app`` as an ASGI application (FastAPI).

    Serve it with ``conveyor serve`` or any ASGI server, or mount it in an application:
    ``main.mount("/conveyor", create_api(app))``; links and ``Location`` headers then
    carry the mount's prefix.
    """
    opts = options or ApiOptions()
    api = FastAPI(
        title=opts.title,
        version="1",
        summary="Submit durable background jobs and follow them to their end.",
        description=_DESCRIPTION,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    api.state.conveyor = app
    api.state.options = opts
    waiters = api.state.waiters = JobWaiters(app, tick=opts.wait_tick)
    metrics = api.state.metrics = ApiMetrics()
    install_handlers(api)
    api.add_middleware(BodyLimit, max_bytes=opts.max_body_bytes)
    api.add_middleware(MetricsMiddleware, metrics=metrics)

    read = requires(app, Role.READ)
    write = requires(app, Role.WRITE)
    admin = requires(app, Role.ADMIN)

    def role(needed: Role | None) -> dict[str, Any]:
        return {ROLE_KEY: needed.value if needed else None}

    Reader = Annotated[Principal, Depends(read)]
    Writer = Annotated[Principal, Depends(write)]
    Admin = Annotated[Principal, Depends(admin)]
    JobId = Annotated[
        str, Path(min_length=1, max_length=200, pattern=_NO_NUL, description="The job's id.")
    ]
    QueueName = Annotated[
        str, Path(min_length=1, max_length=100, pattern=_NO_NUL, description="A queue.")
    ]
    Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many jobs.")]
    Cursor = Annotated[
        str | None,
        Query(max_length=1000, pattern=_NO_NUL, description="The `next` of the last page."),
    ]
    auth_errors = (401, 403, 422, 503)

    # -- jobs -----------------------------------------------------------------------------

    @api.post(
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
                "headers": {"Location": _header("The new job's URL (single submits).")},
            },
            **problems(400, 401, 403, 409, 413, 415, 422, 503),
        },
        openapi_extra={**role(Role.WRITE), "requestBody": _submit_body(opts.max_batch)},
    )
    async def submit_jobs(
        request: Request,
        principal: Writer,
        idempotency_key: Annotated[
            str | None,
            Header(
                max_length=200,
                pattern=_NO_NUL,
                description=(
                    "Makes the submit idempotent for this tenant: the same key again "
                    "returns the job(s) it created (200); with another payload it is "
                    "refused (409)."
                ),
            ),
        ] = None,
    ) -> Response:
        data = _parse_json(await _body(request), opts.max_depth)
        many = isinstance(data, list)
        items = _validate_submissions(data, opts.max_batch)
        submissions = []
        for index, item in enumerate(items):
            tenant = _tenant_for(principal, item.tenant)
            job_id = item.id
            if job_id is None and idempotency_key is not None:
                job_id = _keyed_id(tenant, idempotency_key, index if many else None)
            await app.authorize(principal, item.type, item.payload)
            submissions.append(
                Submission(
                    type=item.type,
                    payload=item.payload,
                    id=job_id,
                    queue=item.queue,
                    priority=item.priority,
                    run_at=item.run_at,
                    delay=item.delay,
                    max_attempts=item.max_attempts,
                    timeout=item.timeout,
                    unique_key=item.unique_key,
                    tenant=tenant,
                    depends_on=tuple(item.depends_on),
                )
            )
        await _refuse_conflicts(app, principal, submissions)
        await _check_dependencies(app, principal, submissions)
        results = await app.submit_many_reporting(submissions)
        for handle, created in results:
            if not created and not can_see(principal, handle.record.tenant):
                raise IdempotencyConflict(
                    "the unique_key is held by an active job of another tenant: choose another key"
                )
        prefix = _jobs_prefix(request)
        bodies = [job_resource(h.record, prefix) for h, _ in results]
        status = 202 if any(created for _, created in results) else 200
        headers = {}
        if not many:
            headers["Location"] = job_url(prefix, results[0][0].id)
        return JSONResponse(bodies if many else bodies[0], status_code=status, headers=headers)

    @api.get(
        "/jobs",
        response_model=s.JobListOut,
        summary="List jobs, newest first, a page at a time",
        tags=["jobs"],
        responses={
            200: {"headers": {"Link": _header('The next page, as rel="next".')}},
            **problems(*auth_errors),
        },
        openapi_extra=role(Role.READ),
    )
    async def list_jobs(
        request: Request,
        principal: Reader,
        status: Annotated[
            list[Status] | None,
            Query(description="Only these statuses (repeat the parameter)."),
        ] = None,
        type: Annotated[str | None, Query(min_length=1, max_length=200, pattern=_NO_NUL)] = None,
        queue: Annotated[str | None, Query(min_length=1, max_length=100, pattern=_NO_NUL)] = None,
        parent: Annotated[
            str | None,
            Query(min_length=1, max_length=200, pattern=_NO_NUL, description="Children of."),
        ] = None,
        root: Annotated[
            str | None,
            Query(min_length=1, max_length=200, pattern=_NO_NUL, description="Tree of."),
        ] = None,
        tenant: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=100,
                pattern=_NO_NUL,
                description="Admin tokens: one tenant's jobs (others see only their own).",
            ),
        ] = None,
        created_after: Annotated[datetime | None, Query(description="Created at or after.")] = None,
        created_before: Annotated[datetime | None, Query(description="Created before.")] = None,
        include_children: Annotated[
            bool,
            Query(description="Also jobs spawned by other jobs (implied by parent or root)."),
        ] = False,
        sort: Annotated[
            Literal["-created_at", "created_at"],
            Query(description="Newest first (-created_at) or oldest first (created_at)."),
        ] = "-created_at",
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> Response:
        if tenant is not None and not principal.is_admin and tenant != principal.tenant:
            raise ProblemError(
                403, f"this token sees only tenant {principal.tenant!r}'s jobs; leave out tenant"
            )
        page = await app.page_jobs(
            status=status or (),
            type=type,
            queue=queue,
            tenant=tenant if principal.is_admin else principal.tenant,
            parent_id=parent,
            root_id=root,
            created_after=_utc_param("created_after", created_after),
            created_before=_utc_param("created_before", created_before),
            top_level=not (include_children or parent or root),
            newest_first=sort == "-created_at",
            cursor=cursor,
            limit=limit,
        )
        return _page_response(request, page)

    @api.get(
        "/jobs/{job_id}",
        response_model=s.JobOut,
        summary="Read a job; ?wait=N long-polls until it ends",
        tags=["jobs"],
        responses={
            200: {
                "headers": {
                    "ETag": _header("Send it back as If-None-Match: 304 while unchanged."),
                    "Retry-After": _header("While not terminal: seconds before polling again."),
                }
            },
            304: {"description": "Not modified since the ETag sent in If-None-Match."},
            **problems(401, 403, 404, 422, 503),
        },
        openapi_extra=role(Role.READ),
    )
    async def get_job(
        request: Request,
        job_id: JobId,
        principal: Reader,
        wait: Annotated[
            float,
            Query(
                ge=0,
                le=opts.max_wait,
                allow_inf_nan=False,
                description="Seconds to wait for the job to end before answering (long poll).",
            ),
        ] = 0,
    ) -> Response:
        job = await _visible_job(app, principal, job_id)
        if wait > 0 and not job.terminal:
            metrics.long_polls.inc()
            try:
                latest = await waiters.wait(job_id, wait)
            finally:
                metrics.long_polls.dec()
            job = latest if latest is not None else (await app.get(job_id)).record
        return _job_response(request, job)

    @api.get(
        "/jobs/{job_id}/attempts",
        response_model=s.AttemptListOut,
        summary="A job's attempts, oldest first, with errors and tracebacks",
        tags=["jobs"],
        responses=problems(401, 403, 404, 422, 503),
        openapi_extra=role(Role.READ),
    )
    async def job_attempts(job_id: JobId, principal: Reader) -> Response:
        await _visible_job(app, principal, job_id)
        attempts = await app.attempts(job_id)
        return JSONResponse({"attempts": [_attempt(a) for a in attempts]})

    @api.get(
        "/jobs/{job_id}/children",
        response_model=s.JobListOut,
        summary="The jobs a job spawned, newest first, a page at a time",
        tags=["jobs"],
        responses=problems(401, 403, 404, 422, 503),
        openapi_extra=role(Role.READ),
    )
    async def job_children(
        request: Request,
        job_id: JobId,
        principal: Reader,
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> Response:
        await _visible_job(app, principal, job_id)
        page = await app.page_jobs(parent_id=job_id, cursor=cursor, limit=limit)
        return _page_response(request, page)

    @api.post(
        "/jobs/{job_id}/cancel",
        response_model=s.JobOut,
        summary="Cancel a job (a running one is asked to stop: 202)",
        tags=["jobs"],
        responses={
            202: {"model": s.JobOut, "description": "Running: its worker was asked to stop it."},
            **problems(401, 403, 404, 409, 422, 503),
        },
        openapi_extra=role(Role.WRITE),
    )
    async def cancel_job(request: Request, job_id: JobId, principal: Writer) -> Response:
        job = await _visible_job(app, principal, job_id)
        if job.terminal:
            raise InvalidState(
                f"job {job_id} is already {job.status.value}: only unfinished jobs can be "
                "cancelled" + ("; retry it instead" if job.status is not Status.SUCCEEDED else "")
            )
        reason = f"cancelled through the API (token {principal.token_id})"
        after = (await app.cancel(job_id, reason=reason)).record
        if after.terminal and after.status is not Status.CANCELLED:
            raise InvalidState(f"job {job_id} ended {after.status.value} before it was cancelled")
        code = 200 if after.status is Status.CANCELLED else 202
        return JSONResponse(job_resource(after, _jobs_prefix(request)), status_code=code)

    @api.post(
        "/jobs/{job_id}/retry",
        status_code=202,
        response_model=s.JobOut,
        summary="Retry a failed or cancelled job as a new job (the old one is kept)",
        tags=["jobs"],
        responses={
            202: {"headers": {"Location": _header("The new job's URL.")}},
            **problems(401, 403, 404, 409, 422, 503),
        },
        openapi_extra=role(Role.WRITE),
    )
    async def retry_job(request: Request, job_id: JobId, principal: Writer) -> Response:
        job = await _visible_job(app, principal, job_id)
        if job.status not in (Status.FAILED, Status.CANCELLED):
            raise InvalidState(
                f"job {job_id} is {job.status.value}: only failed or cancelled jobs can be retried"
            )
        await app.authorize(principal, job.type, job.payload)
        new = await app.retry(job_id)
        prefix = _jobs_prefix(request)
        return JSONResponse(
            job_resource(new.record, prefix),
            status_code=202,
            headers={"Location": job_url(prefix, new.id)},
        )

    # -- operations -------------------------------------------------------------------------

    @api.get(
        "/workers",
        response_model=s.WorkerListOut,
        summary="Worker processes, live ones first",
        tags=["operations"],
        responses=problems(*auth_errors),
        openapi_extra=role(Role.READ),
    )
    async def list_workers(principal: Reader) -> Response:
        return JSONResponse({"workers": [_worker(w) for w in await app.workers()]})

    @api.get(
        "/queues",
        response_model=s.QueueListOut,
        summary="Queues with their job counts per status",
        tags=["operations"],
        responses=problems(*auth_errors),
        openapi_extra=role(Role.READ),
    )
    async def list_queues(principal: Reader) -> Response:
        return JSONResponse({"queues": [_queue(q) for q in await app.queues()]})

    @api.post(
        "/queues/{name}/pause",
        response_model=s.QueueOut,
        summary="Stop workers claiming from a queue (running jobs finish)",
        tags=["operations"],
        responses=problems(*auth_errors),
        openapi_extra=role(Role.ADMIN),
    )
    async def pause_queue(name: QueueName, principal: Admin) -> Response:
        await app.pause(name)
        return JSONResponse(await _queue_of(app, name))

    @api.post(
        "/queues/{name}/resume",
        response_model=s.QueueOut,
        summary="Let workers claim from a paused queue again",
        tags=["operations"],
        responses=problems(*auth_errors),
        openapi_extra=role(Role.ADMIN),
    )
    async def resume_queue(name: QueueName, principal: Admin) -> Response:
        await app.resume(name)
        return JSONResponse(await _queue_of(app, name))

    # -- health and metrics -------------------------------------------------------------------

    @api.get(
        "/health/live",
        response_model=s.LiveOut,
        summary="The API process is up (no database access)",
        tags=["health"],
        openapi_extra=role(None),
    )
    async def live() -> Response:
        return JSONResponse({"status": "alive"})

    @api.get(
        "/health/ready",
        response_model=s.HealthOut,
        summary="The cluster's health: healthy, degraded or unhealthy (503)",
        tags=["health"],
        responses={
            503: {
                "model": s.HealthOut,
                "description": "Unhealthy: no fresh worker heartbeat, or no database.",
            }
        },
        openapi_extra=role(None),
    )
    async def ready() -> Response:
        try:
            health = await app.health(stale_after=opts.heartbeat_stale_after)
        except DatabaseUnavailable as exc:
            body: dict[str, Any] = dict.fromkeys(s.HealthOut.model_fields)
            body.update(status="unhealthy", error=str(exc))
            return JSONResponse(body, status_code=503)
        c = health.counts
        return JSONResponse(
            {
                "status": health.status,
                "queued": c.queued,
                "due": c.due,
                "running": c.running,
                "stale_running": c.stale_running,
                "workers": c.workers,
                "live_workers": c.live_workers,
                "last_heartbeat": _time(c.last_heartbeat),
                "heartbeat_age": health.heartbeat_age,
                "error": None,
            },
            status_code=503 if health.status == "unhealthy" else 200,
        )

    @api.get(
        "/metrics",
        summary="Prometheus metrics: requests, jobs per queue and status, workers, health",
        tags=["health"],
        response_class=Response,
        responses={
            200: {
                "description": "The Prometheus text exposition format.",
                "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
            },
            **problems(*auth_errors),
        },
        openapi_extra=role(Role.READ),
    )
    async def prometheus_metrics(principal: Reader) -> Response:
        text = await render(
            app, metrics, stale_after=opts.heartbeat_stale_after, polls=waiters.polls
        )
        return Response(text, media_type=CONTENT_TYPE)

    def openapi() -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = get_openapi(
                title=api.title,
                version=api.version,
                summary=api.summary,
                description=api.description,
                routes=api.routes,
            )
            _, extra = models_json_schema(
                [
                    (Problem, "validation"),
                    (FieldError, "validation"),
                    (s.JobSubmission, "validation"),
                ],
                ref_template="#/components/schemas/{model}",
            )
            schemas = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, definition in extra.get("$defs", {}).items():
                schemas.setdefault(name, definition)
            _submission_variants(app, schemas)
            api.openapi_schema = schema
        return api.openapi_schema

    api.openapi = openapi  # type: ignore[method-assign]
    return api


_DESCRIPTION = """\
Submit durable background jobs and follow them to their end.

`POST /jobs` answers `202 Accepted` with `Location: /jobs/{id}`; `GET /jobs/{id}` reports
status, progress and result. Poll it with `If-None-Match` (304 while unchanged) after
`Retry-After` seconds, or long-poll with `?wait=SECONDS`.

Every route but `/health/*` needs `Authorization: Bearer <token>`. A token belongs to a
tenant and has a role: `read`, `write` (submit, cancel, retry) or `admin` (every tenant,
and queue operations). Another tenant's job answers 404. Errors are
`application/problem+json` documents whose `detail` says what to do.
"""


def _submission_variants(app: Conveyor, schemas: dict[str, Any]) -> None:
    """Document one submission per registered job type, with its payload's own schema.

    Built when the document is first asked for, so job types registered after
    :func:`create_api` are in it. Strings carry the API's NUL-free pattern.
    """
    base = schemas["JobSubmission"]
    variants = []
    for name in app.registry.names():
        payload = app.registry.get(name).model.model_json_schema(
            ref_template="#/components/schemas/{model}"
        )
        for def_name, definition in payload.pop("$defs", {}).items():
            schemas.setdefault(def_name, _no_nul(definition))
        key = "Payload_" + re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        schemas[key] = _no_nul(payload)
        properties = {
            **base["properties"],
            "type": {"const": name, "type": "string", "title": "Type"},
            "payload": {"$ref": f"#/components/schemas/{key}"},
        }
        variants.append(
            {
                "type": "object",
                "title": f"Submit {name}",
                "properties": properties,
                "required": ["type", "payload"] if payload.get("required") else ["type"],
                "additionalProperties": False,
            }
        )
    if variants:
        schemas["JobSubmission"] = {
            "title": "JobSubmission",
            "description": base.get("description", ""),
            "oneOf": variants,
        }


def _no_nul(node: Any) -> Any:
    """Add the NUL-free pattern to every string schema without a pattern of its own."""
    if isinstance(node, dict):
        out = {k: _no_nul(v) for k, v in node.items()}
        if out.get("type") == "string" and "pattern" not in out and "format" not in out:
            out["pattern"] = _NO_NUL
        return out
    if isinstance(node, list):
        return [_no_nul(v) for v in node]
    return node


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


def _submit_body(max_batch: int) -> dict[str, Any]:
    one = {"$ref": "#/components/schemas/JobSubmission"}
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        one,
                        {"type": "array", "items": one, "minItems": 1, "maxItems": max_batch},
                    ]
                },
                "example": {"type": "send_email", "payload": {"to": "a@b.c", "subject": "hi"}},
            }
        },
    }


# -- reading requests -------------------------------------------------------------------------


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
    _check_tree(data, max_depth)
    return data


def _check_tree(data: Any, max_depth: int) -> None:
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ProblemError(422, "strings must not contain NUL (\\u0000)")
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ProblemError(422, "strings must not contain unpaired surrogates") from None
        elif isinstance(item, dict | list):
            if depth > max_depth:
                raise ProblemError(
                    422,
                    f"the JSON nests deeper than {max_depth} levels: flatten the payload or "
                    "pass a reference to the data instead",
                )
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _validate_submissions(data: Any, max_batch: int) -> list[s.JobSubmission]:
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
        try:
            items.append(s.JobSubmission.model_validate(item))
        except pydantic.ValidationError as exc:
            where: list[str | int] = ["body", *(prefix if prefix is not None else [index])]
            errors.extend(
                {
                    "loc": [*where, *(p if isinstance(p, int) else str(p) for p in e["loc"])],
                    "msg": e["msg"],
                    "type": e["type"],
                }
                for e in exc.errors()
            )
    if errors:
        described = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in errors[:5]
        )
        raise ProblemError(422, f"invalid job submission: {described}", errors=errors)
    return items


def _tenant_for(principal: Principal, asked: str | None) -> str:
    if asked is None or asked == principal.tenant:
        return principal.tenant
    if not principal.is_admin:
        raise ProblemError(
            403,
            f"this token submits for tenant {principal.tenant!r} only; leave out tenant",
        )
    try:
        return check_tenant(asked)
    except ValueError as exc:
        raise ProblemError(422, str(exc)) from None


def _keyed_id(tenant: str, key: str, index: int | None) -> str:
    """A job id derived from tenant and Idempotency-Key: the same key, the same job."""
    seed = f"{tenant}\x00{key}\x00{'' if index is None else index}"
    return "idem-" + hashlib.sha256(seed.encode()).hexdigest()[:32]


def _utc_param(name: str, value: datetime | None) -> datetime | None:
    try:
        return s.utc(value)
    except ValueError as exc:
        raise ProblemError(422, f"{name}: {exc}") from None


async def _refuse_conflicts(
    app: Conveyor, principal: Principal, submissions: list[Submission]
) -> None:
    """Refuse a reused id with another definition before anything is stored.

    Checked first so that a list is all or nothing: a conflict found after the insert
    would leave the rest of the list stored.
    """
    ids = [sub.id for sub in submissions if sub.id is not None]
    if not ids:
        return
    new = {job.id: job for job in app.prepare(submissions)}
    for existing in await app.get_many(ids):
        job = existing.record
        if not can_see(principal, job.tenant):
            raise IdempotencyConflict(
                f"job id {job.id!r} is taken by another tenant's job: choose another id"
            )
        mine = new[job.id]
        if job.type != mine.type or job.payload != mine.payload:
            raise IdempotencyConflict(
                f"job {job.id!r} exists with another type or payload; use a new id (or "
                "Idempotency-Key) for a different job"
            )


async def _check_dependencies(
    app: Conveyor, principal: Principal, submissions: list[Submission]
) -> None:
    """A job may only wait for jobs its submitter can see."""
    if principal.is_admin:
        return
    batch = {sub.id for sub in submissions if sub.id}
    wanted = {d for sub in submissions for d in sub.depends_on if d not in batch}
    if not wanted:
        return
    visible = {
        h.id for h in await app.get_many(sorted(wanted)) if can_see(principal, h.record.tenant)
    }
    missing = sorted(wanted - visible)
    if missing:
        raise ProblemError(
            422, f"depends_on names jobs that do not exist: {', '.join(missing[:10])}"
        )


async def _visible_job(app: Conveyor, principal: Principal, job_id: str) -> Job:
    job = (await app.get(job_id)).record
    check_visible(principal, job_id, job.tenant)
    return job


# -- writing answers --------------------------------------------------------------------------


def _jobs_prefix(request: Request) -> str:
    return f"{request.scope.get('root_path', '')}/jobs"


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _retry_after(job: Job) -> int:
    """Seconds a poller should wait: until run_at for a job due later, else one."""
    if job.status is Status.QUEUED:
        ahead = (job.run_at - datetime.now(UTC)).total_seconds()
        return max(1, min(60, math.ceil(ahead)))
    return 1


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = [t.strip() for t in header.split(",")]
    return any(t == "*" or t.removeprefix("W/") == etag for t in tags)


def _job_response(request: Request, job: Job) -> Response:
    body = json.dumps(job_resource(job, _jobs_prefix(request)), separators=(",", ":")).encode()
    etag = f'"{hashlib.sha256(body).hexdigest()[:32]}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if not job.terminal:
        headers["Retry-After"] = str(_retry_after(job))
    if _etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def _page_response(request: Request, page: JobPage) -> Response:
    prefix = _jobs_prefix(request)
    following = None
    headers = {}
    if page.next is not None:
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"]
        following = f"{request.url.path}?{urlencode([*query, ('cursor', page.next)])}"
        headers["Link"] = f'<{following}>; rel="next"'
    return JSONResponse(
        {"jobs": [job_resource(h.record, prefix) for h in page.jobs], "next": following},
        headers=headers,
    )


def _attempt(a: Attempt) -> dict[str, Any]:
    return {
        "job_id": a.job_id,
        "number": a.number,
        "worker_id": a.worker_id,
        "started_at": _time(a.started_at),
        "finished_at": _time(a.finished_at),
        "outcome": a.outcome.value,
        "error": a.error,
        "traceback": a.traceback,
    }


def _worker(w: WorkerInfo) -> dict[str, Any]:
    return {
        "id": w.id,
        "hostname": w.hostname,
        "pid": w.pid,
        "queues": list(w.queues),
        "concurrency": w.concurrency,
        "started_at": _time(w.started_at),
        "heartbeat_at": _time(w.heartbeat_at),
        "stopped_at": _time(w.stopped_at),
        "state": "stopped" if w.stopped_at else "running",
    }


def _queue(q: QueueInfo) -> dict[str, Any]:
    return {"name": q.name, "paused": q.paused, "counts": dict(q.counts)}


async def _queue_of(app: Conveyor, name: str) -> dict[str, Any]:
    for q in await app.queues():
        if q.name == name:
            return _queue(q)
    return {"name": name, "paused": False, "counts": {}}


__all__ = ["ApiOptions", "create_api"]
