"""Sub-jobs, dependencies, manual retry and tree cancellation, on every backend."""

from __future__ import annotations

import asyncio

import pytest

from conveyor import Conveyor, InvalidState, JobContext, Outcome, Status, Submission
from conveyor.errors import InvalidDependency
from tests.helpers import eventually, running_worker, settled


async def test_parent_waits_for_children_and_succeeds_once(app: Conveyor) -> None:
    failures: dict[int, int] = {}

    @app.job(max_attempts=3, backoff="10ms")
    async def part(ctx: JobContext, n: int) -> int:
        if n % 25 == 0 and failures.get(n, 0) == 0:
            failures[n] = 1
            raise RuntimeError(f"part {n} fails once")
        return n * n

    @app.job()
    async def whole(ctx: JobContext, parts: int) -> str:
        await ctx.spawn_many(
            [Submission("part", {"n": n}, id=f"{ctx.id}.{n}") for n in range(parts)]
        )
        return "spawned"

    job = await whole.submit(parts=200)
    async with running_worker(app, concurrency=20):
        await settled(job, Status.SUCCEEDED, timeout=60)
    assert job.result == "spawned"
    children = await app.children(job.id)
    assert len(children) == 200
    assert all(c.status is Status.SUCCEEDED for c in children)
    assert all(c.record.root_id == job.id and c.record.parent_id == job.id for c in children)
    retried = [c for c in children if c.record.attempt == 2]
    assert len(retried) == 8  # n = 0, 25, ..., 175 failed once, then succeeded
    tree = await app.tree(job.id)
    assert next(t.id for t in tree) == job.id and len(tree) == 201


async def test_parent_fails_when_a_child_exhausts_its_attempts(app: Conveyor) -> None:
    @app.job(max_attempts=2, backoff="10ms")
    async def doomed(ctx: JobContext) -> None:
        raise RuntimeError("never works")

    @app.job()
    async def fine(ctx: JobContext) -> int:
        return 1

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn("fine")
        await ctx.spawn("doomed")

    job = await parent.submit()
    async with running_worker(app):
        await settled(job, Status.FAILED)
    assert job.error == "1 failed and 0 cancelled of 2 jobs below it"
    # The handler itself succeeded: its one attempt is recorded as such.
    assert [a.outcome for a in await job.attempts()] == [Outcome.SUCCEEDED]


async def test_grandchildren_finish_the_whole_tree(app: Conveyor) -> None:
    @app.job()
    async def leaf(ctx: JobContext) -> str:
        await asyncio.sleep(0.05)
        return "leaf"

    @app.job()
    async def branch(ctx: JobContext) -> None:
        for i in range(3):
            await ctx.spawn("leaf", id=f"{ctx.id}.{i}")

    @app.job()
    async def root(ctx: JobContext) -> None:
        for i in range(2):
            await ctx.spawn("branch", id=f"{ctx.id}.{i}")

    job = await root.submit()
    async with running_worker(app, concurrency=8):
        await settled(job, Status.SUCCEEDED)
    tree = await app.tree(job.id)
    assert len(tree) == 1 + 2 + 6
    assert {t.record.root_id for t in tree[1:]} == {job.id}
    assert all(t.status is Status.SUCCEEDED for t in tree)


async def test_diamond_of_dependencies_runs_in_order(app: Conveyor) -> None:
    order: list[str] = []

    @app.job()
    async def step(ctx: JobContext, name: str) -> str:
        order.append(name)
        await asyncio.sleep(0.02)
        return name.upper()

    @app.job()
    async def join(ctx: JobContext) -> list[str]:
        results = await ctx.dependency_results()
        order.append("join")
        return sorted(results.values())

    a = await app.submit("step", {"name": "a"})
    b = await app.submit("step", {"name": "b"}, depends_on=[a.id])
    c = await app.submit("step", {"name": "c"}, depends_on=[a.id])
    d = await app.submit("join", {}, depends_on=[b.id, c.id])
    assert (b.status, d.status) == (Status.PENDING, Status.PENDING)
    async with running_worker(app):
        await settled(d, Status.SUCCEEDED)
    assert order[0] == "a" and order[-1] == "join" and set(order[1:3]) == {"b", "c"}
    assert d.result == ["B", "C"]


async def test_failed_dependency_cancels_its_dependents(app: Conveyor) -> None:
    @app.job(max_attempts=1)
    async def breaks(ctx: JobContext) -> None:
        raise RuntimeError("upstream broke")

    @app.job()
    async def after(ctx: JobContext) -> None:
        return None

    a = await breaks.submit()
    b = await app.submit("after", {}, depends_on=[a.id])
    c = await app.submit("after", {}, depends_on=[b.id])
    async with running_worker(app):
        await settled(c, Status.CANCELLED)
    await b.refresh()
    assert b.status is Status.CANCELLED and b.error == f"dependency {a.id} failed"
    assert c.error == f"dependency {b.id} cancelled"
    late = await app.submit("after", {}, depends_on=[a.id])
    assert late.status is Status.CANCELLED  # the dependency had already failed


async def test_dependency_errors_are_clear_and_store_nothing(app: Conveyor) -> None:
    @app.job()
    async def step(ctx: JobContext) -> None:
        return None

    with pytest.raises(InvalidDependency, match="do not exist: nope"):
        await app.submit("step", {}, depends_on=["nope"])
    with pytest.raises(InvalidDependency, match="cycle: x -> y -> x"):
        await app.submit_many(
            [
                Submission("step", {}, id="x", depends_on=("y",)),
                Submission("step", {}, id="y", depends_on=("x",)),
            ]
        )
    with pytest.raises(InvalidDependency, match="cycle: z -> z"):
        await app.submit("step", {}, id="z", depends_on=["z"])
    assert await app.list_jobs() == []


async def test_cancel_a_waiting_parent_cancels_its_unfinished_children(app: Conveyor) -> None:
    started = asyncio.Event()

    @app.job()
    async def slow(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(60)

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn("slow")
        await ctx.spawn("slow", queue="paused")

    await app.pause("paused")
    job = await parent.submit()
    async with running_worker(app, lease=0.6):
        await asyncio.wait_for(started.wait(), 10)

        async def parent_waiting() -> bool:
            return (await job.refresh()).status is Status.WAITING

        await eventually(parent_waiting)
        await app.cancel(job.id)
        for child in await app.children(job.id):
            await settled(child, Status.CANCELLED)
    await job.refresh()
    assert job.status is Status.CANCELLED


async def test_manual_retry_keeps_history_and_checkpoint(app: Conveyor) -> None:
    @app.job(max_attempts=1)
    async def fragile(ctx: JobContext) -> int:
        if ctx.state is None:
            await ctx.checkpoint({"step": 3})
            raise RuntimeError("first run breaks")
        ctx.result_ref = f"reports/{ctx.state['step']}"
        return int(ctx.state["step"])

    job = await fragile.submit()
    async with running_worker(app):
        await settled(job, Status.FAILED)
        again = await app.retry(job.id)
        await settled(again, Status.SUCCEEDED)
    assert again.record.retry_of == job.id and again.id != job.id
    assert again.result == 3 and again.record.result_ref == "reports/3"
    old = await app.get(job.id)
    assert old.status is Status.FAILED and old.record.error == "RuntimeError: first run breaks"
    with pytest.raises(InvalidState, match="only failed or cancelled"):
        await app.retry(again.id)
