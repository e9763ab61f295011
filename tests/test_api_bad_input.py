"""Malformed requests get a clear 4xx problem, never a 500, and leave the tables as they were."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from conveyor import Conveyor
from tests.apiserver import api_for_tests, serving
from tests.apps.api import build


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    yield application
    await application.close()


@pytest.fixture
def api(app: Conveyor) -> FastAPI:
    return api_for_tests(app, max_body_bytes=1024 * 1024)


@pytest.fixture
async def write(app: Conveyor) -> dict[str, str]:
    _, secret = await app.create_token(tenant="acme", role="write")
    return {"Authorization": f"Bearer {secret}"}


async def tables(app: Conveyor) -> Any:
    page = await app.page_jobs(limit=1000)
    return sorted((h.id, h.status.value) for h in page.jobs), await app.queues()


def nested(depth: int) -> str:
    return '{"type": "add", "payload": {"a": ' + "[" * depth + "]" * depth + ', "b": 1}}'


BODIES: list[tuple[str, bytes, str, int, str]] = [
    ("malformed JSON", b'{"type": "add", "payload": {', "application/json", 400, "not valid JSON"),
    ("empty body", b"", "application/json", 400, "empty"),
    ("not UTF-8", b'{"type": "\xff"}', "application/json", 400, "UTF-8"),
    ("form data", b"type=add", "application/x-www-form-urlencoded", 415, "Content-Type"),
    ("no content type", b'{"type": "add"}', "", 415, "Content-Type"),
    (
        "escaped NUL",
        b'{"type": "add", "payload": {"a": "x\\u0000"}}',
        "application/json",
        422,
        "NUL",
    ),
    (
        "raw NUL",
        b'{"type": "add", "payload": {"a": "x\x00"}}',
        "application/json",
        400,
        "not valid JSON",
    ),
    (
        "lone surrogate",
        b'{"type": "add", "payload": {"a": "\\ud800"}}',
        "application/json",
        422,
        "surrogate",
    ),
    ("nested 40 deep", nested(40).encode(), "application/json", 422, "nests deeper"),
    ("nested 100000 deep", nested(100_000).encode(), "application/json", 400, "nests deeper"),
    ("NaN", b'{"type": "add", "payload": {"a": NaN, "b": 1}}', "application/json", 400, "finite"),
    ("a string body", b'"add"', "application/json", 422, "JSON object"),
    ("an empty list", b"[]", "application/json", 422, "empty"),
    (
        "huge priority",
        b'{"type": "add", "payload": {"a": 1, "b": 1}, "priority": 1e30}',
        "application/json",
        422,
        "priority",
    ),
    ("a wrong field type", b'{"type": ["add"]}', "application/json", 422, "type"),
]


@pytest.mark.parametrize(
    "body,content_type,status,phrase", [b[1:] for b in BODIES], ids=[b[0] for b in BODIES]
)
async def test_bad_bodies_are_refused_with_a_problem(
    app: Conveyor,
    api: FastAPI,
    write: dict[str, str],
    body: bytes,
    content_type: str,
    status: int,
    phrase: str,
) -> None:
    before = await tables(app)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        headers = {**write, "Content-Type": content_type} if content_type else write
        r = await c.post("/jobs", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert phrase in r.json()["detail"], r.json()["detail"]
    assert r.json()["status"] == status
    assert await tables(app) == before


QUERIES = [
    ("/jobs?status=running' OR 1=1--", "status"),
    ("/jobs?limit=-1", "limit"),
    ("/jobs?limit=0", "limit"),
    ("/jobs?limit=1000000", "limit"),
    ("/jobs?limit=ten", "limit"),
    ("/jobs?sort=payload", "sort"),
    ("/jobs?created_after=yesterday", "created_after"),
    ("/jobs?cursor=not-a-cursor", "cursor"),
    ("/jobs?type=%00", "type"),
    ("/jobs?include_children=maybe", "include_children"),
    ("/jobs/x%00y", "job_id"),
    ("/jobs/JOB?wait=-1", "wait"),
    ("/jobs/JOB?wait=1e9", "wait"),
    ("/jobs/JOB?wait=nan", "wait"),
    ("/jobs/" + "x" * 302, "job_id"),
]


@pytest.mark.parametrize("url,field", QUERIES, ids=[q[0][:40] for q in QUERIES])
async def test_bad_query_parameters_are_refused_with_a_problem(
    app: Conveyor, api: FastAPI, write: dict[str, str], url: str, field: str
) -> None:
    job = await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
    before = await tables(app)
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        r = await c.get(url.replace("JOB", job.id), headers=write)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert field in r.json()["detail"], r.json()
    assert await tables(app) == before


@pytest.fixture
def server(app: Conveyor, api: FastAPI) -> Iterator[str]:
    with serving(app, api) as running:
        yield running.base_url


async def test_a_10_mb_body_is_refused_before_it_is_read(
    app: Conveyor, server: str, write: dict[str, str]
) -> None:
    big = json.dumps({"type": "add", "payload": {"a": 1, "b": 2, "pad": "x" * 10_000_000}})
    async with httpx.AsyncClient(base_url=server, headers=write, timeout=30) as c:
        r = await c.post("/jobs", content=big, headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert "limit of 1048576 bytes" in r.json()["detail"]

        async def chunks() -> AsyncIterator[bytes]:
            # No Content-Length: the limit holds while the body streams in.
            yield b'{"type": "add", "payload": {"a": 1, "b": 2, "pad": "'
            for _ in range(100):
                yield b"x" * 100_000
            yield b'"}}'

        r = await c.post("/jobs", content=chunks(), headers={"Content-Type": "application/json"})
        assert r.status_code == 413
        assert r.headers["content-type"] == "application/problem+json"
    assert (await tables(app))[0] == []


async def test_unknown_routes_and_methods_are_problems(api: FastAPI) -> None:
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        r = await c.get("/nowhere")
        assert r.status_code == 404 and "openapi.json" in r.json()["detail"]
        r = await c.delete("/jobs")
        assert r.status_code == 405 and r.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("action", ["cancel", "retry", "retry-failed-children"])
async def test_a_405_below_a_job_allows_what_the_document_says(api: FastAPI, action: str) -> None:
    # /jobs/0/retry is job 0's retry (POST only), not a job called "0/retry" to GET (ST205).
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        for path in [f"/jobs/0/{action}", f"/jobs/acme/x/{action}"]:
            for method in ["GET", "OPTIONS", "PUT", "DELETE", "PATCH"]:
                r = await c.request(method, path)
                assert r.status_code == 405, (method, path, r.status_code)
                assert r.headers["allow"] == "POST", (method, path)
        for below in ["attempts", "children", "events"]:
            r = await c.request("OPTIONS", f"/jobs/0/{below}")
            assert r.status_code == 405 and r.headers["allow"] == "GET", below
        r = await c.request("OPTIONS", "/jobs/acme/x")  # a job itself, by its stored id
        assert r.status_code == 405 and r.headers["allow"] == "GET"
