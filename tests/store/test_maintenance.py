"""Maintenance and the store itself: rescue, prune, schedules, named leases, workers,
health, opening and migrating, on every backend."""

from __future__ import annotations

import asyncio
import importlib
from datetime import UTC, datetime

import pytest

from conveyor.core.cron import Cron, Schedule, tick_id
from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement
from conveyor.store import Lease, Retention, Store
from tests.helpers import FakeClock, key_by_creation, new, schema
from tests.store.common import claim
from tests.store.recording import create_store, unwrapped


async def test_rescue_records_a_lost_attempt_and_applies_the_retry_policy(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("a", max_attempts=2, backoff_base=5, backoff_cap=5)])
    (job,) = await claim(store)
    clock.advance(29)
    assert await store.rescue(limit=10, jitter=0.0) == []  # lease still valid
    clock.advance(2)
    (rescued,) = await store.rescue(limit=10, jitter=0.0)
    assert rescued.job_id == "a" and rescued.status is Status.QUEUED
    (attempt,) = await store.attempts("a")
    assert attempt.outcome is Outcome.LOST
    # The zombie's completion is refused after the rescue.
    late = Settlement("a", job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    assert await store.settle([late]) == ["a"]
    (_second,) = await claim(store)
    clock.advance(31)
    (rescued,) = await store.rescue(limit=10, jitter=0.0)
    assert rescued.status is Status.FAILED  # a job that kills its worker cannot loop forever
    final = await store.get("a")
    assert final is not None and final.attempt == 2 and final.status is Status.FAILED
    assert [a.outcome for a in await store.attempts("a")] == [Outcome.LOST, Outcome.LOST]


async def test_concurrent_rescuers_rescue_each_job_once(
    db_url: str, store: Store, clock: FakeClock
) -> None:
    await store.submit([new(f"j{i}") for i in range(50)])
    await claim(store, limit=50)
    clock.advance(31)
    others = [create_store(db_url, clock=clock) for _ in range(3)]
    for other in others:
        await other.open()
    try:
        results = await asyncio.gather(*(s.rescue(limit=100, jitter=0.0) for s in others))
    finally:
        for other in others:
            await other.close()
    rescued = [r.job_id for batch in results for r in batch]
    assert sorted(rescued) == sorted(f"j{i}" for i in range(50))
    for i in range(50):
        assert len(await store.attempts(f"j{i}")) == 1


async def test_prune_deletes_finished_jobs_past_their_retention_only(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("old"), new("recent"), new("queued", delay=10_000)])
    for job in await claim(store):
        await store.settle(
            [Settlement(job.id, job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)]
        )
        if job.id == "old":
            clock.advance(100)
    retention = Retention(succeeded=50)
    assert await store.prune(retention, limit=10) == 1
    assert await store.get("old") is None
    assert await store.get("recent") is not None and await store.get("queued") is not None
    assert await store.prune(retention, limit=10) == 0


async def test_schedules_sync_fire_once_per_tick_toggle_and_run_by_hand(
    store: Store, clock: FakeClock
) -> None:
    beat = Schedule("beat", Cron("* * * * * *"), "t", {"n": 1})
    await store.sync_schedules([beat])
    (info,) = await store.schedules()
    assert info.enabled and info.schedule == beat
    assert info.next_run_at.timestamp() == clock.now + 1

    clock.advance(1.75)  # the first tick is 0.75 s late: past half the one-second gap
    assert await store.fire_schedules(limit=10) == []  # by the schedule's own grace, missed
    clock.advance(1)  # the second tick is as late, but within the firer's grace
    fired = await store.fire_schedules(limit=10, min_grace=2.0)
    assert fired == [tick_id("beat", datetime.fromtimestamp(info.next_run_at.timestamp() + 1, UTC))]
    assert await store.fire_schedules(limit=10, min_grace=2.0) == []  # once per tick

    off = await store.set_schedule_enabled("beat", False)
    assert off is not None and not off.enabled
    clock.advance(5)
    assert await store.fire_schedules(limit=10, min_grace=2.0) == []
    manual = await store.run_schedule("beat")
    assert manual is not None and manual.type == "t" and manual.id.startswith("cron-manual:")
    assert await store.run_schedule("missing") is None
    on = await store.set_schedule_enabled("beat", True)
    assert on is not None and on.enabled and on.next_run_at.timestamp() > clock.now


async def test_a_named_lease_is_acquired_renewed_released_and_remembered(
    store: Store, clock: FakeClock
) -> None:
    held = await store.acquire_lease("export", owner="a", ttl=10)
    assert held.owner == "a"
    other = await store.acquire_lease("export", owner="b", ttl=10)
    assert other.owner == "a" and other.token == held.token  # held elsewhere: unchanged
    clock.advance(5)
    until = await store.renew_lease("export", token=held.token, ttl=10)
    assert until is not None and until.timestamp() == clock.now + 10
    assert await store.renew_lease("export", token=held.token + 1, ttl=10) is None
    assert await store.release_lease("export", token=held.token)
    assert not await store.release_lease("export", token=held.token)
    taken = await store.acquire_lease("export", owner="b", ttl=10)
    assert taken.owner == "b" and taken.token > held.token
    history = await store.lease_history("export")
    assert [(r.owner, r.ended) for r in history] == [("b", None), ("a", "released")]


