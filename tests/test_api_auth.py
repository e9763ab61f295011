"""Every route of the API against every kind of caller, generated from the route table:
the expected status, and no side effect where the request is refused."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from conveyor import Conveyor
from conveyor.core.auth import Role
from conveyor.web._api import router
from conveyor.web._auth import ROLE_KEY
from tests.apiserver import api_for_tests
from tests.apps.api import build

CALLERS = ["none", "bad", "revoked", "other_tenant", "read", "write", "admin"]
# The role each kind of caller holds; other_tenant writes, for another tenant.
HOLDS = {"other_tenant": Role.WRITE, "read": Role.READ, "write": Role.WRITE, "admin": Role.ADMIN}
SUCCESS = {
    ("POST", "/jobs"): 202,
    ("POST", "/jobs/{job_id}/retry"): 202,
    ("POST", "/schedules/{name}/run"): 202,
}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    role: Role | None


def route_table() -> list[Endpoint]:
    out = []
    for route in router.routes:
        if not isinstance(route, APIRoute):
            continue
        extra = route.openapi_extra or {}
        assert ROLE_KEY in extra, f"{route.path} declares no role: add openapi_extra=role(...)"
        needed = extra[ROLE_KEY]
        for method in sorted(route.methods or ()):
            path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # {job_id:job}: {job_id}
            out.append(Endpoint(method, path, Role(needed) if needed else None))
    return out


def expected(endpoint: Endpoint, caller: str) -> int:
    if endpoint.role is None:
        return 200
    if caller in ("none", "bad", "revoked"):
        return 401
    if not HOLDS[caller].allows(endpoint.role):
        return 403
    if caller == "other_tenant" and "{job_id}" in endpoint.path:
        return 404
    return SUCCESS.get((endpoint.method, endpoint.path), 200)


def test_the_route_table_covers_every_spec_route() -> None:
    routes = {(e.method, e.path) for e in route_table()}
    assert routes >= {
        ("POST", "/jobs"),
        ("GET", "/jobs"),
        ("GET", "/jobs/{job_id}"),
        ("GET", "/jobs/{job_id}/attempts"),
        ("GET", "/jobs/{job_id}/children"),
        ("POST", "/jobs/{job_id}/cancel"),
        ("POST", "/jobs/{job_id}/retry"),
        ("GET", "/workers"),
        ("GET", "/queues"),
        ("POST", "/queues/{name}/pause"),
        ("POST", "/queues/{name}/resume"),
        ("GET", "/schedules"),
        ("POST", "/schedules/{name}/run"),
        ("POST", "/schedules/{name}/enable"),
        ("POST", "/schedules/{name}/disable"),
        ("GET", "/health/live"),
        ("GET", "/health/ready"),
        ("GET", "/metrics"),
    }


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    # A schedule for the /schedules/{name} routes, named like the queue of /queues/{name}.
    application.schedule("default", "0 3 * * *", "add", {"a": 1, "b": 2})
    await application.sync_schedules()
    yield application
    await application.close()


async def snapshot(app: Conveyor) -> Any:
    """Everything a refused request must leave as it was."""
    page = await app.page_jobs(top_level=False, limit=1000)
    jobs = sorted((h.id, h.status.value, h.record.cancel_requested) for h in page.jobs)
    queues = sorted((q.name, q.paused) for q in await app.queues())
    schedules = sorted((i.schedule.name, i.enabled) for i in await app.list_schedules())
    return jobs, queues, schedules


async def test_every_route_for_every_caller(app: Conveyor) -> None:
    secrets = {}
    for caller, tenant, role in [
        ("revoked", "acme", "admin"),
        ("other_tenant", "globex", "write"),
        ("read", "acme", "read"),
        ("write", "acme", "write"),
        ("admin", "ops", "admin"),
    ]:
        token, secret = await app.create_token(tenant=tenant, role=role)
        secrets[caller] = secret
        if caller == "revoked":
            await app.revoke_token(token.id)
    secrets["bad"] = "cvt_000000000000_" + "x" * 43
    api = api_for_tests(app)
    transport = httpx.ASGITransport(app=api)
    mismatches = []
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        for endpoint in route_table():
            for caller in CALLERS:
                # Fresh targets for each case: a queued job of acme to read or cancel, a
                # cancelled one to retry.
                queued = await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
                cancelled = await app.submit("add", {"a": 3, "b": 4}, tenant="acme")
                await app.cancel(cancelled.id)
                target = cancelled.id if endpoint.path.endswith("/retry") else queued.id
                path = endpoint.path.replace("{job_id}", target).replace("{name}", "default")
                body = {"type": "add", "payload": {"a": 5, "b": 6}}
                headers = {}
                if caller != "none":
                    headers["Authorization"] = f"Bearer {secrets[caller]}"
                want = expected(endpoint, caller)
                before = await snapshot(app)
                r = await client.request(
                    endpoint.method,
                    path,
                    headers=headers,
                    json=body if (endpoint.method, endpoint.path) == ("POST", "/jobs") else None,
                )
                after = await snapshot(app)
                case = f"{endpoint.method} {endpoint.path} as {caller}"
                if r.status_code != want:
                    mismatches.append(f"{case}: {r.status_code} (wanted {want}) {r.text[:120]}")
                if want >= 400:
                    if before != after:
                        mismatches.append(f"{case}: refused, yet the tables changed")
                    if r.headers.get("content-type") != "application/problem+json":
                        mismatches.append(f"{case}: refusal is not application/problem+json")
                    if want == 401 and "WWW-Authenticate" not in r.headers:
                        mismatches.append(f"{case}: 401 without WWW-Authenticate")
                if endpoint.path.startswith("/queues/") and r.status_code == 200:
                    await app.resume("default")
                if endpoint.path.startswith("/schedules/") and r.status_code < 300:
                    await app.enable_schedule("default")
    assert not mismatches, "\n".join(mismatches)
