"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright.

Each test serves the API with the dashboard over real HTTP and runs a worker on the test's
loop; it waits for conditions (Playwright's auto-waiting expectations, or the database),
never for a fixed time. Screenshots of every page, light and dark, laptop and phone, are
saved under tests/artifacts/screenshots/ (git-ignored).
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor import Conveyor, JobHandle, Status
from conveyor.web import ApiOptions, create_api
from conveyor.web.ui import DashboardOptions, create_dashboard
from tests.apiserver import ServerThread, serving
from tests.apps.ui import build
from tests.helpers import eventually, running_worker, settled

playwright_api = pytest.importorskip("playwright.async_api")
expect = playwright_api.expect

CHROMIUM = os.environ.get("CONVEYOR_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(__file__).parent / "artifacts" / "screenshots"
ACTIONS = re.compile("cancel|retry|pause|resume|run|enable|disable", re.IGNORECASE)
WAIT_MS = 30_000  # the longest a condition may take on a loaded machine

pytestmark = pytest.mark.timeout(180)


def local(job: JobHandle) -> str:
    """A tenant's job as the tenant's own token names it: without the tenant's prefix."""
    return job.id.removeprefix(f"{job.record.tenant}/")


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    await application.migrate()
    await application.sync_schedules()
    yield application
    await application.close()


@pytest.fixture
def server(app: Conveyor, db_url: str) -> Iterator[ServerThread]:
    """The API with the dashboard mounted by hand at /ui, as an application would."""
    served = build(db_url)  # its own instance: the server runs on a loop of its own
    main = create_api(served, options=ApiOptions(dashboard=False))
    dashboard = create_dashboard(served, options=DashboardOptions(refresh=0.25))
    main.mount("/ui", dashboard)
    with serving(served, main) as running:
        yield running


@pytest.fixture
async def tokens(app: Conveyor) -> dict[str, str]:
    out = {}
    for who, tenant, role in [("read", "acme", "read"), ("write", "acme", "write")]:
        _, out[who] = await app.create_token(tenant=tenant, role=role, name=who)
    _, out["admin"] = await app.create_token(tenant="ops", role="admin", name="admin")
    return out


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `bash scripts/setup` (it installs chromium)")
    async with playwright_api.async_playwright() as p:
        launched = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        expect.set_options(timeout=WAIT_MS)
        yield launched
        await launched.close()


async def open_page(browser: Any, **kw: Any) -> Any:
    context = await browser.new_context(**kw)
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    return page


async def sign_in(browser: Any, server: ServerThread, token: str, **kw: Any) -> Any:
    page = await open_page(browser, **kw)
    await page.goto(f"{server.base_url}/ui/")
    await expect(page).to_have_url(f"{server.base_url}/ui/login?next=%2F")
    await page.get_by_label("API token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    return page


async def shoot(page: Any, backend: str, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        await page.emulate_media(color_scheme=scheme)
        await page.screenshot(path=str(SHOTS / f"{backend}-{name}-{scheme}.png"), full_page=True)


# -- a tour of every page: sign in, filter, open a job, retry a failed one ---------------------


async def test_tour_sign_in_filter_open_and_retry(
    app: Conveyor, server: ServerThread, tokens: dict[str, str], browser: Any, backend: str
) -> None:
    failed = await app.submit("explode", {"message": "disk full"}, tenant="acme")
    done = await app.submit("add", {"a": 2, "b": 3}, tenant="acme")
    parent = await app.submit("fan_out", {"n": 6, "fail": 1}, tenant="acme")
    async with running_worker(app, queues=["default", "slow"]):
        for job, status in [(failed, Status.FAILED), (done, Status.SUCCEEDED)]:
            await settled(job, status)
        await settled(parent, Status.FAILED)
        async with app.lease("nightly-export", ttl=30):
            pass
    await app.pause("slow")
    page = await sign_in(browser, server, tokens["write"])
    # The worker has stopped: no live worker is left, which the health check calls unhealthy.
    await expect(page.locator(".verdict")).to_have_text("unhealthy")
    await shoot(page, backend, "overview")

    # Filter: only failed jobs.
    await page.get_by_role("link", name="Jobs", exact=True).click()
    await page.get_by_label("failed").check()
    await page.get_by_role("button", name="Filter").click()
    rows = page.locator("#rows tr")
    await expect(rows).to_have_count(2)  # the failed job and the failed parent
    await expect(page.locator("#rows")).not_to_contain_text(local(done))
    await shoot(page, backend, "jobs")

    # Open the failed job: its error and traceback, then retry it.
    await page.get_by_role("link", name=local(failed)).click()
    await expect(page.get_by_role("heading", name=f"Job {local(failed)}")).to_be_visible()
    await expect(page.locator(".timeline")).to_contain_text("disk full")
    await page.get_by_text("Traceback").first.click()
    await expect(page.locator(".timeline pre")).to_contain_text("RuntimeError")
    await shoot(page, backend, "job-failed")
    await page.get_by_role("button", name="Retry job").click()
    await expect(page.locator(".flash")).to_contain_text(f"job {local(failed)} retried as")
    await expect(page.get_by_role("heading", name="Retry of")).to_be_visible()
    retried = (await app.page_jobs(status=["queued"], limit=10)).jobs
    assert [h.record.retry_of for h in retried] == [failed.id]

    # The parent with its tree, and a page per remaining section.
    await page.goto(f"{server.base_url}/ui/jobs/{local(parent)}")
    await expect(page.locator('[data-status="succeeded"]')).to_have_text("5")
    await shoot(page, backend, "job-tree")
    for name in ("queues", "schedules", "workers", "leases", "audit"):
        await page.goto(f"{server.base_url}/ui/{name}")
        await expect(page.locator("h1")).to_be_visible()
        await shoot(page, backend, name)
    await expect(page.locator("main")).to_contain_text("job.retry")

    # A phone: the same pages fit a narrow screen.
    phone = await sign_in(
        browser, server, tokens["write"], viewport={"width": 390, "height": 844}, is_mobile=True
    )
    await shoot(phone, backend, "overview-phone")
    await phone.goto(f"{server.base_url}/ui/jobs/{local(parent)}")
    await shoot(phone, backend, "job-phone")


# -- live: a progress bar advancing, then cancelling the running job ---------------------------


async def test_progress_bar_advances_and_a_running_job_is_cancelled(
    app: Conveyor, server: ServerThread, tokens: dict[str, str], browser: Any, backend: str
) -> None:
    job = await app.submit("crawl", {"steps": 400, "pause": 0.05}, tenant="acme")
    page = await sign_in(browser, server, tokens["write"])
    async with running_worker(app, queues=["slow"]):
        # The jobs list: the visible row refreshes in place as the job runs.
        await page.goto(f"{server.base_url}/ui/jobs?queue=slow")
        row_bar = page.locator("#rows progress")
        await expect(row_bar).to_be_visible()
        start = float(await row_bar.get_attribute("value") or 0)
        await page.wait_for_function(
            "v => Number(document.querySelector('#rows progress').value) > v + 2", arg=start
        )
        await page.get_by_role("link", name=local(job)).click()
        bar = page.locator("progress")
        await expect(bar).to_be_visible()  # appears without a reload once the job runs
        first = float(await bar.get_attribute("value") or 0)
        await page.wait_for_function(
            "v => Number(document.querySelector('progress').value) > v + 2", arg=first
        )
        await expect(page.locator(".msg")).to_contain_text("of 400")
        await expect(page.locator(".eta")).to_contain_text("left")
        await shoot(page, backend, "job-running")
        await page.get_by_role("button", name="Cancel job").click()
        await expect(page.locator("#status")).to_contain_text("cancelled")
    assert (await job.refresh()).status is Status.CANCELLED


# -- live: a 200-child bulk job's tree and counts fill in --------------------------------------


async def test_a_bulk_jobs_tree_and_counts_fill_in(
    app: Conveyor, server: ServerThread, tokens: dict[str, str], browser: Any, backend: str
) -> None:
    parent = await app.submit("fan_out", {"n": 200, "pause": 0.01}, tenant="acme")
    page = await sign_in(browser, server, tokens["write"])
    await page.goto(f"{server.base_url}/ui/jobs/{local(parent)}")
    await expect(page.locator("#status")).to_contain_text("queued")
    async with running_worker(app, concurrency=8):
        # The page is not reloaded: the live refresh brings the tree, then its counts.
        await expect(
            page.get_by_role("heading", name=re.compile(r"Sub-jobs \(\d+.200 done\)"))
        ).to_be_visible()
        await expect(page.locator('[data-status="succeeded"]')).to_have_text("200")
        await expect(page.locator("#status")).to_contain_text("succeeded")
    await shoot(page, backend, "job-bulk")
    await expect(page.locator(".tree li")).to_have_count(200)


# -- pausing a queue stops workers claiming from it --------------------------------------------


async def test_pausing_a_queue_stops_workers_claiming_from_it(
    app: Conveyor, server: ServerThread, tokens: dict[str, str], browser: Any
) -> None:
    first = await app.submit("add", {"a": 1, "b": 1}, tenant="ops")
    page = await sign_in(browser, server, tokens["admin"])
    async with running_worker(app, queues=["default", "slow"]):
        await settled(first, Status.SUCCEEDED)
        await page.goto(f"{server.base_url}/ui/queues")
        await page.get_by_role("button", name="Pause default").click()
        await expect(page.locator("#queue-default")).to_contain_text("paused")
        held = await app.submit("add", {"a": 2, "b": 2}, tenant="ops")
        # The worker keeps claiming from the other queue, never from the paused one.
        control = await app.submit("crawl", {"steps": 1, "pause": 0}, tenant="ops")
        await settled(control, Status.SUCCEEDED)
        assert (await held.refresh()).status is Status.QUEUED
        await page.get_by_role("button", name="Resume default").click()
        await expect(page.locator("#queue-default")).to_contain_text("active")
        await settled(held, Status.SUCCEEDED)
    log = await (await app.store()).audit_log()
    assert [e.action for e in log] == ["queue.resume", "queue.pause"]


# -- a read-only token sees no button, and its POSTs are refused -------------------------------


async def test_a_read_only_token_sees_no_buttons(
    app: Conveyor, server: ServerThread, tokens: dict[str, str], browser: Any, backend: str
) -> None:
    failed = await app.submit("explode", {}, tenant="acme")
    async with running_worker(app):
        await settled(failed, Status.FAILED)
    page = await sign_in(browser, server, tokens["read"])
    for path in ("/", "/jobs", f"/jobs/{local(failed)}", "/queues", "/schedules"):
        await page.goto(f"{server.base_url}/ui{path}")
        await expect(page.locator("h1")).to_be_visible()
        await expect(page.locator("main form[method=post]")).to_have_count(0)
        await expect(page.get_by_role("button", name=ACTIONS)).to_have_count(0)
    await shoot(page, backend, "job-read-only")
    csrf = await page.locator('meta[name="csrf-token"]').get_attribute("content")
    refused = await page.request.post(
        f"{server.base_url}/ui/jobs/{local(failed)}/retry",
        form={"csrf": csrf},
        headers={"Origin": server.base_url},
    )
    assert refused.status == 403
    assert (await failed.refresh()).status is Status.FAILED
    await eventually(lambda: _no_audit(app))


async def _no_audit(app: Conveyor) -> bool:
    return await (await app.store()).audit_log() == []
