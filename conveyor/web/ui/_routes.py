"""The dashboard's pages and actions, at module level: each reads, or acts once, through
the signed-in principal's :class:`~conveyor.app.tenants.TenantView`, then renders or redirects.

GET never changes anything. Every action is a POST that must come from the dashboard's own
origin with the session's CSRF token; the TenantView checks the role and writes the audit
log, as it does for the REST API.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from conveyor.app.tenants import TenantView
from conveyor.core.auth import Role
from conveyor.core.filter import JobFilter
from conveyor.core.health import queue_not_served, type_not_served, unserved_queues
from conveyor.core.ids import sibling_order
from conveyor.core.lifecycle import Status
from conveyor.core.model import JSON, Job
from conveyor.errors import ConfigurationError, Forbidden, JobNotFound
from conveyor.web import _paths  # noqa: F401  (registers the job id path parameters)
from conveyor.web import _query as query
from conveyor.web._pages import CursorSigner
from conveyor.web.ui import _charts
from conveyor.web.ui._session import (
    COOKIE,
    Session,
    base_path,
    clear_cookie,
    csrf_ok,
    same_origin,
    set_cookie,
)

if TYPE_CHECKING:
    from conveyor.app.client import Conveyor
    from conveyor.web.ui._app import DashboardOptions
    from conveyor.web.ui._session import Sessions

router = APIRouter()
T = TypeVar("T")

_env = Environment(
    loader=PackageLoader("conveyor.web.ui", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _code_spans(text: object) -> Markup:
    """Escape ``text`` and show its `backticked` parts as code, as the CLI's hints are
    written (``start one with `conveyor worker APP```)."""
    return Markup(_BACKTICKED.sub(r"<code>\1</code>", str(escape(text))))


_BACKTICKED = re.compile(r"`([^`]+)`")
_env.filters["code_spans"] = _code_spans
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_COLLAPSE_AT = 2000  # JSON longer than this many characters starts collapsed
STATUSES = [s.value for s in Status]


class SignInFirst(Exception):
    """The request has no live session: GETs go to the sign-in page, POSTs are refused."""


@dataclass(slots=True)
class Signed:
    """The session of a request and its principal's view of the application."""

    session: Session
    view: TenantView
    flash: list[str] = field(default_factory=list)


# -- plumbing ---------------------------------------------------------------------------------


def _app(request: Request) -> Conveyor:
    app: Conveyor = request.app.state.conveyor
    return app


def _options(request: Request) -> DashboardOptions:
    options: DashboardOptions = request.app.state.options
    return options


def _sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


async def _signed(request: Request) -> Signed:
    session = _sessions(request).find(request.cookies.get(COOKIE))
    if session is None:
        raise SignInFirst
    principal = await _app(request).authenticate(session.token)
    if principal is None:  # revoked since sign-in
        _sessions(request).close(session.id)
        raise SignInFirst
    return Signed(session, TenantView(_app(request), principal, surface="the dashboard"))


async def _form(request: Request) -> dict[str, list[str]]:
    body = (await request.body()).decode("utf-8", errors="replace")
    return parse_qs(body, keep_blank_values=False, max_num_fields=200)