async def test_workers_and_queues_are_listed(store: Store) -> None:
    from conveyor.store import WorkerInfo

    await store.register_worker(WorkerInfo("w1", "host", 123, ("default",), 4))
    await store.submit([new("a"), new("b", queue="media")])
    (worker,) = await store.workers()
    assert worker.id == "w1" and worker.stopped_at is None
    await store.deregister_worker("w1")
    assert (await store.workers())[0].stopped_at is not None
    queues = {q.name: q for q in await store.queues()}
    assert queues["default"].counts == {"queued": 1}
    assert queues["media"].counts == {"queued": 1}


async def test_health_counts_queued_due_running_stale_and_workers(
    store: Store, clock: FakeClock
) -> None:
    from conveyor.store import WorkerInfo

    await store.register_worker(WorkerInfo("w1", "host", 1, ("default",), 4))
    await store.submit([new("a"), new("b"), new("later", delay=60)])
    await claim(store, limit=1)
    health = await store.health()
    assert (health.queued, health.due, health.running, health.stale_running) == (2, 1, 1, 0)
    assert (health.workers, health.live_workers) == (1, 1)
    assert health.now.timestamp() == clock.now
    clock.advance(31)  # the claim's 30 s lease has expired, not yet rescued
    assert (await store.health()).stale_running == 1


async def test_migrate_is_idempotent(store: Store) -> None:
    assert await store.migrate() == []


async def test_open_and_close_are_idempotent_and_now_is_the_stores_clock(
    db_url: str, clock: FakeClock
) -> None:
    s = create_store(db_url, clock=clock)
    await s.open()
    await s.open()
    try:
        assert (await s.now()).timestamp() == clock.now
        clock.advance(90)
        assert (await s.now()).timestamp() == clock.now
    finally:
        await s.close()
    await s.close()


async def test_upgrading_one_release_at_a_time_gives_the_schema_of_a_fresh_install(
    db_url: str, second_db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = create_store(db_url, migrate=False)
    backend = importlib.import_module(type(unwrapped(fresh)).__module__)
    migrations = backend._MIGRATIONS
    try:
        assert len(await fresh.migrate()) == len(migrations)
    finally:
        await fresh.close()
    for known in range(1, len(migrations) + 1):
        # An older conveyor, which knew only the first migrations, then the next one.
        monkeypatch.setattr(backend, "_MIGRATIONS", migrations[:known])
        older = create_store(second_db_url, migrate=False)
        try:
            assert await older.migrate() == [migrations[known - 1][1]]
        finally:
            await older.close()
    assert await schema(second_db_url) == await schema(db_url)


async def test_the_tenant_namespace_migration_moves_live_jobs_with_their_references(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database of the release before tenant namespaces, holding jobs of every kind of
    link: after the upgrade each tenant's job is tenant/id, and every link follows it."""
    old = create_store(db_url, migrate=False)
    backend = importlib.import_module(type(unwrapped(old)).__module__)
    migrations = backend._MIGRATIONS
    at = next(i for i, m in enumerate(migrations) if m[1].endswith("_tenant_namespaces.sql"))
    monkeypatch.setattr(backend, "_MIGRATIONS", migrations[:at])
    try:
        await old.migrate()
        key_by_creation(db_url)  # the key today's store writes (SQLite)
        await old.open()
        # That release's claim did not look at tenants (their index is the migration's).
        old._tenant_mix.saw([])  # type: ignore[attr-defined]
        await old.submit([new("parent", tenant="acme"), new("flaky", tenant="acme")])
        await old.submit([new("plain"), new("keyed", tenant="acme", unique_key="k")])
        jobs = {j.id: j for j in await claim(old, limit=2)}
        await old.spawn(Lease("parent", jobs["parent"].lease_token), [new("child", tenant="acme")])
        await old.submit([new("after", tenant="acme", depends_on=("child",))])
        failed = Settlement("flaky", jobs["flaky"].lease_token, Status.FAILED, Outcome.FAILED)
        await old.settle([failed])
        await old.retry("flaky", new("again", tenant="acme", retry_of="flaky"))
    finally:
        await old.close()
    monkeypatch.setattr(backend, "_MIGRATIONS", migrations)
    upgraded = create_store(db_url)
    try:
        await upgraded.open()
        assert await upgraded.get("parent") is None
        parent = await upgraded.get("acme/parent")
        assert parent is not None and parent.status is Status.RUNNING
        assert parent.below is not None and parent.below.total == 1  # its counts moved too
        child = await upgraded.get("acme/child")
        assert child is not None and (child.parent_id, child.root_id) == ("acme/parent",) * 2
        after = await upgraded.get("acme/after")
        assert after is not None and after.depends_on == ("acme/child",)
        again = await upgraded.get("acme/again")
        assert again is not None and again.retry_of == "acme/flaky"
        assert len(await upgraded.attempts("acme/flaky")) == 1
        assert (await upgraded.get("plain")) is not None
        # The moved links work: the child runs, and its dependent is released.
        (claimed,) = [j for j in await claim(upgraded) if j.id == "acme/child"]
        done = Settlement(claimed.id, claimed.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        await upgraded.settle([done])
        after = await upgraded.get("acme/after")
        assert after is not None and after.status is Status.QUEUED
        # Unique keys are per tenant now.
        [theirs] = await upgraded.submit([new("globex/keyed", tenant="globex", unique_key="k")])
        [mine] = await upgraded.submit([new("acme/other", tenant="acme", unique_key="k")])
        assert theirs.created and not mine.created and mine.job.id == "acme/keyed"
    finally:
        await upgraded.close()
