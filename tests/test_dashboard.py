"""The dashboard over HTTP on every backend: sign-in and sessions, CSRF and Origin checks,
roles, tenant isolation on every page, escaping, actions and the audit log; the REST API's
schedules and queues routes and the CLI's queues commands that go with it."""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from fastapi import FastAPI

from conveyor import Conveyor, Status
from conveyor.app.tenants import TenantView
from conveyor.cli import main
from conveyor.core.auth import Principal, Role
from conveyor.errors import ConfigurationError
from conveyor.store.protocol import AuditEntry
from conveyor.web import create_api
from conveyor.web.ui import create_dashboard
from tests.apps.ui import MARKUP_TYPE, build
from tests.helpers import eventually, new, running_worker, settled

ORIGIN = {"Origin": "http://testserver"}
PAGES = [f"/ui/{p}" for p in ("", "jobs", "queues", "schedules", "workers", "leases", "audit")]


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    await application.migrate()
    await application.sync_schedules()
    yield application
    await application.close()


@pytest.fixture
def api(app: Conveyor) -> FastAPI:
    return create_api(app)


@pytest.fixture
async def secrets(app: Conveyor) -> dict[str, str]:
    out = {}
    for who, tenant, role in [
        ("read", "acme", "read"),
        ("write", "acme", "write"),
        ("other", "globex", "write"),
        ("admin", "ops", "admin"),
    ]:
        _, out[who] = await app.create_token(tenant=tenant, role=role, name=who)
    return out


@pytest.fixture
async def browser(api: FastAPI) -> AsyncIterator[Any]:
    """A factory of HTTP clients with cookie jars of their own, like separate browsers."""
    clients: list[httpx.AsyncClient] = []

    def new(base_url: str = "http://testserver") -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url=base_url)
        clients.append(client)
        return client

    yield new
    for client in clients:
        await client.aclose()


async def sign_in(client: httpx.AsyncClient, secret: str) -> str:
    """Sign in; return the session's CSRF token."""
    r = await client.post("/ui/login", data={"token": secret, "next": "/"}, headers=ORIGIN)
    assert r.status_code == 303, r.text
    return csrf_of(await client.get("/ui/jobs"))


def _rows(page: httpx.Response) -> str:
    """The job rows of a jobs page (its filter fields echo what was asked)."""
    found = re.search(r'<tbody id="rows".*?</tbody>', page.text, re.S)
    assert found, page.text[:500]
    return found.group(0)


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert found, page.text[:500]
    return found.group(1)


async def post(client: httpx.AsyncClient, path: str, csrf: str, **fields: str) -> httpx.Response:
    return await client.post(path, data={"csrf": csrf, **fields}, headers=ORIGIN)


# -- sessions ---------------------------------------------------------------------------------


async def test_pages_need_a_session_and_sign_in_opens_one(browser: Any, secrets: dict[str, str]):
    c = browser()
    for page in PAGES:
        r = await c.get(page)
        assert r.status_code == 303 and "/ui/login?next=" in r.headers["location"], page
    r = await c.post("/ui/login", data={"token": "cvt_nonsense"}, headers=ORIGIN)
    assert r.status_code == 401 and "not valid" in r.text
    await sign_in(c, secrets["read"])
    for page in PAGES:
        r = await c.get(page)
        assert r.status_code == 200, (page, r.text[:300])
        assert r.headers["content-security-policy"].startswith("default-src 'none'")


async def test_session_cookie_flags_over_http_and_https(browser: Any, secrets: dict[str, str]):
    for base, secure in [("http://testserver", False), ("https://testserver", True)]:
        c = browser(base)
        origin = {"Origin": base}
        r = await c.post("/ui/login", data={"token": secrets["read"]}, headers=origin)
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        assert ("; secure" in cookie) is secure, cookie


