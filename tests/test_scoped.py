"""A tenant's view of the application: isolation, idempotency and conflict rules, without HTTP."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from conveyor import Conveyor, IdempotencyConflict, InvalidState, JobContext, JobNotFound, Status
from conveyor.app.handles import Submission
from conveyor.app.tenants import TenantView
from conveyor.core.auth import Principal, Role
from conveyor.core.filter import JobFilter
from conveyor.core.model import NewJob
from conveyor.errors import Forbidden, InvalidDependency
from conveyor.store.protocol import MinuteStats
from tests.helpers import running_worker, settled


def view(app: Conveyor, tenant: str, role: Role = Role.WRITE) -> TenantView:
    return TenantView(app, Principal(token_id=f"tok-{tenant}", tenant=tenant, role=role))


@pytest.fixture
def typed(app: Conveyor) -> Conveyor:
    @app.job()
    async def add(ctx: JobContext, a: int, b: int) -> int:
        return a + b

    return app


def add(a: int = 1, b: int = 2, **fields: Any) -> Submission:
    return Submission(type="add", payload={"a": a, "b": b}, **fields)


async def test_another_tenants_job_does_not_exist(typed: Conveyor) -> None:
    [(job, created)] = await view(typed, "acme").submit([add()])
    assert created and job.record.tenant == "acme"
    other = view(typed, "globex")
    for attempt in (
        other.get(job.id),
        other.attempts(job.id),
        other.children(job.id),
        other.cancel(job.id),
        other.retry(job.id),
    ):
        with pytest.raises(JobNotFound):
            await attempt
    # An admin names a tenant's job by its stored id, tenant/id.
    assert (await view(typed, "root", Role.ADMIN).get(f"acme/{job.id}")).id == f"acme/{job.id}"


async def test_a_principal_submits_for_its_own_tenant_and_an_admin_for_any(typed: Conveyor) -> None:
    with pytest.raises(Forbidden, match="submits for tenant 'acme' only"):
        await view(typed, "acme").submit([add(tenant="globex")])
    [(job, _)] = await view(typed, "root", Role.ADMIN).submit([add(tenant="globex")])
    assert job.record.tenant == "globex"


async def test_an_idempotency_key_names_one_job_per_tenant(typed: Conveyor) -> None:
    acme = view(typed, "acme")
    [(first, created)] = await acme.submit([add()], idempotency_key="k")
    [(again, created_again)] = await acme.submit([add()], idempotency_key="k")
    assert created and not created_again and again.id == first.id
    [(theirs, _)] = await view(typed, "globex").submit([add()], idempotency_key="k")
    assert theirs.id != first.id
    with pytest.raises(IdempotencyConflict, match="another request"):
        await acme.submit([add(a=5)], idempotency_key="k")
    listed = await acme.submit([add(), add(a=3)], idempotency_key="k", listed=True)
    assert len({h.id for h, _ in listed} | {first.id}) == 3


async def test_a_conflict_refuses_the_whole_list_before_anything_is_stored(
    typed: Conveyor,
) -> None:
    acme = view(typed, "acme")
    await acme.submit([add(id="taken")])
    with pytest.raises(IdempotencyConflict, match="another request"):
        await acme.submit([add(id="fresh"), add(a=9, id="taken")])
    with pytest.raises(JobNotFound):
        await acme.get("fresh")


async def test_a_job_may_wait_only_for_jobs_its_tenant_can_see(typed: Conveyor) -> None:
    [(theirs, _)] = await view(typed, "globex").submit([add()])
    acme = view(typed, "acme")
    with pytest.raises(InvalidDependency, match="do not exist"):
        await acme.submit([add(depends_on=(theirs.id,))])
    [(mine, _)] = await acme.submit([add()])
    [(after, _)] = await acme.submit([add(depends_on=(mine.id,))])
    assert after.record.depends_on == (mine.id,)


async def test_pages_hold_the_tenants_top_level_jobs_unless_asked(typed: Conveyor) -> None:
    [(parent, _)] = await view(typed, "acme").submit([add(id="parent")])
    child = NewJob(
        id="acme/child",
        type="add",
        payload={},
        tenant="acme",
        parent_id="acme/parent",
        root_id="acme/parent",
    )
    await (await typed.store()).submit([child])
    await view(typed, "globex").submit([add(id="elsewhere")])
    acme = view(typed, "acme")
    assert [h.id for h in (await acme.page(JobFilter.of())).jobs] == ["parent"]
    assert {h.id for h in (await acme.page(JobFilter.of(include_children=True))).jobs} == {
        "parent",
        "child",
    }
    assert [h.id for h in (await acme.children(parent.id)).jobs] == ["child"]
    with pytest.raises(Forbidden, match="sees only tenant 'acme'"):
        await acme.page(JobFilter.of(tenant="globex"))
    admin = view(typed, "root", Role.ADMIN)
    assert {h.id for h in (await admin.page(JobFilter.of())).jobs} == {
        "acme/parent",
        "globex/elsewhere",
    }
    assert [h.id for h in (await admin.page(JobFilter.of(tenant="globex"))).jobs] == [
        "globex/elsewhere"
    ]


async def test_only_unfinished_jobs_cancel_and_only_ended_ones_retry(typed: Conveyor) -> None:
    acme = view(typed, "acme")
    [(job, _)] = await acme.submit([add()])
    with pytest.raises(InvalidState, match="only failed or cancelled jobs"):
        await acme.retry(job.id)
    cancelled = await acme.cancel(job.id)
    assert cancelled.status is Status.CANCELLED and "tok-acme" in (cancelled.error or "")
    with pytest.raises(InvalidState, match="already cancelled"):
        await acme.cancel(job.id)
    again = await acme.retry(job.id)
    assert again.retry_of == job.id and again.tenant == "acme"


async def test_a_tenant_sees_the_throughput_of_its_own_jobs_only(typed: Conveyor) -> None:
    admin = view(typed, "root", Role.ADMIN)
    [(mine, _), (theirs, _), (again, _)] = await admin.submit(
        [add(tenant="acme"), add(tenant="globex"), add(a=4, tenant="globex")]
    )
    async with running_worker(typed):
        for handle in (mine, theirs, again):
            await settled(handle, Status.SUCCEEDED)
    since = (await (await typed.store()).now()) - timedelta(hours=1)

    def ended(stats: list[MinuteStats]) -> int:
        return sum(m.succeeded for m in stats)

    assert ended(await view(typed, "acme").minute_stats(since)) == 1
    assert ended(await view(typed, "globex").minute_stats(since)) == 2
    assert ended(await admin.minute_stats(since)) == 3
