"""Tenant namespaces over HTTP: no tenant can probe, squat or collide with another's job
ids, Idempotency-Keys or unique keys; a spawned child is never another tenant's job; a
refused list stores nothing. Every test runs on both backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from conveyor import Conveyor, JobContext, Status
from conveyor.app.handles import Submission
from conveyor.app.tenants import keyed_id
from conveyor.core.model import Job, Outcome, Settlement
from conveyor.errors import TooManyQueued
from conveyor.store import Limits, WorkerInfo
from conveyor.web import create_api
from tests.helpers import running_worker


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = Conveyor(db_url)

    @application.job()
    async def add(ctx: JobContext, a: int, b: int) -> int:
        return a + b

    @application.job()
    async def split(ctx: JobContext, parts: int) -> None:
        for n in range(parts):
            await ctx.spawn("add", {"a": n, "b": 0}, id=f"{ctx.id}.part-{n}")

    yield application
    await application.close()


@pytest.fixture
async def http(app: Conveyor) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_api(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


@pytest.fixture
async def token(app: Conveyor) -> dict[str, dict[str, str]]:
    out = {}
    for tenant, role in [("acme", "write"), ("globex", "write"), ("ops", "admin")]:
        _, secret = await app.create_token(tenant=tenant, role=role)
        out[tenant] = {"Authorization": f"Bearer {secret}"}
    return out


def job(a: int = 1, **fields: Any) -> dict[str, Any]:
    return {"type": "add", "payload": {"a": a, "b": 2}, **fields}


async def stored_ids(app: Conveyor) -> set[str]:
    return {h.id for h in (await app.page_jobs(limit=1000, top_level=False)).jobs}


def answer(r: httpx.Response) -> tuple[int, Any]:
    """What a caller learns from a submit: the status and the body without times."""
    body = r.json()
    for key in ("run_at", "created_at"):
        body.pop(key, None)
    return r.status_code, body


# -- ids ----------------------------------------------------------------------------------------


async def test_a_taken_id_answers_as_a_free_one(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    """Probing: globex learns nothing from acme's ids, and cannot make acme's submit fail."""
    r = await http.post("/jobs", json=job(id="invoice-7"), headers=token["acme"])
    assert r.status_code == 202
    taken = await http.post("/jobs", json=job(id="invoice-7"), headers=token["globex"])
    free = await http.post("/jobs", json=job(id="invoice-8"), headers=token["globex"])
    assert taken.status_code == free.status_code == 202
    assert taken.json()["id"] == "invoice-7" and taken.json()["tenant"] == "globex"
    # Reading it: globex's own job, not acme's; a name globex never used is 404 either way.
    assert (await http.get("/jobs/invoice-7", headers=token["globex"])).json()["tenant"] == "globex"
    for missing in ("nothing-here", "acme/invoice-7"):
        r = await http.get(f"/jobs/{missing}", headers=token["globex"])
        assert r.status_code == 404
    # acme's own submit still returns acme's job (idempotent), unchanged.
    again = await http.post("/jobs", json=job(id="invoice-7"), headers=token["acme"])
    assert again.status_code == 200 and again.json()["tenant"] == "acme"
    assert await stored_ids(app) == {"acme/invoice-7", "globex/invoice-7", "globex/invoice-8"}


async def test_an_id_naming_another_tenant_is_refused_before_anything_is_stored(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    r = await http.post("/jobs", json=[job(id="ok"), job(id="acme/x")], headers=token["globex"])
    assert r.status_code == 422 and "no '/'" in r.json()["detail"]
    assert await stored_ids(app) == set()


async def test_an_idempotency_key_cannot_be_squatted(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    """globex knows how acme's key becomes an id, and submits that id first: acme's own
    idempotent submit still creates acme's job, and repeats return it."""
    squatted = keyed_id("acme", "order-42", None)
    r = await http.post("/jobs", json=job(a=9, id=squatted), headers=token["globex"])
    assert r.status_code == 202
    key = {"Idempotency-Key": "order-42"}
    first = await http.post("/jobs", json=job(), headers={**token["acme"], **key})
    assert first.status_code == 202 and first.json()["tenant"] == "acme"
    assert first.json()["payload"] == {"a": 1, "b": 2}
    again = await http.post("/jobs", json=job(), headers={**token["acme"], **key})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