async def test_sign_out_expiry_and_revocation_end_the_session(
    app: Conveyor, api: FastAPI, browser: Any, secrets: dict[str, str]
):
    c = browser()
    await sign_in(c, secrets["read"])
    r = await c.post("/ui/logout", headers=ORIGIN)
    assert r.status_code == 303
    assert (await c.get("/ui/jobs")).status_code == 303  # signed out
    # Expiry: the session's end is in the past.
    await sign_in(c, secrets["read"])
    sessions = _dashboard(api).state.sessions
    for session in sessions._open.values():
        session.expires = 0.0
    assert (await c.get("/ui/jobs")).status_code == 303
    # Revocation: a revoked token ends its sessions at once.
    token, secret = await app.create_token(tenant="acme", role="read")
    await sign_in(c, secret)
    await app.revoke_token(token.id)
    assert (await c.get("/ui/jobs")).status_code == 303


def _dashboard(api: FastAPI) -> Any:
    (mount,) = [r for r in api.routes if getattr(r, "path", "") == "/ui"]
    return mount.app  # type: ignore[attr-defined]


async def test_sign_in_never_redirects_off_site(browser: Any, secrets: dict[str, str]):
    c = browser()
    for target in ["//evil.example/x", "https://evil.example/", "/\\evil.example"]:
        data = {"token": secrets["read"], "next": target}
        r = await c.post("/ui/login", data=data, headers=ORIGIN)
        assert r.headers["location"] == "/ui/", target


# -- CSRF, Origin, GET never mutates ----------------------------------------------------------


