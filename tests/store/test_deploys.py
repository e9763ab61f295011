"""Rolling deploys and the worker registry, on every backend: a claim takes only the
types it names, the types no live worker serves are counted, and workers silent past
their forget window leave health and the registry."""

from __future__ import annotations

from conveyor.core.lifecycle import Status
from conveyor.store import Store
from tests.helpers import FakeClock, new
from tests.store.recording import create_store


async def test_a_claim_takes_only_the_types_it_names_and_leaves_the_rest_unspent(
    store: Store, db_url: str, clock: FakeClock
) -> None:
    # During a rolling deploy an old worker lacks the new type: its claim leaves it
    # queued, attempt 0, for a worker that names it, whichever claim path runs.
    from conveyor.core.flow import TenantLimit
    from conveyor.store import Limits

    async def take(on: Store, types: list[str] | None, limits: Limits | None = None) -> set[str]:
        jobs = await on.claim(
            worker_id="w", queues=["default"], limit=10, lease=30, types=types, limits=limits
        )
        return {job.id for job in jobs}

    await store.submit([new("old1", type="old"), new("new1", type="new", priority=-1)])
    await store.submit([new("old2", type="old"), new("new2", type="new", priority=-1)])
    assert await take(store, []) == set()
    assert await take(store, ["old"], Limits(cluster={"old": 1})) == {"old1"}  # limited
    assert await take(store, ["old"]) == {"old2"}  # plain
    # Jobs of two tenants queued: a store that looks now claims tenant by tenant in turn.
    await store.submit([new("a/old", type="old", tenant="a"), new("a/new", type="new", tenant="a")])
    await store.submit([new("b/old", type="old", tenant="b"), new("b/new", type="new", tenant="b")])
    fair = create_store(db_url, clock=clock)
    await fair.open()
    try:
        limits = Limits(tenants={"*": TenantLimit(concurrency=5)})
        assert await take(fair, ["old"], limits) == {"a/old", "b/old"}
    finally:
        await fair.close()
    for job_id in ("new1", "new2", "a/new", "b/new"):
        job = await store.get(job_id)
        assert job is not None and (job.status, job.attempt) == (Status.QUEUED, 0)
    assert await take(store, ["new", "other"]) == {"new1", "new2", "a/new", "b/new"}
    await store.submit([new("any1", type="x"), new("any2", type="y", queue="media")])
    assert await take(store, None) == {"any1"}  # no types named: any type of the queues


async def test_queued_types_no_live_worker_serves_are_counted(
    store: Store, clock: FakeClock
) -> None:
    from conveyor.store import UnservedType, WorkerInfo

    await store.submit([new("a1", type="a"), new("b1", type="b"), new("b2", type="b")])
    await store.submit([new("m1", type="a", queue="media")])
    assert await store.unserved_types() == [UnservedType("a", 2), UnservedType("b", 2)]
    old = WorkerInfo("old", "host", 1, ("default",), 4, lease=10, types=("a",))
    await store.register_worker(old)
    # The old worker serves type a on its queue only; nothing serves b.
    assert await store.unserved_types() == [UnservedType("a", 1), UnservedType("b", 2)]
    anything = WorkerInfo("older", "host", 2, ("media",), 4, lease=10, types=None)
    await store.register_worker(anything)  # registered before types were recorded
    assert await store.unserved_types() == [UnservedType("b", 2)]
    assert (await store.workers())[0].types in {("a",), None}
    clock.advance(11)  # both silent past their lease: dead serve nothing
    assert await store.unserved_types() == [UnservedType("a", 2), UnservedType("b", 2)]


async def test_a_worker_silent_past_its_forget_window_leaves_health_and_the_registry(
    store: Store, clock: FakeClock
) -> None:
    from conveyor.store import WorkerInfo

    await store.register_worker(
        WorkerInfo("dead", "h", 1, ("default",), 4, lease=5, forget_after=60)
    )
    await store.register_worker(
        WorkerInfo("gone", "h", 2, ("default",), 4, lease=5, forget_after=60)
    )
    await store.deregister_worker("gone")
    clock.advance(30)
    await store.register_worker(WorkerInfo("live", "h", 3, ("default",), 4, lease=5))
    health = await store.health()
    assert (health.live_workers, health.dead_workers) == (1, 1)
    assert await store.forget_workers(limit=10) == []
    clock.advance(31)  # past the window: no longer a death that counts, then forgotten
    await store.heartbeat(worker_id="live", leases=[], lease=5, progress={})
    health = await store.health()
    assert (health.live_workers, health.dead_workers) == (1, 0)
    assert sorted(await store.forget_workers(limit=1) + await store.forget_workers(limit=5)) == [
        "dead",
        "gone",
    ]
    assert [w.id for w in await store.workers()] == ["live"]
    assert (w := (await store.workers())[0]).forget_after == 3600 and w.types is None
