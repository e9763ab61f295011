"""The API's and the dashboard's reads, and tokens, on every backend."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor.core.auth import Role, Token, hash_secret
from conveyor.core.filter import JobFilter
from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement
from conveyor.store import JobPageQuery, Lease, Store
from conveyor.store.protocol import AuditEntry
from tests.helpers import FakeClock, new
from tests.store.common import claim


async def test_page_jobs_filters_and_pages_by_creation_without_skipping_or_repeating(
    store: Store, clock: FakeClock
) -> None:
    for i in range(7):  # one a second, and two at the same instant (ties broken by id)
        await store.submit([new(f"j{i}", type="even" if i % 2 == 0 else "odd")])
        if i != 3:
            clock.advance(1)
    await store.submit([new("media", queue="media")])
    first = await store.page_jobs(JobPageQuery(limit=3))
    assert [j.id for j in first] == ["media", "j6", "j5"]

    seen: list[str] = []
    after = None
    default = JobFilter(queue="default")
    while page := await store.page_jobs(JobPageQuery(default, after=after, limit=2)):
        seen.extend(j.id for j in page)
        after = (page[-1].created_at, page[-1].id)
    assert seen == ["j6", "j5", "j4", "j3", "j2", "j1", "j0"]

    oldest = await store.page_jobs(JobPageQuery(JobFilter(type="even"), newest_first=False))
    assert [j.id for j in oldest] == ["j0", "j2", "j4", "j6"]
    j2 = await store.get("j2")
    assert j2 is not None
    window = JobPageQuery(
        JobFilter(created_after=j2.created_at, created_before=j2.created_at + timedelta(seconds=2)),
        newest_first=False,
    )
    assert [j.id for j in await store.page_jobs(window)] == ["j2", "j3", "j4"]
    (running,) = await claim(store, limit=1)
    only = await store.page_jobs(JobPageQuery(JobFilter(status=(Status.RUNNING,))))
    assert [j.id for j in only] == [running.id]


async def test_the_dashboards_reads_count_what_the_store_holds(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("root"), new("waiting", queue="media")])
    (root,) = await claim(store, limit=1)
    await store.spawn(Lease("root", root.lease_token), [new("c1"), new("c2")])
    assert await store.running_by_worker() == {"w1": 1}
    below = (await store.get("root")).below  # type: ignore[union-attr]
    assert below is not None and (below.queued, below.total) == (2, 2)
    clock.advance(5)
    lag = {q.queue: q for q in await store.queue_lag()}
    assert lag["media"].due == 1 and lag["media"].oldest_age == pytest.approx(5, abs=0.5)
    for child in await claim(store):
        done = Settlement(child.id, child.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        await store.settle([done])
    since = datetime.fromtimestamp(clock.now - 3600, UTC)
    assert sum(m.succeeded for m in await store.minute_stats(since)) == 2
    await store.acquire_lease("export", owner="a", ttl=10)
    assert await store.lease_names() == ["export"]
    at = datetime.fromtimestamp(clock.now, UTC)
    await store.record_audit(AuditEntry(at, "acme", "t1", "job.cancel", "root"))
    await store.record_audit(AuditEntry(at, "other", "t2", "queue.pause", "media"))
    (entry,) = await store.audit_log(tenant="acme")
    assert (entry.action, entry.target, entry.id is not None) == ("job.cancel", "root", True)
    assert [e.tenant for e in await store.audit_log()] == ["other", "acme"]


async def test_a_tenants_reads_count_only_its_jobs(store: Store) -> None:
    acme = [new("acme/a", tenant="acme"), new("acme/b", tenant="acme", queue="media")]
    await store.submit([*acme, new("globex/a", tenant="globex"), new("plain")])
    assert await store.count_queued("acme") == 2 and await store.count_queued("nobody") == 0
    counts = {q.name: q.counts for q in await store.queues(tenant="acme")}
    assert counts == {"default": {"queued": 1}, "media": {"queued": 1}}
    await claim(store)
    assert await store.running_by_worker(tenant="globex") == {"w1": 1}
    assert await store.running_by_worker() == {"w1": 3}


async def test_tokens_are_created_found_touched_revoked_once_and_listed(
    store: Store, clock: FakeClock
) -> None:
    made = datetime.fromtimestamp(clock.now, UTC)
    token = Token("t1", "acme", Role.WRITE, hash_secret("s3cret"), "ci", made)
    await store.create_token(token)
    assert await store.find_token("t1") == token
    assert await store.find_token("missing") is None
    clock.advance(10)
    await store.touch_token("t1")
    touched = await store.find_token("t1")
    assert touched is not None and touched.last_used_at is not None
    assert touched.last_used_at.timestamp() == pytest.approx(clock.now, abs=0.01)
    revoked = await store.revoke_token("t1")
    assert revoked is not None and revoked.revoked_at is not None and not revoked.active
    clock.advance(10)
    again = await store.revoke_token("t1")
    assert again is not None and again.revoked_at == revoked.revoked_at
    assert await store.revoke_token("missing") is None
    await store.create_token(Token("t2", "acme", Role.READ, hash_secret("x"), None, made))
    assert {t.id for t in await store.list_tokens()} == {"t1", "t2"}


async def test_tokens_expire_and_rotate_with_a_grace_and_servers_share_a_secret(
    store: Store, clock: FakeClock
) -> None:
    made = datetime.fromtimestamp(clock.now, UTC)
    until = made + timedelta(days=30)
    token = Token("t1", "acme", Role.READ, hash_secret("one"), None, made, expires_at=until)
    await store.create_token(token)
    found = await store.find_token("t1")
    assert found is not None and found.expires_at == until
    grace = made + timedelta(minutes=10)
    rotated = await store.rotate_token("t1", secret_hash=hash_secret("two"), grace_until=grace)
    assert rotated is not None and rotated.secret_hash == hash_secret("two")
    assert rotated.previous_hash == hash_secret("one") and rotated.previous_expires_at == grace
    assert rotated.matches("one", made) and not rotated.matches("one", grace)
    at_once = await store.rotate_token("t1", secret_hash=hash_secret("three"), grace_until=None)
    assert at_once is not None and at_once.previous_hash is None
    assert not at_once.matches("two", made) and at_once.matches("three", made)
    await store.revoke_token("t1")
    assert await store.rotate_token("t1", secret_hash="x", grace_until=None) is None
    assert await store.rotate_token("missing", secret_hash="x", grace_until=None) is None
    secret = await store.server_secret("cursor")
    assert secret is not None and len(secret) >= 32
    assert await store.server_secret("cursor") == secret  # made once, by the migration
    assert await store.server_secret("nothing") is None


async def test_minute_stats_of_a_tenant_count_its_jobs_only(store: Store, clock: FakeClock) -> None:
    await store.submit([new("acme/a1", tenant="acme"), new("acme/a2", tenant="acme")])
    await store.submit([new("globex/g1", tenant="globex")])
    for job in await claim(store):
        done = Settlement(job.id, job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        await store.settle([done])
    since = datetime.fromtimestamp(clock.now - 3600, UTC)
    assert sum(m.succeeded for m in await store.minute_stats(since)) == 3
    assert sum(m.succeeded for m in await store.minute_stats(since, tenant="acme")) == 2
    assert sum(m.succeeded for m in await store.minute_stats(since, tenant="globex")) == 1
    assert await store.minute_stats(since, tenant="initech") == []
