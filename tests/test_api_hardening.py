"""The API against crafted input and a failing database, on both backends: every crafted
cursor, date, id and loosely typed number is a 4xx; made-up HTTP methods do not grow the
metrics; long polls are capped; answers carry security headers; /docs works offline behind
a token; and with the database gone the API answers 503 with Retry-After at once."""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from conveyor import Conveyor
from conveyor.cli._remote import RemoteClient
from conveyor.core.filter import JobFilter
from conveyor.errors import ConfigurationError, InvalidPayload
from conveyor.web import ApiOptions, create_api
from tests.apiserver import api_for_tests, serving
from tests.apps.api import build
from tests.servers import Relay


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    yield application
    await application.close()


async def bearer(app: Conveyor, tenant: str, role: str = "write") -> dict[str, str]:
    _, secret = await app.create_token(tenant=tenant, role=role)
    return {"Authorization": f"Bearer {secret}"}


def client_of(app: Conveyor, options: ApiOptions | None = None) -> httpx.AsyncClient:
    # A database timeout a loaded machine keeps within, but where a test is about it.
    api = create_api(app, options=options) if options else api_for_tests(app)
    transport = httpx.ASGITransport(app=api)
    return httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=60)


def _old_style_cursor(created_at: str, job_id: str) -> str:
    raw = json.dumps([created_at, job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# -- cursors ----------------------------------------------------------------------------------


async def test_crafted_cursors_are_422_and_reveal_nothing(app: Conveyor) -> None:
    acme = await bearer(app, "acme", "read")
    globex = await bearer(app, "globex", "read")
    for n in range(3):
        await app.submit("add", {"a": n, "b": 1}, tenant="acme")
    secret = await app.submit("add", {"a": 9, "b": 9}, tenant="globex", id="globex-secret")
    async with client_of(app) as c:
        first = await c.get("/jobs?limit=1", headers=acme)
        assert first.status_code == 200
        following = first.json()["next"]
        assert following is not None
        assert (await c.get(following, headers=acme)).status_code == 200  # a real cursor works
        signed = following.split("cursor=")[1]
        unsigned = signed.rsplit(".", 1)[0]
        stamp = secret.record.created_at.isoformat()
        crafted = {
            "garbage": "not-a-cursor",
            "unsigned": unsigned,
            "tampered": unsigned + "." + "A" * 32,
            "existing id": _old_style_cursor(stamp, "globex-secret"),
            "missing id": _old_style_cursor(stamp, "no-such-job"),
            "signed existing": _old_style_cursor(stamp, "globex-secret") + "." + "A" * 32,
            "bad json": base64.urlsafe_b64encode(b"[1,").decode() + "." + "B" * 32,
        }
        details = {}
        for name, cursor in crafted.items():
            r = await c.get("/jobs", params={"cursor": cursor}, headers=acme)
            assert r.status_code == 422, (name, r.text)
            details[name] = r.json()["detail"]
        # Whether an id exists changes nothing in the answer.
        assert details["existing id"] == details["missing id"]
        # Another tenant's cursor is not accepted either.
        r = await c.get(following, headers=globex)
        assert r.status_code == 422


# -- dates, ids and types ---------------------------------------------------------------------

BAD_SUBMISSIONS: list[tuple[str, dict[str, Any], str]] = [
    ("run_at year 9999", {"run_at": "9999-12-31T23:59:59Z"}, "run_at"),
    ("run_at past year 9999 in UTC", {"run_at": "9999-12-31T23:59:59-05:00"}, "run_at"),
    ("run_at year 1", {"run_at": "0001-01-01T00:00:00+05:00"}, "run_at"),
    ("run_at 1969", {"run_at": "1969-12-31T23:59:59Z"}, "run_at"),
    ("id with a slash", {"id": "a/b"}, "id"),
    ("id with a space", {"id": "a b"}, "id"),
    ("id with a control character", {"id": "a\u0001b"}, "id"),
    ("id starting with a dot", {"id": ".hidden"}, "id"),
    ("id of 201 characters", {"id": "x" * 201}, "id"),
    ("id with a percent", {"id": "a%2Fb"}, "id"),
    ("priority true", {"priority": True}, "priority"),
    ("max_attempts true", {"max_attempts": True}, "max_attempts"),
    ("delay true", {"delay": True}, "delay"),
    ("delay as a string", {"delay": "5"}, "delay"),
    ("timeout as a string", {"timeout": "5"}, "timeout"),
    ("payload boolean for a number", {"payload": {"a": True, "b": 2}}, "a"),
    ("payload string for a number", {"payload": {"a": "1", "b": 2}}, "a"),
]


@pytest.mark.parametrize(
    "fields,phrase", [b[1:] for b in BAD_SUBMISSIONS], ids=[b[0] for b in BAD_SUBMISSIONS]
)
async def test_crafted_dates_ids_and_types_are_422(
    app: Conveyor, fields: dict[str, Any], phrase: str
) -> None:
    write = await bearer(app, "acme")
    body = {"type": "add", "payload": {"a": 1, "b": 2}, **fields}
    async with client_of(app) as c:
        r = await c.post("/jobs", json=body, headers=write)
        assert r.status_code == 422, r.text
        assert phrase in r.json()["detail"], r.json()["detail"]
        # As one item of a list too, and nothing is stored.
        r = await c.post(
            "/jobs", json=[{"type": "add", "payload": {"a": 1, "b": 1}}, body], headers=write
        )
        assert r.status_code == 422, r.text
    assert (await app.page_jobs()).jobs == []


async def test_the_python_api_refuses_the_same_ids_and_dates(app: Conveyor) -> None:
    for bad in ("a/b", "a b", "", "-x", "x" * 201):
        with pytest.raises(InvalidPayload, match="a job id is"):
            await app.submit("add", {"a": 1, "b": 2}, id=bad)
    for when in (datetime(9999, 12, 31, tzinfo=UTC), datetime(1969, 1, 1, tzinfo=UTC)):
        with pytest.raises(ConfigurationError, match="run_at must be in the years"):
            await app.submit("add", {"a": 1, "b": 2}, run_at=when)
    ok = await app.submit("add", {"a": 1, "b": 2}, id="Invoice-42.v2:eu@acme+x=y_z")
    assert ok.id == "Invoice-42.v2:eu@acme+x=y_z"


# -- metrics ----------------------------------------------------------------------------------


async def _call(api: Any, method: str) -> int:
    """One request straight to the ASGI application (no HTTP client: 20,000 are cheap)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/jobs",
        "raw_path": b"/jobs",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await api(scope, receive, send)
    return status


def _series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


async def test_made_up_methods_leave_the_metrics_series_count_unchanged(tmp_path: Any) -> None:
    app = build(f"sqlite:///{tmp_path / 'metrics.db'}")  # no storage involved: one backend
    read = await bearer(app, "acme", "admin")  # the server's own series are an admin's
    api = api_for_tests(app)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        assert await _call(api, "BREW") == 405  # the label of any made-up method exists now
        await c.get("/metrics", headers=read)  # and the series of scraping
        before = (await c.get("/metrics", headers=read)).text
        for n in range(20_000):
            await _call(api, f"X{n}")
        after = (await c.get("/metrics", headers=read)).text
    await app.close()
    assert _series(after) == _series(before)
    assert 'method="other"' in after and "X19999" not in after


# -- long polls -------------------------------------------------------------------------------


async def test_long_polls_are_capped_per_token_and_in_total(app: Conveyor) -> None:
    job = await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
    one, two = await bearer(app, "acme", "read"), await bearer(app, "acme", "read")
    ops = await bearer(app, "ops", "admin")  # reads the server's own series
    options = ApiOptions(
        max_long_polls=3, max_long_polls_per_token=2, wait_tick=0.05, db_timeout=10.0
    )
    async with client_of(app, options) as c:
        url = f"/jobs/{job.id.removeprefix('acme/')}?wait=30"  # acme's name for its job
        waiting = [asyncio.create_task(c.get(url, headers=one)) for _ in range(2)]

        async def polls() -> int:
            text = (await c.get("/metrics", headers=ops)).text
            line = next(x for x in text.splitlines() if x.startswith("conveyor_http_long_polls "))
            return int(float(line.split()[1]))

        deadline = time.monotonic() + 30
        while await polls() < 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        r = await c.get(url, headers=one)
        assert r.status_code == 429 and r.headers["Retry-After"]
        assert "this token already has 2 requests waiting" in r.json()["detail"]
        third = asyncio.create_task(c.get(url, headers=two))  # the last one in total
        while await polls() < 3:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        r = await c.get(url, headers=two)
        assert r.status_code == 429 and "the server already has 3" in r.json()["detail"]
        assert (await c.get(url.partition("?")[0], headers=two)).status_code == 200  # no wait
        await app.cancel(job.id)  # the waiters answer
        for task in [*waiting, third]:
            assert (await task).status_code == 200


# -- headers and /docs ------------------------------------------------------------------------


async def test_answers_carry_security_headers(app: Conveyor) -> None:
    async with client_of(app) as c:
        for path in ("/health/live", "/jobs", "/ui/login", "/docs", "/no-such-route"):
            r = await c.get(path)
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["x-frame-options"] == "DENY", path
            # The dashboard's own: same-origin, for its Referer check of forms.
            assert r.headers["referrer-policy"] in ("no-referrer", "same-origin"), path
            policy = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy, path
            if path in ("/ui/login", "/docs"):
                assert "script-src 'self'" in policy and "http" not in policy
            else:
                assert policy.startswith("default-src 'none'")
            assert "strict-transport-security" not in r.headers  # plain HTTP


async def test_docs_serve_local_assets_and_the_document_needs_a_token(app: Conveyor) -> None:
    read = await bearer(app, "acme", "read")
    async with client_of(app) as c:
        page = await c.get("/docs")
        assert page.status_code == 200 and "cdn" not in page.text.lower()
        assert "https://" not in page.text and "http://" not in page.text
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css", "docs.js", "docs.css"):
            assert f'"/docs/{asset}"' in page.text
            r = await c.get(f"/docs/{asset}")
            assert r.status_code == 200 and len(r.content) > 100, asset
        assert (await c.get("/docs/../../etc/passwd")).status_code == 404
        assert (await c.get("/docs/index.html")).status_code == 404
        assert (await c.get("/openapi.json")).status_code == 401
        document = await c.get("/openapi.json", headers=read)
        assert document.status_code == 200 and "/jobs" in document.json()["paths"]
    async with client_of(app, ApiOptions(docs=False, db_timeout=10.0)) as c:
        assert (await c.get("/docs")).status_code == 404


# -- the database gone --------------------------------------------------------------------------


async def _answers_503_at_once(c: httpx.AsyncClient, path: str, headers: dict[str, str]) -> None:
    started = time.monotonic()
    r = await c.get(path, headers=headers)
    elapsed = time.monotonic() - started
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"] == "2"
    # db_timeout is 0.5 s; the margin is for a loaded machine (before: 5 s and a 500).
    assert elapsed < 3.0, elapsed


async def test_with_postgresql_gone_the_api_answers_503_within_its_timeout(
    postgres_database: str,
) -> None:
    host, _, rest = postgres_database.partition("@")[2].partition(":")
    port, _, database = rest.partition("/")
    relay = Relay((host, int(port)))
    app = build(f"postgresql://postgres@127.0.0.1:{relay.port}/{database}")
    try:
        read = await bearer(app, "acme", "read")
        job = await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
        async with client_of(app, ApiOptions()) as c:
            assert (await c.get("/health/ready")).status_code == 200
            assert (await c.get(f"/jobs/{job.id}", headers=read)).status_code == 200
            relay.cut()
            await _answers_503_at_once(c, "/health/ready", {})
            await _answers_503_at_once(c, "/health/ready", read)
            await _answers_503_at_once(c, f"/jobs/{job.id}", read)
            await _answers_503_at_once(c, "/jobs", read)
    finally:
        relay.cut()
        await app.close()


async def test_with_the_sqlite_file_locked_the_api_answers_503_within_its_timeout(
    tmp_path: Any,
) -> None:
    path = tmp_path / "locked.db"
    app = build(f"sqlite:///{path}")
    try:
        _, secret = await app.create_token(tenant="acme", role="read")
        read = {"Authorization": f"Bearer {secret}"}
        async with client_of(app, ApiOptions()) as c:
            # Another process holds the write lock: the first use of a token records it.
            other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("UPDATE conveyor_tokens SET name = 'held'")
                await _answers_503_at_once(c, "/jobs", read)
            finally:
                other.execute("ROLLBACK")
                other.close()
            assert (await c.get("/jobs", headers=read)).status_code == 200
    finally:
        await app.close()


# -- pages limited in bytes ---------------------------------------------------------------------


async def test_pages_stop_at_the_byte_limit_and_clients_follow_them(app: Conveyor) -> None:
    for n in range(12):
        await app.submit("explode", {"message": f"{n:02d}" + "x" * 30_000}, tenant="acme")
    read = await bearer(app, "acme", "read")
    options = ApiOptions(max_page_bytes=64 * 1024, db_timeout=10.0)
    async with client_of(app, options) as c:
        seen: list[str] = []
        url: str | None = "/jobs?limit=1000"
        pages = 0
        while url is not None:
            r = await c.get(url, headers=read)
            assert r.status_code == 200 and len(r.content) <= 64 * 1024
            seen += [job["id"] for job in r.json()["jobs"]]
            url = r.json()["next"]
            pages += 1
        assert len(seen) == len(set(seen)) == 12 and pages >= 6
    served = build(str(app.url))  # the server's own instance: it runs on a loop of its own
    with serving(served, create_api(served, options=options)) as server:
        secret = read["Authorization"].split()[1]
        async with RemoteClient(server.base_url, secret) as remote:
            jobs = await remote.list_jobs(JobFilter.of(), limit=7)
    assert len(jobs) == 7 and [j.id for j in jobs] == seen[:7]