def _first(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


async def _acting(request: Request) -> tuple[Signed, dict[str, list[str]]]:
    """The session and form of an action POST, refused unless same-origin with the CSRF
    token."""
    if not same_origin(request):
        raise Forbidden("refused: this action was not sent from the dashboard's own pages")
    signed = await _signed(request)
    form = await _form(request)
    if not csrf_ok(signed.session, _first(form, "csrf")):
        raise Forbidden("refused: the form's CSRF token is missing or wrong; reload the page")
    return signed, form


def render(
    request: Request,
    template: str,
    signed: Signed | None,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    principal = signed.view.principal if signed else None
    flash: list[str] = []
    if signed is not None and "x-conveyor-refresh" not in request.headers:
        # A live refresh leaves the messages to the page the user opens next.
        flash = [*signed.session.flash, *signed.flash]
        signed.session.flash = []
    html = _env.get_template(template).render(
        base=base_path(request),
        principal=principal,
        csrf=signed.session.csrf if signed else "",
        can_write=bool(principal and principal.role.allows(Role.WRITE)),
        is_admin=bool(principal and principal.is_admin),
        refresh=int(_options(request).refresh * 1000),
        flash=flash,
        path=request.url.path,
        **context,
    )
    return HTMLResponse(html, status_code=status_code, headers=_HEADERS)


def error_page(request: Request, status_code: int, message: str) -> Response:
    return render(request, "error.html", None, status_code=status_code, message=message)


def to_sign_in(request: Request) -> Response:
    if request.method != "GET":
        return error_page(request, 403, "refused: sign in first")
    target = request.url.path[len(base_path(request)) :] or "/"
    if request.url.query:
        target += "?" + request.url.query
    query = urlencode({"next": target})
    return RedirectResponse(f"{base_path(request)}/login?{query}", status_code=303)


def _back(request: Request, to: str) -> RedirectResponse:
    return RedirectResponse(base_path(request) + to, status_code=303)


def _pretty(value: JSON) -> dict[str, Any]:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return {"text": text, "collapsed": len(text) > _COLLAPSE_AT, "size": len(text)}


def _ago(now: datetime, then: datetime | None) -> str:
    if then is None:
        return "—"
    seconds = max(0.0, (now - then).total_seconds())
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- sign-in ----------------------------------------------------------------------------------


@router.get("/login")
async def login_page(request: Request, next: str = "/") -> Response:
    return render(request, "login.html", None, next=_safe_next(next), error=None)


@router.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return error_page(request, 403, "refused: sign in from the dashboard's own page")
    form = await _form(request)
    token = (_first(form, "token") or "").strip()
    target = _safe_next(_first(form, "next") or "/")
    principal = await _app(request).authenticate(token) if token else None
    if principal is None:
        return render(
            request,
            "login.html",
            None,
            status_code=401,
            next=target,
            error="That token is not valid: it is malformed, unknown or revoked.",
        )
    session = _sessions(request).open(token)
    response = _back(request, target)
    set_cookie(request, response, session, _options(request).session_ttl)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    if not same_origin(request):
        return error_page(request, 403, "refused: sign out from the dashboard's own page")
    _sessions(request).close(request.cookies.get(COOKIE))
    response = _back(request, "/login")
    clear_cookie(request, response)
    return response


def _safe_next(target: str) -> str:
    """Only a path inside the dashboard: never another site."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# -- overview ---------------------------------------------------------------------------------


class Cached(Generic[T]):
    """Figures read again at most every ``max_age`` seconds, in the background while the
    last ones are shown (the first read is waited for), kept apart per ``scope``.

    The overview's jobs per queue and status read the whole table (no index holds those
    counts, and keeping one would cost every claim and settle a write), and its last day
    per minute reads a day of the finished_at index: on a million jobs, too slow for every
    page view. Figures depend on who reads them (a tenant's counts are of its own jobs), so
    each scope (a tenant, or every tenant for an admin) has its own; at most ``scopes`` are
    kept, the least recently read dropped first. A queue action taken here drops them all.
    """

    def __init__(self, max_age: float, *, scopes: int = 1000) -> None:
        self.max_age = max_age
        self.scopes = scopes
        self._kept: OrderedDict[str, _Reading[T]] = OrderedDict()

    async def get(self, scope: str, load: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        """The figures of ``scope`` and their age in seconds."""
        kept = self._kept.get(scope)
        if kept is None:
            kept = self._kept[scope] = _Reading()
            while len(self._kept) > self.scopes:
                self._kept.popitem(last=False)
        self._kept.move_to_end(scope)
        now = time.monotonic()
        if kept.value is None or self.max_age == 0:
            await kept.read(load)
        elif now - kept.read_at > self.max_age and (kept.task is None or kept.task.done()):
            kept.task = asyncio.get_running_loop().create_task(kept.read(load))
        return cast(T, kept.value), max(0.0, time.monotonic() - kept.read_at)

    def forget(self) -> None:
        self._kept.clear()


class _Reading(Generic[T]):
    """One scope's figures, when they were read, and the read under way."""

    __slots__ = ("read_at", "task", "value")

    def __init__(self) -> None:
        self.value: T | None = None
        self.read_at = 0.0
        self.task: asyncio.Task[None] | None = None

    async def read(self, load: Callable[[], Awaitable[T]]) -> None:
        began = time.monotonic()
        self.value = await load()
        self.read_at = began


def scope_of(view: TenantView) -> str:
    """Whose figures a principal sees: its tenant's, or every tenant's (``*``) for an admin."""
    return "*" if view.principal.is_admin else f"tenant:{view.principal.tenant}"


@router.get("/")
async def overview(request: Request) -> Response:
    signed = await _signed(request)
    view = signed.view
    app = view.app
    health = await app.health()
    now = health.counts.now
    state = request.app.state
    hour = await view.minute_stats(now - timedelta(hours=1))
    day, _ = await state.day_stats.get(
        scope_of(view), lambda: view.minute_stats(now - timedelta(days=1))
    )
    recent = hour[0].minute if hour else now
    stats = [m for m in day if m.minute < recent] + hour
    queues, counts_age = await state.queue_counts.get(scope_of(view), view.queues)
    per_worker = await view.running_by_worker()
    workers = await view.workers()
    unserved = unserved_queues(
        {q.name: q.counts.get("queued", 0) for q in queues},
        [w.queues for w in workers if w.state(now) == "live"],
        paused=[q.name for q in queues if q.paused],
    )
    return render(
        request,
        "overview.html",
        signed,
        health=health,
        queues=queues,
        counts_age=counts_age,
        statuses=STATUSES,
        paused=[q.name for q in queues if q.paused],
        unserved=[
            *(queue_not_served(q, f"{n} job{'' if n == 1 else 's'}") for q, n in unserved.items()),
            *(type_not_served(t.type, t.queued) for t in await view.unserved_types()),
        ],
        workers=[w for w in workers if w.stopped_at is None][:20],
        running=per_worker,
        now=now,
        ago=_ago,
        charts=_charts.overview_charts(stats, now),
    )


# -- jobs -------------------------------------------------------------------------------------


_FILTERS = (
    "status",
    "type",
    "queue",
    "tenant",
    "parent",
    "root",
    "created_after",
    "created_before",
)


def _filters(params: dict[str, list[str]]) -> dict[str, Any]:
    """The TenantView.page arguments of the jobs page's filter fields, read as the REST
    API reads them (web/_query.py)."""

    def one(name: str) -> str | None:
        values = params.get(name)
        return values[0] if values else None

    return query.job_filters(
        status=params.get("status", []),
        type=one("type"),
        queue=one("queue"),
        tenant=one("tenant"),
        parent=one("parent"),
        root=one("root"),
        created_after=one("created_after"),
        created_before=one("created_before"),
        include_children=bool(query.text("children", one("children"))),
    )


def _job_filter(filters: dict[str, Any]) -> JobFilter:
    """The jobs page's filter, parsed once, as the REST API parses its own."""
    return query.as_job_filter(filters)


def _query_params(request: Request) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in request.query_params.multi_items():
        out.setdefault(key, []).append(value)
    return out


@router.get("/jobs")
async def jobs_page(request: Request) -> Response:
    signed = await _signed(request)
    params = _query_params(request)
    wanted_id = query.text("id", _first(params, "id"))
    if wanted_id:
        try:
            await signed.view.get(wanted_id)
        except JobNotFound:
            signed.flash = [f"no job {wanted_id!r}"]
        else:
            return _back(request, f"/jobs/{quote(wanted_id, safe='')}")
    filters = _filters(params)
    newest = (params.get("sort") or ["newest"])[0] != "oldest"
    # Cursors are signed for the principal, as the API's are: a crafted one is refused.
    signer: CursorSigner = request.app.state.cursors
    scope = query.cursor_scope(signed.view.principal)
    cursor = await signer.open(params["cursor"][0], scope) if "cursor" in params else None
    page = await signed.view.page(
        _job_filter(filters),
        newest_first=newest,
        cursor=cursor,
        limit=_options(request).page_size,
    )
    following = await signer.sign(page.next, scope) if page.next else None
    kept = [(k, v) for k, v in request.query_params.multi_items() if k not in ("cursor", "id")]
    return render(
        request,
        "jobs.html",
        signed,
        jobs=[h.record for h in page.jobs],
        next_query=urlencode([*kept, ("cursor", following)]) if following else None,
        filter_items=[(k, v) for k, v in kept if k in (*_FILTERS, "children", "sort")],
        params={k: v[0] for k, v in params.items()},
        chosen=set(params.get("status", [])),
        statuses=STATUSES,
        newest=newest,
    )


@router.post("/jobs/bulk")
async def bulk(request: Request) -> Response:
    signed, form = await _acting(request)
    action = _first(form, "action") or ""
    filters = _filters(form)
    view = signed.view
    view.require(Role.WRITE)
    if action not in ("cancel", "retry"):
        raise ConfigurationError("choose cancel or retry")
    wanted: tuple[str, ...] = ("failed", "cancelled")
    if action == "cancel":
        wanted = ("pending", "queued", "running", "waiting")
    chosen = filters["status"]
    filters["status"] = tuple(s for s in (chosen or wanted) if s in wanted)
    if not filters["status"]:
        raise ConfigurationError(f"no job with the chosen statuses can be {action}led")
    confirmed = _first(form, "confirmed")
    if confirmed is None:
        count = await view.count(filters)
        kept = [(k, v) for k, vs in form.items() for v in vs if k not in ("csrf", "action")]
        return render(request, "confirm.html", signed, action=action, count=count, fields=kept)
    try:
        most = int(confirmed)
    except ValueError:
        raise ConfigurationError("the confirmed count is not a number") from None
    # Never more than the number the user confirmed, though more may match by now.
    done = await view.bulk(action, filters, limit=max(0, most)) if most > 0 else 0
    _remember(signed, f"{action}: {done} jobs")
    return _back(request, "/jobs")


def _remember(signed: Signed, message: str) -> None:
    """A message for the next page this session renders."""
    signed.session.flash = [message]


def _job_id(job_id: str) -> str:
    """A job id from a path, checked as the jobs page's ``id`` field is (no NUL, text)."""
    return query.text("id", job_id) or job_id


@router.get("/jobs/{job_id:job_itself}")
async def job_page(request: Request, job_id: str) -> Response:
    job_id = _job_id(job_id)
    signed = await _signed(request)
    view = signed.view
    job = await view.get(job_id)
    attempts = await view.attempts(job_id)
    tree = await _tree(view, job)
    chain = await _retry_chain(view, job)
    now = await view.app.ops.now()
    callbacks = await _callbacks(view, job_id) if job.below is not None else []
    fired_by = _CALLBACK_ID.match(job_id)
    callback_of = fired_by.group(1) if fired_by else None
    if callback_of is not None and not await _exists(view, callback_of):
        callback_of = None
    note = None
    if job.status is Status.QUEUED:
        live = [w.queues for w in await view.workers() if w.state(now) == "live"]
        if unserved_queues({job.queue: 1}, live):
            note = queue_not_served(job.queue, "this job is")
    return render(
        request,
        "job.html",
        signed,
        job=job,
        attempts=attempts,
        payload=_pretty(job.payload),
        result=_pretty(job.result) if job.result is not None else None,
        state=_pretty(job.state) if job.state is not None else None,
        eta=_eta(job, now),
        tree=tree,
        chain=chain,
        statuses=STATUSES,
        callbacks=callbacks,
        callback_of=callback_of,
        note=note,
    )


# A completion callback's id, from its parent's (store/scripts/callbacks.py callback_job).
_CALLBACK_ID = re.compile(r"^(.+)\.on_(?:complete|success)(?:\.\d+)?$")


async def _exists(view: TenantView, job_id: str) -> bool:
    try:
        await view.get(job_id)
    except JobNotFound:
        return False
    return True


async def _callbacks(view: TenantView, job_id: str) -> list[Job]:
    """The completion callbacks a parent fired (top-level jobs of their own, with ids
    derived from its: ``<id>.on_complete``, ``.on_success``, ``.on_complete.2`` ...)."""
    found = []
    for kind in ("complete", "success"):
        for n in range(1, 11):
            callback_id = f"{job_id}.on_{kind}" + (f".{n}" if n > 1 else "")
            try:
                found.append(await view.get(callback_id))
            except JobNotFound:
                break
    return found


def _eta(job: Job, now: datetime) -> str | None:
    progress = job.progress
    if job.status is not Status.RUNNING or progress is None or job.started_at is None:
        return None
    fraction = progress.fraction
    if not fraction or fraction <= 0:
        return None
    elapsed = (now - job.started_at).total_seconds()
    left = max(0.0, elapsed / fraction - elapsed)
    return f"about {left:.0f} s left" if left < 120 else f"about {left / 60:.0f} min left"


@dataclass(slots=True)
class _Tree:
    counts: dict[str, int]
    total: int
    done: int
    rows: list[tuple[int, Job]]  # depth, job; in tree order
    shown_all: bool


async def _tree(view: TenantView, job: Job, *, shown: int = 500) -> _Tree | None:
    """The jobs below ``job`` with the counts the store keeps (None when it has none);
    the first ``shown`` of them as a tree."""
    if job.below is None or job.below.total == 0:
        return None
    counts = {k: v for k, v in job.below.by_status().items() if v}
    total, done = job.below.total, job.below.done
    root = job.root_id is None
    page = await view.page(
        JobFilter.of(root_id=job.id if root else None, parent_id=None if root else job.id),
        newest_first=False,
        limit=min(1000, shown),
    )
    below = [h.record for h in page.jobs]
    kids: dict[str | None, list[Job]] = {}
    for j in below:
        kids.setdefault(j.parent_id, []).append(j)
    rows: list[tuple[int, Job]] = []

    def walk(parent: str, depth: int) -> None:
        # Siblings in natural order (.2 before .10), not as strings, nor by creation time.
        for child in sorted(kids.get(parent, []), key=lambda j: sibling_order(parent, j.id)):
            rows.append((depth, child))
            walk(child.id, depth + 1)

    walk(job.id, 0)
    return _Tree(counts, total, done, rows, shown_all=len(rows) >= total)


async def _retry_chain(view: TenantView, job: Job, *, most: int = 20) -> list[Job]:
    """The jobs this one retries, newest first (itself excluded)."""
    chain: list[Job] = []
    current = job
    while current.retry_of and len(chain) < most:
        try:
            current = await view.get(current.retry_of)
        except JobNotFound:
            break
        chain.append(current)
    return chain


@router.post("/jobs/{job_id:job}/cancel")
async def cancel(request: Request, job_id: str) -> Response:
    job_id = _job_id(job_id)
    signed, _ = await _acting(request)
    after = await signed.view.cancel(job_id)
    _remember(signed, f"job {job_id}: {'cancelled' if after.terminal else 'asked to stop'}")
    return _back(request, f"/jobs/{quote(job_id, safe='')}")


@router.post("/jobs/{job_id:job}/retry")
async def retry(request: Request, job_id: str) -> Response:
    job_id = _job_id(job_id)
    signed, _ = await _acting(request)
    new = await signed.view.retry(job_id)
    _remember(signed, f"job {job_id} retried as {new.id}")
    return _back(request, f"/jobs/{quote(new.id, safe='')}")


@router.post("/jobs/{job_id:job}/retry-failed-children")
async def retry_children(request: Request, job_id: str) -> Response:
    job_id = _job_id(job_id)
    signed, _ = await _acting(request)
    new = await signed.view.retry_failed_children(job_id)
    _remember(signed, f"{len(new)} failed children retried")
    return _back(request, f"/jobs/{quote(job_id, safe='')}")


# -- queues, schedules, workers, leases, audit ------------------------------------------------


@router.get("/queues")
async def queues_page(request: Request) -> Response:
    signed = await _signed(request)
    return render(
        request, "queues.html", signed, queues=await signed.view.queues(), statuses=STATUSES
    )


@router.post("/queues/{name}/{verb}")
async def queue_action(request: Request, name: str, verb: str) -> Response:
    signed, _ = await _acting(request)
    if verb == "pause":
        await signed.view.pause(name)
    elif verb == "resume":
        await signed.view.resume(name)
    else:
        raise StarletteHTTPException(404, f"no queue action {verb!r}: pause or resume")
    request.app.state.queue_counts.forget()
    _remember(signed, f"queue {name}: {verb}d")
    return _back(request, "/queues")


@router.get("/schedules")
async def schedules_page(request: Request) -> Response:
    signed = await _signed(request)
    return render(request, "schedules.html", signed, schedules=await signed.view.schedules())


@router.post("/schedules/{name}/{verb}")
async def schedule_action(request: Request, name: str, verb: str) -> Response:
    signed, _ = await _acting(request)
    if verb == "run":
        job = await signed.view.run_schedule(name)
        _remember(signed, f"schedule {name} ran as job {job.id}")
    elif verb in ("enable", "disable"):
        await signed.view.enable_schedule(name, verb == "enable")
        _remember(signed, f"schedule {name}: {verb}d")
    else:
        raise StarletteHTTPException(404, f"no schedule action {verb!r}: run, enable or disable")
    return _back(request, "/schedules")


@router.get("/workers")
async def workers_page(request: Request) -> Response:
    signed = await _signed(request)
    view = signed.view
    workers = await view.workers()
    counts = await view.running_by_worker()
    # Links to the newest running jobs this principal may see (counts are everyone's).
    running = await view.page(
        JobFilter.of(status=[Status.RUNNING], include_children=True), limit=100
    )
    by_worker: dict[str, list[Job]] = {}
    for h in running.jobs:
        by_worker.setdefault(h.record.lease_owner or "", []).append(h.record)
    now = await view.app.ops.now()
    return render(
        request,
        "workers.html",
        signed,
        workers=workers,
        running=by_worker,
        counts=counts,
        now=now,
        ago=_ago,
        # Silent for longer than its own lease, as the health check judges a worker.
        stale=lambda w: (
            w.stopped_at is None
            and (w.heartbeat_at is None or (now - w.heartbeat_at).total_seconds() > w.lease)
        ),
    )


@router.get("/leases")
async def leases_page(request: Request) -> Response:
    signed = await _signed(request)
    return render(request, "leases.html", signed, leases=await signed.view.locks())


@router.get("/audit")
async def audit_page(request: Request, before: int | None = None) -> Response:
    signed = await _signed(request)
    entries = await signed.view.audit_log(before_id=before, limit=100)
    older = entries[-1].id if len(entries) == 100 else None
    return render(request, "audit.html", signed, entries=entries, older=older)
