"""Bulk jobs over the REST API (issue #12), on every backend: the job resource's counts,
who submitted, top-level listing, retry of a subtree's failures and re-open events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from conveyor import Conveyor, JobContext, Status, Submission
from tests.apiserver import api_for_tests
from tests.helpers import running_worker, settled


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = Conveyor(db_url)
    broken = {"first": True}

    @application.job(max_attempts=1)
    async def item(ctx: JobContext, n: int) -> int:
        if n == 0 and broken.pop("first", False):
            raise RuntimeError("item 0 fails once")
        return n

    @application.job()
    async def bulk(ctx: JobContext, n: int) -> None:
        await ctx.spawn_many([Submission("item", {"n": i}, id=f"{ctx.id}.{i}") for i in range(n)])

    yield application
    await application.close()


async def test_a_bulk_job_over_http_counts_lists_retries_and_reopens(app: Conveyor) -> None:
    token, secret = await app.create_token(tenant="acme", role="write", name="w")
    auth = {"Authorization": f"Bearer {secret}"}
    transport = httpx.ASGITransport(app=api_for_tests(app, wait_tick=0.02))
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=auth) as c:
        r = await c.post("/jobs", json={"type": "bulk", "payload": {"n": 4}})
        assert r.status_code == 202
        root: dict[str, Any] = r.json()
        assert (root["submitted_by"], root["below"]) == (f"token:{token.id}", None)
        async with running_worker(app):
            await settled(await app.get(f"acme/{root['id']}"), Status.FAILED)
            root = (await c.get(f"/jobs/{root['id']}")).json()
            assert root["below"] == {
                "pending": 0, "queued": 0, "running": 0, "waiting": 0, "succeeded": 3,
                "failed": 1, "cancelled": 0, "done": 4, "total": 4,
            }  # fmt: skip
            assert [j["id"] for j in (await c.get("/jobs")).json()["jobs"]] == [root["id"]]
            every = (await c.get("/jobs", params={"include_children": "true"})).json()["jobs"]
            children = (await c.get("/jobs", params={"parent": root["id"]})).json()["jobs"]
            assert (len(every), len(children)) == (5, 4)
            assert {j["submitted_by"] for j in every} == {f"token:{token.id}"}
            r = await c.post(root["links"]["retry_failed_children"])
            assert r.status_code == 200
            (retried,) = r.json()["retried"]
            assert (retried["retry_of"], retried["retry_count"]) == (f"{root['id']}.0", 1)
            assert retried["parent_id"] == root["id"]
            await settled(await app.get(f"acme/{root['id']}"), Status.SUCCEEDED)
        root = (await c.get(f"/jobs/{root['id']}")).json()
        assert (root["status"], root["below"]["succeeded"], root["below"]["total"]) == (
            "succeeded",
            4,
            4,
        )
        (event,) = (await c.get(root["links"]["events"])).json()["events"]
        assert event["event"] == "reopened" and retried["id"] in event["detail"]
        old = (await c.get(f"/jobs/{root['id']}.0")).json()
        assert (old["retried_by"], old["links"]["retry"]) == (retried["id"], None)
        again = await c.post(f"/jobs/{root['id']}.0/retry")
        assert again.status_code == 409 and retried["id"] in again.json()["detail"]