async def test_a_unique_key_is_held_per_tenant(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    """globex holding "nightly" neither blocks acme's "nightly" nor is returned for it."""
    theirs = await http.post("/jobs", json=job(unique_key="nightly"), headers=token["globex"])
    assert theirs.status_code == 202
    mine = await http.post("/jobs", json=job(a=5, unique_key="nightly"), headers=token["acme"])
    assert mine.status_code == 202 and mine.json()["tenant"] == "acme"
    assert mine.json()["payload"] == {"a": 5, "b": 2}
    # Within acme the key still holds: the active holder is returned.
    again = await http.post("/jobs", json=job(a=6, unique_key="nightly"), headers=token["acme"])
    assert again.status_code == 200 and again.json()["id"] == mine.json()["id"]
    # Python without a tenant is a namespace of its own too.
    untenanted = await app.submit("add", {"a": 7, "b": 0}, unique_key="nightly")
    assert untenanted.record.tenant is None and len(await stored_ids(app)) == 3


async def test_dependencies_and_filters_resolve_inside_the_tenant(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    await http.post("/jobs", json=job(id="step-1"), headers=token["globex"])
    r = await http.post("/jobs", json=job(depends_on=["step-1"]), headers=token["acme"])
    assert r.status_code == 422 and "step-1" in r.json()["detail"]
    await http.post("/jobs", json=job(id="step-1"), headers=token["acme"])
    r = await http.post("/jobs", json=job(depends_on=["step-1"]), headers=token["acme"])
    assert r.status_code == 202 and r.json()["depends_on"] == ["step-1"]
    waiting = await app.get(f"acme/{r.json()['id']}")
    assert waiting.record.depends_on == ("acme/step-1",)


async def test_a_spawned_child_under_a_colliding_id_is_never_another_tenants_job(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    """globex submits the ids acme's handler will spawn (f"{ctx.id}.part-N") first."""
    for n in range(2):
        r = await http.post("/jobs", json=job(a=100, id=f"batch.part-{n}"), headers=token["globex"])
        assert r.status_code == 202
    r = await http.post(
        "/jobs",
        json={"type": "split", "payload": {"parts": 2}, "id": "batch"},
        headers=token["acme"],
    )
    assert r.status_code == 202
    async with running_worker(app):
        parent = await app.get("acme/batch")
        await parent.wait(timeout=30, poll=0.02)
    assert parent.status is Status.SUCCEEDED, parent.error
    r = await http.get("/jobs/batch/children", headers=token["acme"])
    children = r.json()["jobs"]
    assert sorted(c["id"] for c in children) == ["batch.part-0", "batch.part-1"]
    assert all(c["tenant"] == "acme" and c["parent_id"] == "batch" for c in children)
    assert sorted(c["result"] for c in children) == [0, 1]
    for n in range(2):
        theirs = (await app.get(f"globex/batch.part-{n}")).record
        assert theirs.parent_id is None and theirs.payload == {"a": 100, "b": 2}


# -- lists: all or nothing ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "refused",
    [
        pytest.param(job(a=9, id="kept"), id="an id reused with another payload"),
        pytest.param(job(depends_on=["never-submitted"]), id="a missing dependency"),
        pytest.param({"type": "add", "payload": {"a": "x", "b": 1}}, id="a bad payload"),
        pytest.param({"type": "no-such-type", "payload": {}}, id="an unknown type"),
        pytest.param(job(id="globex/x"), id="an id of another tenant"),
    ],
)
async def test_a_refused_list_stores_nothing(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]], refused: Any
) -> None:
    assert (await http.post("/jobs", json=job(id="kept"), headers=token["acme"])).status_code == 202
    before = await stored_ids(app)
    body = [job(id="first"), job(a=2, unique_key="k"), refused, job(id="last")]
    r = await http.post("/jobs", json=body, headers=token["acme"])
    assert 400 <= r.status_code < 500, r.text
    assert await stored_ids(app) == before


