"""The REST API on every backend: submit, poll, long-poll, list, cancel, retry, operations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from conveyor import Conveyor, Status
from tests.apiserver import api_for_tests, serving
from tests.apps.api import build
from tests.helpers import eventually, running_worker
from tests.processes import WorkerProcesses


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    yield application
    await application.close()


@pytest.fixture
def api(app: Conveyor) -> FastAPI:
    return api_for_tests(app, wait_tick=0.02)


@pytest.fixture
async def tokens(app: Conveyor) -> dict[str, dict[str, str]]:
    """Bearer headers: acme's read and write tokens, globex's write token, an admin."""
    out = {}
    for who, tenant, role in [
        ("read", "acme", "read"),
        ("write", "acme", "write"),
        ("other", "globex", "write"),
        ("admin", "ops", "admin"),
    ]:
        _, secret = await app.create_token(tenant=tenant, role=role, name=who)
        out[who] = {"Authorization": f"Bearer {secret}"}
    return out


@pytest.fixture
async def client(api: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


async def count_jobs(app: Conveyor) -> int:
    page = await app.page_jobs(limit=1000)
    return len(page.jobs)


# -- end to end over real HTTP, with a real worker process ------------------------------------


@pytest.mark.processes
async def test_submit_then_poll_until_succeeded_over_real_http(
    app: Conveyor, api: FastAPI, tokens: dict[str, dict[str, str]], db_url: str, tmp_path: Path
) -> None:
    workers = WorkerProcesses(db_url, tmp_path / "records", tmp_path)
    with serving(app, api) as server:
        workers.start("--poll-interval", "0.05", app="tests.apps.api:app")
        try:
            async with httpx.AsyncClient(base_url=server.base_url, headers=tokens["write"]) as c:
                r = await c.post("/jobs", json={"type": "add", "payload": {"a": 2, "b": 3}})
                assert r.status_code == 202, r.text
                location = r.headers["Location"]
                assert location == f"/jobs/{r.json()['id']}"
                assert r.json()["links"]["self"] == location
                deadline = time.monotonic() + 30
                while True:
                    r = await c.get(location)
                    assert r.status_code == 200
                    if r.json()["terminal"]:
                        break
                    assert int(r.headers["Retry-After"]) >= 1
                    assert time.monotonic() < deadline, "the job did not end in 30s"
                    await asyncio.sleep(0.05)
                job = r.json()
                assert job["status"] == "succeeded"
                assert job["result"] == 5
                assert job["attempts"] == 1
                assert "Retry-After" not in r.headers
                r = await c.get(job["links"]["attempts"])
                assert [a["outcome"] for a in r.json()["attempts"]] == ["succeeded"]
        finally:
            workers.stop_all()


@pytest.mark.processes
async def test_long_poll_returns_as_soon_as_the_job_ends(
    app: Conveyor, api: FastAPI, tokens: dict[str, dict[str, str]], db_url: str, tmp_path: Path
) -> None:
    workers = WorkerProcesses(db_url, tmp_path / "records", tmp_path)
    with serving(app, api) as server:
        workers.start("--poll-interval", "0.05", app="tests.apps.api:app")
        try:
            async with httpx.AsyncClient(
                base_url=server.base_url, headers=tokens["write"], timeout=60
            ) as c:
                # Let the worker start first: the measure is about the poll, not start-up.
                warm = await c.post("/jobs", json={"type": "add", "payload": {"a": 1, "b": 1}})
                r = await c.get(warm.headers["Location"], params={"wait": 30})
                assert r.json()["status"] == "succeeded"

                r = await c.post("/jobs", json={"type": "nap", "payload": {"seconds": 1.0}})
                started = time.monotonic()
                polls_before = api.state.waiters.polls
                r = await c.get(r.headers["Location"], params={"wait": 30})
                elapsed = time.monotonic() - started
                answered = time.time()
                job = r.json()
                assert job["status"] == "succeeded", job
                assert 0.9 < elapsed < 5.0, elapsed
                finished = job["finished_at"]
                from datetime import datetime

                lag = answered - datetime.fromisoformat(finished).timestamp()
                assert lag < 1.0, f"answered {lag:.3f}s after the job ended"
                # One shared query per tick, whatever the number of waiters.
                polls = api.state.waiters.polls - polls_before
                assert polls <= elapsed / 0.02 + 5
        finally:
            workers.stop_all()


async def test_many_long_polls_share_one_query_per_tick(
    app: Conveyor, api: FastAPI, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    ids = []
    for i in range(20):
        r = await client.post(
            "/jobs", json={"type": "add", "payload": {"a": i, "b": 0}}, headers=tokens["write"]
        )
        ids.append(r.json()["id"])
    before = api.state.waiters.polls

    async def poll(job_id: str) -> httpx.Response:
        return await client.get(f"/jobs/{job_id}?wait=0.5", headers=tokens["read"])

    started = time.monotonic()
    answers = await asyncio.gather(*(poll(i) for i in ids))
    elapsed = time.monotonic() - started
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    assert all(r.json()["status"] == "queued" for r in answers)
    assert elapsed >= 0.5
    queries = api.state.waiters.polls - before
    # 20 clients for 0.5 s at a 0.02 s tick: ~25 shared queries, not ~500.
    assert queries <= elapsed / 0.02 + 5, queries


async def test_long_poll_wakes_when_an_in_process_worker_ends_the_job(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post(
        "/jobs", json={"type": "nap", "payload": {"seconds": 0.3}}, headers=tokens["write"]
    )
    location = r.headers["Location"]
    async with running_worker(app):
        r = await client.get(f"{location}?wait=20", headers=tokens["read"])
    assert r.json()["status"] == "succeeded"
    assert r.json()["result"] == "rested"
    assert r.json()["progress"]["total"] == 10


# -- submitting -------------------------------------------------------------------------------


async def test_client_id_makes_submit_idempotent(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    body = {"type": "add", "payload": {"a": 1, "b": 2}, "id": "order-42"}
    first = await client.post("/jobs", json=body, headers=tokens["write"])
    assert first.status_code == 202
    again = await client.post("/jobs", json=body, headers=tokens["write"])
    assert again.status_code == 200
    assert again.json()["id"] == "order-42" and again.headers["Location"] == "/jobs/order-42"
    changed = await client.post(
        "/jobs", json={**body, "payload": {"a": 1, "b": 3}}, headers=tokens["write"]
    )
    assert changed.status_code == 409
    assert changed.headers["content-type"] == "application/problem+json"
    assert "new id" in changed.json()["detail"]
    # Ids are per tenant: globex's order-42 is another job, and says nothing of acme's.
    theirs = await client.post("/jobs", json=body, headers=tokens["other"])
    assert theirs.status_code == 202 and theirs.json()["id"] == "order-42"
    assert theirs.json()["tenant"] == "globex"
    assert await count_jobs(app) == 2


async def test_idempotency_key_is_scoped_to_the_tenant(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    body = {"type": "add", "payload": {"a": 1, "b": 2}}
    key = {"Idempotency-Key": "7f1c-request"}
    first = await client.post("/jobs", json=body, headers={**tokens["write"], **key})
    again = await client.post("/jobs", json=body, headers={**tokens["write"], **key})
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["id"] == again.json()["id"]
    other = await client.post("/jobs", json=body, headers={**tokens["other"], **key})
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    changed = await client.post(
        "/jobs", json={**body, "payload": {"a": 9, "b": 9}}, headers={**tokens["write"], **key}
    )
    assert changed.status_code == 409
    assert await count_jobs(app) == 2


@pytest.mark.parametrize(
    ("option", "first", "second"),
    [
        ("queue", "default", "media"),
        ("priority", 0, 5),
        ("delay", 30, 60),
        ("max_attempts", 3, 7),
        ("timeout", 10, 20),
        ("unique_key", "u1", "u2"),
        ("run_at", "2999-01-01T00:00:00+00:00", "2999-01-02T00:00:00+00:00"),
    ],
)
async def test_an_idempotency_key_reused_with_another_option_is_a_conflict_naming_it(
    app: Conveyor,
    client: httpx.AsyncClient,
    tokens: dict[str, dict[str, str]],
    option: str,
    first: Any,
    second: Any,
) -> None:
    body = {"type": "add", "payload": {"a": 1, "b": 2}, option: first}
    headers = {**tokens["write"], "Idempotency-Key": f"order-{option}"}
    created = await client.post("/jobs", json=body, headers=headers)
    assert created.status_code == 202, created.text
    same = await client.post("/jobs", json=body, headers=headers)  # the same body, later
    assert same.status_code == 200 and same.json() == created.json()
    changed = await client.post("/jobs", json={**body, option: second}, headers=headers)
    assert changed.status_code == 409, changed.text
    detail = changed.json()["detail"]
    assert f"{option}:" in detail and "another request" in detail, detail
    assert await count_jobs(app) == 1


async def test_a_list_body_is_all_or_nothing(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    good = {"type": "add", "payload": {"a": 1, "b": 2}}
    bad = {"type": "add", "payload": {"a": "one"}}
    r = await client.post("/jobs", json=[good, good, bad], headers=tokens["write"])
    assert r.status_code == 422
    assert await count_jobs(app) == 0
    await client.post("/jobs", json={**good, "id": "held"}, headers=tokens["write"])
    conflicting = {"type": "add", "payload": {"a": 5, "b": 5}, "id": "held"}
    r = await client.post("/jobs", json=[good, conflicting], headers=tokens["write"])
    assert r.status_code == 409
    assert await count_jobs(app) == 1
    r = await client.post("/jobs", json=[good] * 5, headers=tokens["write"])
    assert r.status_code == 202
    assert "Location" not in r.headers
    assert len(r.json()) == 5 and all(j["status"] == "queued" for j in r.json())
    assert await count_jobs(app) == 6


async def test_unknown_types_and_bad_payloads_name_the_fields(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post("/jobs", json={"type": "nope"}, headers=tokens["write"])
    assert r.status_code == 422 and "unknown job type 'nope'" in r.json()["detail"]
    r = await client.post(
        "/jobs", json={"type": "add", "payload": {"a": "x"}}, headers=tokens["write"]
    )
    assert r.status_code == 422
    fields = {tuple(e["loc"]) for e in r.json()["errors"]}
    assert ("a",) in fields and ("b",) in fields
    r = await client.post("/jobs", json={"type": "add", "colour": 1}, headers=tokens["write"])
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "colour"]
    assert await count_jobs(app) == 0


async def test_a_job_types_authorize_check_refuses_other_accounts(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    mine = {"type": "charge", "payload": {"account": "acme:7", "cents": 100}}
    theirs = {"type": "charge", "payload": {"account": "globex:7", "cents": 100}}
    assert (await client.post("/jobs", json=mine, headers=tokens["write"])).status_code == 202
    r = await client.post("/jobs", json=theirs, headers=tokens["write"])
    assert r.status_code == 403 and "authorisation check" in r.json()["detail"]
    assert await count_jobs(app) == 1


async def test_submit_for_another_tenant_needs_admin(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    body = {"type": "add", "payload": {"a": 1, "b": 2}, "tenant": "globex"}
    assert (await client.post("/jobs", json=body, headers=tokens["write"])).status_code == 403
    r = await client.post("/jobs", json=body, headers=tokens["admin"])
    assert r.status_code == 202 and r.json()["tenant"] == "globex"
    r = await client.get(r.headers["Location"], headers=tokens["other"])
    assert r.status_code == 200


# -- reading ----------------------------------------------------------------------------------


async def test_etag_gives_304_while_unchanged(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post(
        "/jobs",
        json={"type": "add", "payload": {"a": 1, "b": 2}, "delay": 30},
        headers=tokens["write"],
    )
    location = r.headers["Location"]
    r = await client.get(location, headers=tokens["read"])
    etag = r.headers["ETag"]
    assert 25 <= int(r.headers["Retry-After"]) <= 31  # due in 30 s
    same = await client.get(location, headers={**tokens["read"], "If-None-Match": etag})
    assert same.status_code == 304 and same.content == b""
    assert same.headers["ETag"] == etag
    await app.cancel(f"acme/{r.json()['id']}")  # acme's job: stored as acme/<id>
    changed = await client.get(location, headers={**tokens["read"], "If-None-Match": etag})
    assert changed.status_code == 200 and changed.json()["status"] == "cancelled"
    assert changed.headers["ETag"] != etag and "Retry-After" not in changed.headers


async def test_listing_pages_filters_and_sorts(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    ids = []
    for i in range(7):
        r = await client.post(
            "/jobs", json={"type": "add", "payload": {"a": i, "b": 0}}, headers=tokens["write"]
        )
        ids.append(r.json()["id"])
    await client.post(
        "/jobs", json={"type": "nap", "payload": {"seconds": 1}}, headers=tokens["write"]
    )
    await client.post(
        "/jobs", json={"type": "add", "payload": {"a": 0, "b": 0}}, headers=tokens["other"]
    )
    seen: list[str] = []
    url: str | None = "/jobs?type=add&limit=3"
    pages = 0
    while url:
        r = await client.get(url, headers=tokens["read"])
        assert r.status_code == 200
        seen += [j["id"] for j in r.json()["jobs"]]
        url = r.json()["next"]
        if url:
            assert r.headers["Link"] == f'<{url}>; rel="next"'
        pages += 1
    assert seen == list(reversed(ids)) and pages == 3
    r = await client.get("/jobs?type=add&sort=created_at&limit=100", headers=tokens["read"])
    assert [j["id"] for j in r.json()["jobs"]] == ids and r.json()["next"] is None
    await app.cancel(f"acme/{ids[0]}")
    r = await client.get("/jobs?status=cancelled&status=failed", headers=tokens["read"])
    assert [j["id"] for j in r.json()["jobs"]] == [ids[0]]
    r = await client.get(
        "/jobs", params={"created_after": "2999-01-01T00:00:00Z"}, headers=tokens["read"]
    )
    assert r.json()["jobs"] == []
    r = await client.get("/jobs?limit=100", headers=tokens["admin"])
    assert len(r.json()["jobs"]) == 9
    r = await client.get("/jobs?tenant=globex", headers=tokens["admin"])
    assert len(r.json()["jobs"]) == 1


async def test_children_are_listed_only_when_asked(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post(
        "/jobs", json={"type": "fan_out", "payload": {"n": 3}}, headers=tokens["write"]
    )
    parent = r.json()
    async with running_worker(app):
        r = await client.get(f"{parent['links']['self']}?wait=20", headers=tokens["read"])
    assert r.json()["status"] == "succeeded"
    r = await client.get("/jobs", headers=tokens["read"])
    assert [j["id"] for j in r.json()["jobs"]] == [parent["id"]]
    r = await client.get("/jobs?include_children=true", headers=tokens["read"])
    assert len(r.json()["jobs"]) == 4
    r = await client.get(parent["links"]["children"], headers=tokens["read"])
    children = r.json()["jobs"]
    assert len(children) == 3
    assert all(
        c["tenant"] == "acme" and c["links"]["parent"] == parent["links"]["self"] for c in children
    )
    r = await client.get(f"/jobs?root={parent['id']}", headers=tokens["read"])
    assert len(r.json()["jobs"]) == 3


async def test_another_tenants_job_is_not_found(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post(
        "/jobs", json={"type": "add", "payload": {"a": 1, "b": 2}}, headers=tokens["write"]
    )
    self_url = r.json()["links"]["self"]
    for method, url in [
        ("GET", self_url),
        ("GET", f"{self_url}/attempts"),
        ("GET", f"{self_url}/children"),
        ("POST", f"{self_url}/cancel"),
        ("POST", f"{self_url}/retry"),
    ]:
        r = await client.request(method, url, headers=tokens["other"])
        assert r.status_code == 404, (method, url)
        assert "no job with id" in r.json()["detail"]
    r = await client.get("/jobs", headers=tokens["other"])
    assert r.json()["jobs"] == []
    # An admin names it by its stored id, tenant/id (a tenant's own id is not its name).
    stored = f"acme/{self_url.rsplit('/', 1)[1]}"
    assert (await client.get(self_url, headers=tokens["admin"])).status_code == 404
    assert (await client.get(f"/jobs/{stored}", headers=tokens["admin"])).status_code == 200
    assert (await app.get(stored)).status is Status.QUEUED


# -- steering ---------------------------------------------------------------------------------


async def test_cancel_and_retry_say_why_they_are_refused(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post(
        "/jobs", json={"type": "add", "payload": {"a": 1, "b": 2}}, headers=tokens["write"]
    )
    job = r.json()
    r = await client.post(
        job["links"]["retry"] or f"{job['links']['self']}/retry", headers=tokens["write"]
    )
    assert r.status_code == 409 and "only failed or cancelled" in r.json()["detail"]
    r = await client.post(job["links"]["cancel"], headers=tokens["write"])
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert r.json()["links"]["cancel"] is None
    r = await client.post(job["links"]["cancel"], headers=tokens["write"])
    assert r.status_code == 409 and "already cancelled" in r.json()["detail"]
    r = await client.post(f"{job['links']['self']}/retry", headers=tokens["write"])
    assert r.status_code == 202
    assert r.json()["retry_of"] == job["id"] and r.headers["Location"] == r.json()["links"]["self"]


async def test_a_running_job_is_asked_to_stop(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post(
        "/jobs", json={"type": "nap", "payload": {"seconds": 20}}, headers=tokens["write"]
    )
    job = r.json()
    async with running_worker(app):
        for _ in range(500):
            if (await app.get(f"acme/{job['id']}")).status is Status.RUNNING:
                break
            await asyncio.sleep(0.01)
        r = await client.post(job["links"]["cancel"], headers=tokens["write"])
        assert r.status_code == 202 and r.json()["cancel_requested"]
        r = await client.get(f"{job['links']['self']}?wait=20", headers=tokens["read"])
    assert r.json()["status"] == "cancelled"
    r = await client.get(job["links"]["attempts"], headers=tokens["read"])
    assert r.json()["attempts"][-1]["outcome"] == "cancelled"


async def test_failed_jobs_show_their_error_and_traceback(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    r = await client.post(
        "/jobs", json={"type": "explode", "payload": {"message": "kaput"}}, headers=tokens["write"]
    )
    async with running_worker(app):
        r = await client.get(f"{r.json()['links']['self']}?wait=20", headers=tokens["read"])
    job = r.json()
    assert job["status"] == "failed" and "kaput" in job["error"]
    assert job["links"]["retry"] is not None
    r = await client.get(job["links"]["attempts"], headers=tokens["read"])
    (attempt,) = r.json()["attempts"]
    assert attempt["outcome"] == "failed" and "RuntimeError: kaput" in attempt["traceback"]


async def test_queues_pause_and_resume_and_workers_are_listed(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    await client.post(
        "/jobs", json={"type": "add", "payload": {"a": 1, "b": 2}}, headers=tokens["write"]
    )
    r = await client.post("/queues/default/pause", headers=tokens["admin"])
    assert r.status_code == 200 and r.json() == {
        "name": "default",
        "paused": True,
        "counts": {"queued": 1},
    }
    r = await client.get("/queues", headers=tokens["read"])
    assert r.json()["queues"] == [{"name": "default", "paused": True, "counts": {"queued": 1}}]
    async with running_worker(app):
        await asyncio.sleep(0.3)
        assert (await client.get("/queues", headers=tokens["read"])).json()["queues"][0][
            "counts"
        ] == {"queued": 1}
        r = await client.get("/workers", headers=tokens["read"])
        assert [w["state"] for w in r.json()["workers"]] == ["running"]
        r = await client.post("/queues/default/resume", headers=tokens["admin"])
        assert r.json()["paused"] is False
        for _ in range(500):
            counts = (await client.get("/queues", headers=tokens["read"])).json()["queues"][0]
            if counts["counts"] == {"succeeded": 1}:
                break
            await asyncio.sleep(0.01)
        assert counts["counts"] == {"succeeded": 1}


# -- health and metrics -----------------------------------------------------------------------


async def test_health_reports_degraded_healthy_then_unhealthy(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    admin = tokens["admin"]
    assert (await client.get("/health/live")).json() == {"status": "alive"}
    r = await client.get("/health/ready", headers=admin)
    assert r.status_code == 200 and r.json()["status"] == "degraded"  # no worker yet
    assert r.json()["workers"] == 0
    async with running_worker(app):

        async def registered() -> bool:
            ready = (await client.get("/health/ready", headers=admin)).json()
            return bool(ready["live_workers"] == 1)

        await eventually(registered)
        r = await client.get("/health/ready", headers=admin)
        assert r.status_code == 200 and r.json()["status"] == "healthy", r.json()
        assert r.json()["live_workers"] == 1
    # The worker stopped: workers have run here, none is live.
    r = await client.get("/health/ready", headers=admin)
    assert r.status_code == 503 and r.json()["status"] == "unhealthy"
    assert r.json()["live_workers"] == 0 and r.json()["dead_workers"] == 0
    assert r.headers["Retry-After"]


async def test_health_ready_without_a_token_gives_the_verdict_only(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
    anonymous = await client.get("/health/ready")
    assert anonymous.status_code == 200 and anonymous.json() == {"status": "degraded"}
    bad = await client.get("/health/ready", headers={"Authorization": "Bearer cvt_nonsense"})
    assert bad.json() == {"status": "degraded"}
    tenant = (await client.get("/health/ready", headers=tokens["read"])).json()
    assert tenant["workers"] == 0 and "queued" not in tenant  # one tenant: no job counts
    admin = (await client.get("/health/ready", headers=tokens["admin"])).json()
    assert admin["queued"] == 1 and admin["workers"] == 0


async def test_metrics_count_jobs_and_requests(
    app: Conveyor, client: httpx.AsyncClient, tokens: dict[str, dict[str, str]]
) -> None:
    await client.post(
        "/jobs", json={"type": "add", "payload": {"a": 1, "b": 2}}, headers=tokens["write"]
    )
    assert (await client.get("/metrics")).status_code == 401
    # A tenant's token reads its own jobs' counts only; an admin's, the whole cluster's.
    r = await client.get("/metrics", headers=tokens["read"])
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'conveyor_jobs{queue="default",status="queued"} 1.0' in r.text
    assert "conveyor_http_requests_total" not in r.text
    r = await client.get("/metrics", headers=tokens["admin"])
    text = r.text
    assert 'conveyor_jobs{queue="default",status="queued"} 1.0' in text
    assert 'conveyor_http_requests_total{code="202",method="POST",route="/jobs"} 1.0' in text
    assert 'conveyor_health{status="degraded"} 1.0' in text


# -- applications -----------------------------------------------------------------------------


async def test_mounted_api_and_job_accepted_in_an_application(
    app: Conveyor, tokens: dict[str, dict[str, str]]
) -> None:
    main = FastAPI()
    main.mount("/conveyor", api_for_tests(app))

    @main.post("/sums")
    async def sums(a: int, b: int) -> Any:
        job = await app.submit("add", {"a": a, "b": b}, tenant="acme")
        return job.accepted(prefix="/conveyor/jobs")

    @main.post("/own")
    async def own(a: int, b: int) -> Any:
        job = await app.submit("add", {"a": a, "b": b}, tenant="acme")
        return job.accepted() if a else job.accepted(location=f"/own/{job.id}")

    transport = httpx.ASGITransport(app=main)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        # Without prefix=, no links into routes the application may not serve (issue #30
        # item 11: they pointed at /jobs/...); location= names one of its own.
        bare = await c.post("/own?a=1&b=2")
        assert bare.status_code == 202 and bare.json()["links"] is None
        assert "location" not in bare.headers and bare.json()["payload"] == {"a": 1, "b": 2}
        named = await c.post("/own?a=0&b=2")
        assert named.headers["Location"] == f"/own/acme/{named.json()['id']}"
        assert named.json()["links"] is None
        r = await c.post("/sums?a=20&b=22")
        assert r.status_code == 202
        location = r.headers["Location"]
        assert location.startswith("/conveyor/jobs/") and r.json()["links"]["self"] == location
        async with running_worker(app):
            r = await c.get(f"{location}?wait=20", headers=tokens["read"])
        assert r.status_code == 200 and r.json()["result"] == 42
        assert r.json()["links"]["attempts"] == f"{location}/attempts"
        r = await c.post(
            "/conveyor/jobs",
            json={"type": "add", "payload": {"a": 1, "b": 1}},
            headers=tokens["write"],
        )
        assert r.headers["Location"].startswith("/conveyor/jobs/")
        assert (await c.get("/conveyor/openapi.json")).status_code == 401
        document = await c.get("/conveyor/openapi.json", headers=tokens["read"])
        assert document.status_code == 200 and "/jobs" in document.json()["paths"]