async def test_cross_origin_and_csrf_less_posts_are_refused(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    job = await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
    c = browser()
    csrf = await sign_in(c, secrets["write"])
    path = f"/ui/jobs/{job.id}/cancel"
    cross = await c.post(path, data={"csrf": csrf}, headers={"Origin": "http://evil.example"})
    assert cross.status_code == 403
    no_origin = await c.post(path, data={"csrf": csrf})
    assert no_origin.status_code == 403
    no_csrf = await c.post(path, data={}, headers=ORIGIN)
    assert no_csrf.status_code == 403
    wrong_csrf = await c.post(path, data={"csrf": "x" + csrf}, headers=ORIGIN)
    assert wrong_csrf.status_code == 403
    login_cross = await browser().post(
        "/ui/login", data={"token": secrets["write"]}, headers={"Origin": "http://evil.example"}
    )
    assert login_cross.status_code == 403
    assert (await job.refresh()).status is Status.QUEUED
    # The same request, from the dashboard's own page with its token, acts.
    ok = await post(c, path, csrf)
    assert ok.status_code == 303
    assert (await job.refresh()).status is Status.CANCELLED
    # Recorded as the dashboard's (issue #30 item 11: it read "through the API").
    assert job.error is not None and job.error.startswith("cancelled through the dashboard (token")


async def test_get_never_mutates(app: Conveyor, browser: Any, secrets: dict[str, str]):
    job = await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
    c = browser()
    await sign_in(c, secrets["admin"])
    paths = [
        *PAGES,
        f"/ui/jobs/{job.id}",
        f"/ui/jobs/{job.id}/cancel",
        f"/ui/jobs/{job.id}/retry",
        "/ui/queues/default/pause",
        "/ui/schedules/nightly/run",
        "/ui/schedules/nightly/disable",
        f"/ui/jobs?id={job.id}",
    ]
    for path in paths:
        r = await c.get(path)
        assert r.status_code in (200, 303, 405), (path, r.status_code)
    assert (await job.refresh()).status is Status.QUEUED
    assert not any(q.paused for q in await app.queues())
    assert all(s.enabled for s in await app.list_schedules())
    assert len((await app.page_jobs(limit=100)).jobs) == 1
    assert await (await app.store()).audit_log() == []


# -- roles ------------------------------------------------------------------------------------


async def test_a_read_token_sees_no_action_and_every_action_is_refused(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    failed = await app.submit("explode", {}, tenant="acme")
    async with running_worker(app):
        await settled(failed, Status.FAILED)
    await app.pause("default")
    queued = await app.submit("add", {"a": 1, "b": 1}, tenant="acme")
    c = browser()
    csrf = await sign_in(c, secrets["read"])
    for path in [*PAGES, f"/ui/jobs/{failed.id}", f"/ui/jobs/{queued.id}"]:
        html = (await c.get(path)).text
        assert 'name="csrf"' not in html, path  # no action form anywhere
    refused = [
        (f"/ui/jobs/{failed.id}/retry", {}),
        (f"/ui/jobs/{queued.id}/cancel", {}),
        (f"/ui/jobs/{failed.id}/retry-failed-children", {}),
        ("/ui/jobs/bulk", {"action": "cancel", "confirmed": "1"}),
        ("/ui/queues/default/resume", {}),
        ("/ui/schedules/nightly/run", {}),
        ("/ui/schedules/nightly/disable", {}),
    ]
    for path, fields in refused:
        r = await post(c, path, csrf, **fields)
        assert r.status_code == 403, (path, r.status_code, r.text[:300])
    assert (await failed.refresh()).status is Status.FAILED
    assert (await queued.refresh()).status is Status.QUEUED
    # A write token acts on jobs but not on queues and schedules (admins only).
    w = browser()
    wcsrf = await sign_in(w, secrets["write"])
    assert (await post(w, "/ui/queues/default/resume", wcsrf)).status_code == 403
    assert (await post(w, "/ui/schedules/nightly/run", wcsrf)).status_code == 403
    assert 'name="csrf"' in (await w.get(f"/ui/jobs/{failed.id}")).text


# -- tenant isolation -------------------------------------------------------------------------


async def test_one_tenant_cannot_see_or_act_on_anothers_jobs_on_any_page(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    theirs = await app.submit("explode", {"message": "globex-secret"}, tenant="globex")
    parent = await app.submit("fan_out", {"n": 3}, tenant="globex")
    async with running_worker(app):
        await settled(theirs, Status.FAILED)
        await settled(parent, Status.SUCCEEDED)
    other = browser()
    ocsrf = await sign_in(other, secrets["other"])
    await post(other, f"/ui/jobs/{theirs.id}/retry", ocsrf)  # an audit entry of globex's
    mine = await app.submit("add", {"a": 1, "b": 1}, tenant="acme")
    c = browser()
    csrf = await sign_in(c, secrets["write"])
    for path in [
        *PAGES,
        "/ui/jobs?children=1",
        f"/ui/jobs?parent={parent.id}",
        f"/ui/jobs?root={parent.id}",
        "/ui/jobs?status=failed&children=1",
        f"/ui/jobs?id={theirs.id}",
    ]:
        html = _rows(await c.get(path)) if "?" in path else (await c.get(path)).text
        assert theirs.id not in html and parent.id not in html, path
        assert "globex" not in html, path
    assert mine.id.removeprefix("acme/") in (await c.get("/ui/jobs")).text
    for path in [f"/ui/jobs/{theirs.id}", f"/ui/jobs/{parent.id}"]:
        assert (await c.get(path)).status_code == 404
    for path in [
        f"/ui/jobs/{theirs.id}/retry",
        f"/ui/jobs/{parent.id}/cancel",
        f"/ui/jobs/{parent.id}/retry-failed-children",
    ]:
        assert (await post(c, path, csrf)).status_code == 404, path
    r = await post(c, "/ui/jobs/bulk", csrf, action="retry", status="failed", children="1")
    assert "Retry 0 jobs?" in r.text
    r = await post(c, "/ui/jobs/bulk", csrf, action="retry", confirmed="0", children="1")
    assert r.status_code == 303
    globex = await app.page_jobs(tenant="globex", top_level=True, limit=100)
    assert len(globex.jobs) == 3  # its two jobs and its own retry, nothing of acme's
    # An admin sees both tenants.
    a = browser()
    await sign_in(a, secrets["admin"])
    html = (await a.get("/ui/jobs?children=1")).text
    assert theirs.id in html and mine.id in html
    assert "globex" in (await a.get("/ui/audit")).text


async def test_the_overview_counts_each_tenant_its_own_queues(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    await app.submit("add", {"a": 1, "b": 1}, queue="acme-secret-queue", tenant="acme")
    acme = browser()
    await sign_in(acme, secrets["read"])
    assert "acme-secret-queue" in (await acme.get("/ui/")).text  # read, and kept 30 s
    globex = browser()
    await sign_in(globex, secrets["other"])
    assert "acme-secret-queue" not in (await globex.get("/ui/")).text
    admin = browser()
    await sign_in(admin, secrets["admin"])
    assert "acme-secret-queue" in (await admin.get("/ui/")).text


async def test_an_unhealthy_overview_says_why_and_what_to_do(
    app: Conveyor, api: FastAPI, browser: Any, secrets: dict[str, str]
):
    """Issue #30 item 8: after the demo (its only worker stopped) the overview said
    Unhealthy in red and nothing else."""
    async with running_worker(app):

        async def live() -> bool:
            return (await app.health()).counts.live_workers == 1

        await eventually(live)
    c = browser()
    await sign_in(c, secrets["read"])
    page = (await c.get("/ui/")).text
    assert "unhealthy" in page
    assert "no live worker: the last heartbeat was" in page
    # The CLI's backticks become code on the page, never literal backquotes.
    assert "start one with <code>conveyor worker APP</code>" in page
    assert "`" not in page
    # The same hint in /health/ready's document, for a token.
    ready = await c.get("/health/ready", headers={"Authorization": f"Bearer {secrets['read']}"})
    assert ready.status_code == 503
    assert "start one with `conveyor worker APP`" in ready.json()["hint"]


async def test_a_tenant_sees_workers_without_their_host_and_pid_anywhere(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    host, pid = socket.gethostname(), os.getpid()
    crawl = await app.submit("crawl", {"steps": 10_000, "pause": 0.05}, tenant="acme")
    done = await app.submit("add", {"a": 1, "b": 1}, tenant="acme")
    mine = {"Authorization": f"Bearer {secrets['read']}"}
    async with app.lease("a-report", ttl=30), running_worker(app, queues=["slow", "default"]) as w:
        assert w.id.startswith(f"{host}-{pid}-")  # what the id tells an admin
        await settled(done, Status.SUCCEEDED)
        await eventually(lambda: _is_running(crawl))
        c = browser()
        await sign_in(c, secrets["read"])
        shown = {
            path: (await c.get(path, headers=mine if not path.startswith("/ui") else {})).text
            for path in [
                "/ui/",
                "/ui/workers",
                "/ui/leases",
                f"/ui/jobs/{crawl.id.removeprefix('acme/')}",
                f"/ui/jobs/{done.id.removeprefix('acme/')}",
                "/workers",
                f"/jobs/{done.id.removeprefix('acme/')}/attempts",
                f"/jobs/{crawl.id.removeprefix('acme/')}",
            ]
        }
        # The host as a word of its own: a short host name ("vm") can sit inside a job's id.
        host_word = re.compile(rf"(?<![0-9a-z]){re.escape(host.lower())}(?![0-9a-z])")
        for path, text in shown.items():
            assert w.id not in text and f"-{pid}-" not in text, path
            assert not host_word.search(text.lower()), path
        [label] = [x["id"] for x in json.loads(shown["/workers"])["workers"]]
        assert label.startswith("worker-") and label != w.id
        for path in ["/ui/", "/ui/workers", f"/ui/jobs/{crawl.id.removeprefix('acme/')}"]:
            assert label in shown[path], path  # one label for the worker on every page
        attempts = json.loads(shown[f"/jobs/{done.id.removeprefix('acme/')}/attempts"])
        assert attempts["attempts"][0]["worker_id"] == label
        admin = browser()
        await sign_in(admin, secrets["admin"])
        text = (await admin.get("/ui/workers")).text
        assert w.id in text and f"{host}:{pid}" in text
        await crawl.cancel()
        await settled(crawl, Status.CANCELLED)
    # A rescued attempt's error names the worker that stopped: as a label for the tenant.
    view = TenantView(app, Principal("tok", "acme", Role.READ))
    lost = replace(
        (await app.get(done.id)).record, error=f"lease expired: worker {w.id} stopped heartbeating"
    )
    assert view.shown(lost).error == f"lease expired: worker {label} stopped heartbeating"


async def test_a_job_page_lists_sub_jobs_in_natural_order_and_links_its_callbacks(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    """Issue #30 item 11: the tree read .0, .1, .10, .11, .2; the callback was a top-level
    job that the root's page did not link to."""
    root = await app.submit("fan_out", {"n": 12, "callback": True}, tenant="ops")
    async with running_worker(app, concurrency=8):
        await settled(root, Status.SUCCEEDED, timeout=60)
        await settled(await app.get(f"{root.id}.on_complete"), Status.SUCCEEDED)
    c = browser()
    await sign_in(c, secrets["admin"])
    page = (await c.get(f"/ui/jobs/{root.id}")).text
    shown = re.findall(rf"<code>{re.escape(root.id)}\.(\d+)</code>", page)
    assert shown == [str(i) for i in range(12)]
    assert f'href="/ui/jobs/{root.id}.on_complete"' in page
    callback = (await c.get(f"/ui/jobs/{root.id}.on_complete")).text
    assert "Callback of" in callback and f'href="/ui/jobs/{root.id}"' in callback


async def test_jobs_in_a_queue_no_live_worker_serves_are_pointed_out(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    """Issue #30 item 9: nothing said that a job sat in a queue no worker serves."""
    stray = await app.submit("add", {"a": 1, "b": 2}, queue="stray", tenant="ops")
    c = browser()
    await sign_in(c, secrets["admin"])
    async with running_worker(app):

        async def live() -> bool:
            return (await app.health()).counts.live_workers == 1

        await eventually(live)
        overview = (await c.get("/ui/")).text
        job_page = (await c.get(f"/ui/jobs/{stray.id}")).text
    said = "queued in queue &#39;stray&#39;, which no live worker serves"
    assert f"1 job {said}" in overview and "<code>--queues stray</code>" in overview
    assert f"this job is {said}" in job_page


async def test_jobs_of_a_type_no_live_worker_serves_are_pointed_out(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    """Issue #27, rolling deploys: jobs of a type only newer code knows wait, and the
    overview says so while the live workers lack its handler."""
    store = await app.store()
    await store.submit([new("report-1", type="build_report", tenant="ops")])
    c = browser()
    await sign_in(c, secrets["admin"])
    async with running_worker(app):

        async def live() -> bool:
            return (await app.health()).counts.live_workers == 1

        await eventually(live)
        overview = (await c.get("/ui/")).text
    assert "1 job waiting for type &#39;build_report&#39;, which no live worker serves" in overview
    assert (await app.get("report-1")).attempt == 0  # waited, its attempts unspent


async def test_the_favicon_is_served(api: FastAPI):
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://t") as c:
        r = await c.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"] == "image/x-icon"
    assert r.content[:4] == b"\0\0\1\0"  # an ICO file


CRAFTED = [
    ("cursor=", 422),
    ("cursor=abc", 422),
    ("created_after=0001-01-01T00:00%2B05:00", 200),  # every job is after it
    ("created_before=9999-12-31T23:59-05:00", 200),
    ("created_after=garbage", 422),
    ("type=a%00b", 422),
    ("parent=a%00b", 422),
    ("root=%00", 422),
    ("queue=" + "q" * 101, 422),
    ("status=nope", 422),
]


async def test_crafted_query_values_get_the_apis_answer_on_the_jobs_page(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    for i in range(3):
        await app.submit("add", {"a": i, "b": i}, tenant="acme")
    unsigned = (await app.page_jobs(tenant="acme", limit=1)).next
    assert unsigned is not None
    c = browser()
    await sign_in(c, secrets["read"])
    api = {"Authorization": f"Bearer {secrets['read']}"}
    for crafted, status in [*CRAFTED, (f"cursor={unsigned}", 422)]:
        page = await c.get(f"/ui/jobs?{crafted}")
        listed = await c.get(f"/jobs?{crafted}", headers=api)
        assert (page.status_code, listed.status_code) == (status, status), crafted
        if status == 422:  # a page that names what is wrong
            assert f"{crafted.split('=')[0]}:" in page.text or "cursor" in page.text, crafted
    for crafted in ["id=a%00b", "id=%00"]:
        assert (await c.get(f"/ui/jobs?{crafted}")).status_code == 422, crafted
    assert (await c.get("/ui/jobs/a%00b")).status_code == 422
    # The page's own cursors are signed for the principal and lead on.
    few = await c.get("/ui/jobs")
    assert few.status_code == 200


# -- escaping ---------------------------------------------------------------------------------


async def test_markup_in_payload_error_type_and_filters_renders_escaped(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    bad = await app.submit("explode", {"message": evil}, tenant="ops")
    typed = await app.submit(MARKUP_TYPE, {}, tenant="ops")
    async with running_worker(app):
        await settled(bad, Status.FAILED)
        await settled(typed, Status.SUCCEEDED)
    c = browser()
    await sign_in(c, secrets["admin"])
    pages = [
        f"/ui/jobs/{bad.id}",
        f"/ui/jobs/{typed.id}",
        "/ui/jobs",
        "/ui/jobs?tenant=<script>alert(3)</script>&type=<b>x</b>",
        "/ui/audit",
    ]
    for path in pages:
        html = (await c.get(path)).text
        assert "<script>alert" not in html and "<img src=x" not in html, path
        assert "<b>" not in html, path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in (await c.get(f"/ui/jobs/{bad.id}")).text
    assert "&lt;script&gt;alert(&#34;type&#34;)" in (await c.get("/ui/jobs")).text
    # Tenant names cannot hold markup at all: the token is refused at creation.
    with pytest.raises(ConfigurationError):
        await app.create_token(tenant="<b>x</b>", role="read")


# -- actions and the audit log ----------------------------------------------------------------


async def test_actions_are_audited_and_bulk_confirms_the_count(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    where: dict[str, Any] = {"queue": "batch", "tenant": "acme"}
    jobs = [await app.submit("add", {"a": i, "b": 0}, **where) for i in range(5)]
    c = browser()
    csrf = await sign_in(c, secrets["write"])
    r = await post(c, "/ui/jobs/bulk", csrf, action="cancel", queue="batch")
    assert r.status_code == 200 and "Cancel 5 jobs?" in r.text
    assert [(await j.refresh()).status for j in jobs] == [Status.QUEUED] * 5  # not yet
    r = await post(c, "/ui/jobs/bulk", csrf, action="cancel", queue="batch", confirmed="5")
    assert r.status_code == 303
    assert [(await j.refresh()).status for j in jobs] == [Status.CANCELLED] * 5
    r = await post(c, f"/ui/jobs/{jobs[0].id}/retry", csrf)
    assert r.status_code == 303
    a = browser()
    acsrf = await sign_in(a, secrets["admin"])
    assert (await post(a, "/ui/queues/batch/pause", acsrf)).status_code == 303
    assert [q.paused for q in await app.queues() if q.name == "batch"] == [True]
    assert (await post(a, "/ui/queues/batch/resume", acsrf)).status_code == 303
    assert (await post(a, "/ui/schedules/nightly/disable", acsrf)).status_code == 303
    assert not {s.schedule.name: s for s in await app.list_schedules()}["nightly"].enabled
    assert (await post(a, "/ui/schedules/nightly/enable", acsrf)).status_code == 303
    assert (await post(a, "/ui/schedules/nightly/run", acsrf)).status_code == 303
    log = await (await app.store()).audit_log()
    actions = [(e.tenant, e.action) for e in reversed(log)]
    assert actions == [
        ("acme", "jobs.bulk_cancel"),
        ("acme", "job.retry"),
        ("ops", "queue.pause"),
        ("ops", "queue.resume"),
        ("ops", "schedule.disable"),
        ("ops", "schedule.enable"),
        ("ops", "schedule.run"),
    ]
    assert log[-1].detail == "5 jobs" and log[-2].target == jobs[0].id
    page = (await a.get("/ui/audit")).text
    assert "schedule.run" in page and "jobs.bulk_cancel" in page
    mine = (await c.get("/ui/audit")).text
    assert "jobs.bulk_cancel" in mine and "queue.pause" not in mine  # acme sees its own


async def test_retry_failed_children_retries_each_failed_child(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    parent = await app.submit("fan_out", {"n": 5, "fail": 2}, tenant="acme")
    async with running_worker(app):
        await settled(parent, Status.FAILED)
    c = browser()
    csrf = await sign_in(c, secrets["write"])
    page = (await c.get(f"/ui/jobs/{parent.id}")).text
    assert 'data-status="succeeded">3<' in page and 'data-status="failed">2<' in page
    assert "Retry the failed jobs below" in page and "(5/5 done)" in page
    r = await post(c, f"/ui/jobs/{parent.id}/retry-failed-children", csrf)
    assert r.status_code == 303
    below = (await app.page_jobs(parent_id=parent.id, limit=100)).jobs
    retried = sorted(h.record.retry_of for h in below if h.record.retry_of)
    assert retried == [f"{parent.id}.0", f"{parent.id}.1"]
    log = await (await app.store()).audit_log()
    assert (log[0].action, log[0].target, log[0].detail) == (
        "job.retry_failed_children",
        parent.id,
        "2 children retried",
    )


# -- the REST API and the CLI -----------------------------------------------------------------


async def test_api_schedules_and_queues_routes(
    app: Conveyor, browser: Any, secrets: dict[str, str]
):
    c = browser()
    read = {"Authorization": f"Bearer {secrets['read']}"}
    admin = {"Authorization": f"Bearer {secrets['admin']}"}
    r = await c.get("/schedules", headers=read)
    assert r.status_code == 200
    assert [s["name"] for s in r.json()["schedules"]] == ["hourly", "nightly"]
    assert (await c.post("/schedules/nightly/run", headers=read)).status_code == 403
    r = await c.post("/schedules/nightly/run", headers=admin)
    assert r.status_code == 202 and r.json()["type"] == "add"
    r = await c.post("/schedules/nightly/disable", headers=admin)
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert (await c.post("/schedules/nope/enable", headers=admin)).status_code == 404
    r = await c.post("/queues/mail/pause", headers=admin)
    assert r.json() == {"name": "mail", "paused": True, "counts": {}}
    assert (await c.get("/workers", headers=read)).status_code == 200
    log = await (await app.store()).audit_log()
    assert [e.action for e in log] == ["queue.pause", "schedule.disable", "schedule.run"]


def test_cli_queues_pause_resume_list(db_url: str) -> None:
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(main, [*args, "--database-url", db_url])
        assert result.exit_code == 0, result.output
        return result.output

    cli("migrate")
    assert "paused" in cli("queues", "pause", "mail")
    assert "yes" in cli("queues", "list")
    assert "resumed" in cli("queues", "resume", "mail")
    assert "yes" not in cli("queues", "list")


# -- the store operations the dashboard added -------------------------------------------------


async def test_store_audit_log_minute_stats_and_lease_names(app: Conveyor) -> None:
    store = await app.store()
    now = await store.now()
    for i, tenant in enumerate(["acme", "globex", "acme"]):
        entry = AuditEntry(now, tenant, f"tok{i}", "job.cancel", f"job{i}", detail="<b>")
        await store.record_audit(entry)
    every = await store.audit_log()
    assert [e.target for e in every] == ["job2", "job1", "job0"]  # newest first
    assert every[0].detail == "<b>" and every[0].id is not None
    assert [e.target for e in await store.audit_log(tenant="acme")] == ["job2", "job0"]
    older = await store.audit_log(before_id=every[0].id, limit=1)
    assert [e.target for e in older] == ["job1"]

    ok = await app.submit("add", {"a": 1, "b": 2})
    bad = await app.submit("explode", {})
    async with running_worker(app):
        await settled(ok, Status.SUCCEEDED)
        await settled(bad, Status.FAILED)
    stats = await store.minute_stats(now - timedelta(minutes=5))
    assert sum(m.succeeded for m in stats) == 1 and sum(m.failed for m in stats) == 1
    assert all(m.wait_seconds is not None and m.wait_seconds >= 0 for m in stats)
    assert await store.minute_stats(now + timedelta(minutes=5)) == []

    async with app.lease("b-export", ttl=30):
        pass
    async with app.lease("a-report", ttl=30):
        assert await store.lease_names() == ["a-report", "b-export"]


async def test_a_parent_reads_with_the_counts_of_the_jobs_below_it(app: Conveyor) -> None:
    parent = await app.submit("fan_out", {"n": 30, "fail": 4})
    async with running_worker(app):
        await settled(parent, Status.FAILED)
    below = (await app.get(parent.id)).below
    assert below is not None
    assert {k: v for k, v in below.by_status().items() if v} == {"succeeded": 26, "failed": 4}
    assert (below.done, below.total) == (30, 30)
    assert (await app.get(f"{parent.id}.0")).below is None


async def test_running_by_worker_and_the_overview_count_of_it(
    app: Conveyor, browser: Any, secrets: dict[str, str]
) -> None:
    job = await app.submit("crawl", {"steps": 10_000, "pause": 0.05}, tenant="acme")
    async with running_worker(app, queues=["slow"]) as worker:
        await eventually(lambda: _is_running(job))
        assert await app.ops.running_by_worker() == {worker.id: 1}
        c = browser()
        await sign_in(c, secrets["read"])
        page = (await c.get("/ui/")).text
        label = TenantView(app, Principal("tok", "acme", Role.READ)).worker_name(worker.id)
        assert re.search(rf"{label}</code>.*?<td class=\"num\">1</td>", page, re.S)
        await job.cancel()
        await settled(job, Status.CANCELLED)
    assert await app.ops.running_by_worker() == {}


async def _is_running(job: Any) -> bool:
    return (await job.refresh()).status is Status.RUNNING


async def test_a_bulk_action_never_acts_on_more_jobs_than_confirmed(
    app: Conveyor, browser: Any, secrets: dict[str, str]
) -> None:
    first = [await app.submit("add", {"a": i, "b": 0}, queue="b", tenant="acme") for i in (1, 2)]
    c = browser()
    csrf = await sign_in(c, secrets["write"])
    r = await post(c, "/ui/jobs/bulk", csrf, action="cancel", queue="b")
    assert "Cancel 2 jobs?" in r.text
    later = await app.submit("add", {"a": 3, "b": 0}, queue="b", tenant="acme")  # after it
    r = await post(c, "/ui/jobs/bulk", csrf, action="cancel", queue="b", confirmed="2")
    assert r.status_code == 303
    statuses = [(await j.refresh()).status for j in [*first, later]]
    assert statuses.count(Status.CANCELLED) == 2 and statuses.count(Status.QUEUED) == 1
    page = await c.get("/ui/jobs")
    assert "cancel: 2 jobs" in page.text


async def test_mounted_elsewhere_links_cookie_and_redirects_follow_the_mount(
    app: Conveyor, secrets: dict[str, str]
) -> None:
    main_app = FastAPI()
    main_app.mount("/ops/jobs-ui", create_dashboard(app))
    transport = httpx.ASGITransport(app=main_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        r = await c.get("/ops/jobs-ui/jobs")
        assert r.headers["location"] == "/ops/jobs-ui/login?next=%2Fjobs"
        r = await c.post(
            "/ops/jobs-ui/login", data={"token": secrets["read"], "next": "/jobs"}, headers=ORIGIN
        )
        assert r.headers["location"] == "/ops/jobs-ui/jobs"
        assert "path=/ops/jobs-ui" in r.headers["set-cookie"].lower()
        page = (await c.get("/ops/jobs-ui/jobs")).text
        assert 'href="/ops/jobs-ui/static/app.css"' in page
        assert (await c.get("/ops/jobs-ui/static/app.js")).status_code == 200


async def test_the_schedules_page_shows_each_overlap_policy(browser: Any, secrets: dict[str, str]):
    c = browser()
    await sign_in(c, secrets["read"])
    text = (await c.get("/ui/schedules")).text
    assert "<td>skip</td>" in text and "<td>allow</td>" in text