async def test_a_list_naming_another_tenants_unique_key_is_stored_whole(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    """Today's finding: the 409 came after the first items were stored."""
    await http.post("/jobs", json=job(unique_key="nightly"), headers=token["globex"])
    body = [job(id="first"), job(a=2, unique_key="nightly"), job(id="last")]
    r = await http.post("/jobs", json=body, headers=token["acme"])
    assert r.status_code == 202, r.text
    mine = {i for i in await stored_ids(app) if i.startswith("acme/")}
    assert len(mine) == 3


async def test_an_admin_reaches_a_tenants_job_by_its_stored_id(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    await http.post("/jobs", json=job(id="report"), headers=token["acme"])
    await http.post("/jobs", json=job(id="report"), headers=token["globex"])
    for tenant in ("acme", "globex"):
        r = await http.get(f"/jobs/{tenant}/report", headers=token["ops"])
        assert r.status_code == 200 and r.json()["tenant"] == tenant
        assert r.json()["links"]["self"] == f"/jobs/{tenant}%2Freport"
        r = await http.post(f"/jobs/{tenant}/report/cancel", headers=token["ops"])
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = await http.get("/jobs/acme/report/attempts", headers=token["ops"])
    assert r.status_code == 200 and r.json()["attempts"] == []
    for tenant in ("acme", "globex"):
        assert (await app.get(f"{tenant}/report")).status is Status.CANCELLED


# -- what a tenant's token sees of the cluster ----------------------------------------------------


async def test_queues_workers_and_metrics_show_a_tenant_only_its_own_jobs(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    for _ in range(3):
        await http.post("/jobs", json=job(queue="shared"), headers=token["globex"])
    await http.post("/jobs", json=job(queue="globex-only"), headers=token["globex"])
    await http.post("/jobs", json=job(queue="shared"), headers=token["acme"])
    await app.submit("add", {"a": 1, "b": 1}, queue="shared")  # no tenant: the operator's
    await app.pause("quiet")
    await (await app.store()).register_worker(
        WorkerInfo(id="w1", hostname="box-7", pid=4242, queues=("shared",), concurrency=4)
    )

    r = await http.get("/queues", headers=token["acme"])
    assert {q["name"]: q["counts"] for q in r.json()["queues"]} == {
        "shared": {"queued": 1},
        "quiet": {},
    }
    r = await http.get("/queues", headers=token["ops"])
    counts = {q["name"]: q["counts"] for q in r.json()["queues"]}
    assert counts["shared"] == {"queued": 5} and counts["globex-only"] == {"queued": 1}

    text = (await http.get("/metrics", headers=token["acme"])).text
    assert 'conveyor_jobs{queue="shared",status="queued"} 1.0' in text
    assert "globex-only" not in text and "conveyor_http_requests_total" not in text
    assert "conveyor_workers" not in text
    text = (await http.get("/metrics", headers=token["ops"])).text
    assert 'conveyor_jobs{queue="shared",status="queued"} 5.0' in text

    (mine,) = (await http.get("/workers", headers=token["acme"])).json()["workers"]
    assert mine["id"].startswith("worker-") and mine["hostname"] is None and mine["pid"] is None
    (theirs,) = (await http.get("/workers", headers=token["ops"])).json()["workers"]
    assert (theirs["id"], theirs["hostname"], theirs["pid"]) == ("w1", "box-7", 4242)


# -- fair claiming and per-tenant limits ---------------------------------------------------------


async def claim(app: Conveyor, limit: int, *, limits: Limits | None = None) -> list[Job]:
    store = await app.store()
    return await store.claim(
        worker_id="w", queues=["default"], limit=limit, lease=60, limits=limits
    )


async def test_a_flooding_tenant_does_not_starve_another(app: Conveyor) -> None:
    """10,000 jobs of one tenant at priority -1,000,000 and five of another at 0: every claim
    takes from both while both have jobs due; within a tenant, priority still orders."""
    flood = [
        Submission(type="add", payload={"a": i, "b": 0}, tenant="flood", priority=-1_000_000)
        for i in range(10_000)
    ]
    await app.submit_many(flood)
    await app.submit_many(
        [Submission(type="add", payload={"a": i, "b": 1}, tenant="small") for i in range(5)]
        + [Submission(type="add", payload={"a": 0, "b": 9}, tenant="small", priority=-1)]
    )
    claims = [await claim(app, 4) for _ in range(4)]
    tenants = [[j.tenant or "" for j in jobs] for jobs in claims]
    assert all(sorted(t) == ["flood", "flood", "small", "small"] for t in tenants[:3]), tenants
    small = [j for jobs in claims for j in jobs if j.tenant == "small"]
    assert len(small) == 6
    assert {"a": 0, "b": 9} in [j.payload for j in claims[0]]  # its priority first
    assert all(len(jobs) == 4 for jobs in claims)


async def test_both_tenants_make_progress_under_a_worker(app: Conveyor) -> None:
    await app.submit_many(
        [
            Submission(type="add", payload={"a": i, "b": 0}, tenant="flood", priority=-1_000_000)
            for i in range(400)
        ]
    )
    small = await app.submit_many(
        [Submission(type="add", payload={"a": i, "b": 1}, tenant="small") for i in range(5)]
    )
    async with running_worker(app, concurrency=2):
        for handle in small:
            await handle.wait(timeout=60, poll=0.02)
    assert all(h.status is Status.SUCCEEDED for h in small)
    left = await (await app.store()).count_queued("flood")
    assert left > 300, f"small's 5 jobs waited for {400 - left} of flood's"


async def test_a_tenants_concurrency_limit_holds_across_claims(app: Conveyor) -> None:
    app.tenants.limit("acme", concurrency=2)
    app.tenants.limit("*", concurrency=3)
    await app.submit_many(
        [
            Submission(type="add", payload={"a": i, "b": 0}, tenant=t)
            for t in ("acme", "globex")
            for i in range(5)
        ]
    )
    limits = Limits(tenants=app.tenants.limits)
    first = await claim(app, 10, limits=limits)
    assert sorted(j.tenant or "" for j in first) == ["acme"] * 2 + ["globex"] * 3
    assert await claim(app, 10, limits=limits) == []
    done = next(j for j in first if j.tenant == "acme")
    settlement = Settlement(done.id, done.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    await (await app.store()).settle([settlement])
    assert [j.tenant for j in await claim(app, 10, limits=limits)] == ["acme"]


async def test_a_tenants_rate_limit_holds_across_claims(app: Conveyor) -> None:
    app.tenants.limit("acme", rate="3/h")
    await app.submit_many(
        [Submission(type="add", payload={"a": i, "b": 0}, tenant="acme") for i in range(5)]
        + [Submission(type="add", payload={"a": 1, "b": 0})]
    )
    limits = Limits(tenants=app.tenants.limits)
    first = await claim(app, 2, limits=limits)
    rest = await claim(app, 10, limits=limits)
    assert sorted(str(j.tenant) for j in first + rest) == ["None"] + ["acme"] * 3
    assert await claim(app, 10, limits=limits) == []


async def test_a_worker_keeps_a_tenants_concurrency_limit(app: Conveyor) -> None:
    running: list[int] = [0, 0]

    @app.job()
    async def nap(ctx: JobContext) -> None:
        running[0] += 1
        running[1] = max(running[1], running[0])
        await asyncio.sleep(0.05)
        running[0] -= 1

    app.tenants.limit("acme", concurrency=1)
    jobs = await app.submit_many(
        [Submission(type="nap", payload={}, tenant="acme") for _ in range(6)]
    )
    async with running_worker(app, concurrency=4):
        for handle in jobs:
            await handle.wait(timeout=60, poll=0.02)
    assert running[1] == 1


async def test_max_queued_refuses_a_submit_beyond_it_and_stores_nothing(
    app: Conveyor, http: httpx.AsyncClient, token: dict[str, dict[str, str]]
) -> None:
    app.tenants.parse(["acme:max_queued=3"])
    r = await http.post("/jobs", json=[job(), job(a=2)], headers=token["acme"])
    assert r.status_code == 202
    r = await http.post("/jobs", json=[job(a=3), job(a=4)], headers=token["acme"])
    assert r.status_code == 429 and "at most 3" in r.json()["detail"]
    assert await (await app.store()).count_queued("acme") == 2
    assert (await http.post("/jobs", json=job(a=5), headers=token["globex"])).status_code == 202
    with pytest.raises(TooManyQueued):
        await app.submit_many([Submission(type="add", payload={"a": 1, "b": 1}, tenant="acme")] * 2)
