"""SQLite's job table is keyed by each job's creation microsecond (migration 14): jobs list
in creation order and filter by time on the table itself, a batch's jobs take one
microsecond each, another process's jobs holding a microsecond send a submit the general
way, and the migration keeps every job, in the order it listed in before."""

from __future__ import annotations

import importlib
import pathlib
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.core.filter import JobFilter
from conveyor.store.protocol import JobPageQuery
from conveyor.store.sqlite import SQLiteStore
from tests.helpers import FakeClock, new

ONE_US = timedelta(microseconds=1)


@pytest.fixture
def path(tmp_path: pathlib.Path) -> str:
    return str(tmp_path / "keyed.db")


@pytest.fixture
async def store(path: str, clock: FakeClock) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(path, clock=clock)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _keys(path: str) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT created_us, id FROM conveyor_jobs ORDER BY created_us"
        ).fetchall()


async def test_a_batch_takes_a_microsecond_each_in_order_and_returns_what_is_stored(
    store: SQLiteStore, clock: FakeClock, path: str
) -> None:
    # The same clock reading for all: one job, a batch of three, a batch of 600 (written
    # in statements of 512 and fewer rows), then another job.
    submitted = await store.submit([new("solo")])
    submitted += await store.submit([new("b"), new("a"), new("c")])
    submitted += await store.submit([new(f"many{n:03}") for n in range(600)])
    submitted += await store.submit([new("last")])
    start = datetime.fromtimestamp(clock.now, UTC)
    assert [s.job.created_at for s in submitted] == [start + n * ONE_US for n in range(605)]
    for s in submitted[:5] + submitted[-2:]:
        read = await store.get(s.job.id)
        assert read is not None and read.created_at == s.job.created_at
    assert [job_id for _, job_id in _keys(path)] == [s.job.id for s in submitted]
    # A later submit takes its own microsecond again.
    clock.advance(1)
    [later] = await store.submit([new("later")])
    assert later.job.created_at == start + timedelta(seconds=1)


@pytest.mark.parametrize("dependent", [False, True], ids=["alone", "general steps"])
async def test_a_creation_microsecond_reads_back_as_the_other_times_of_its_clock_reading(
    store: SQLiteStore, clock: FakeClock, dependent: bool
) -> None:
    """A reading whose microsecond ``round(now * 1e6)`` rounds up while its time read back
    (``datetime.fromtimestamp``) rounds down: the job's creation time and its run time,
    both from that reading, read back the same, by either way of inserting it."""
    clock.now = 1795851969.7887235
    assert round(clock.now * 1e6) % 1_000_000 == 788724  # the case of the old rounding
    if dependent:
        await store.submit([new("first")])
        clock.now += 1
        [submitted] = await store.submit([new("job", depends_on=("first",))])
    else:
        [submitted] = await store.submit([new("job")])
    read = await store.get("job")
    assert read is not None and read.created_at == submitted.job.created_at
    assert read.created_at == datetime.fromtimestamp(clock.now, UTC)
    if not dependent:
        assert read.run_at == read.created_at


async def test_a_job_of_another_process_holding_the_microsecond_sends_a_submit_the_general_way(
    path: str, clock: FakeClock
) -> None:
    first, second = SQLiteStore(path, clock=clock), SQLiteStore(path, clock=clock)
    await first.open()
    await second.open()
    try:
        # Two processes, one clock reading: the first's batch holds the microseconds from
        # it on, which the second, knowing nothing of them, asks for next.
        await first.submit([new("x1"), new("x2"), new("x3")])
        [one] = await second.submit([new("y")])
        [many] = (await second.submit([new("z1"), new("z2")]))[:1]
        [after] = await first.submit([new("x4")])
    finally:
        await first.close()
        await second.close()
    start = datetime.fromtimestamp(clock.now, UTC)
    assert one.created and one.job.created_at == start + 3 * ONE_US
    assert many.created and many.job.created_at == start + 4 * ONE_US
    assert after.created and after.job.created_at == start + 6 * ONE_US
    assert [job_id for _, job_id in _keys(path)] == ["x1", "x2", "x3", "y", "z1", "z2", "x4"]


async def _page(store: SQLiteStore, **kw: object) -> list[str]:
    return [job.id for job in await store.page_jobs(JobPageQuery(**kw))]  # type: ignore[arg-type]


async def test_pages_go_in_creation_order_past_a_deleted_anchor_and_filter_by_the_microsecond(
    store: SQLiteStore, clock: FakeClock, path: str
) -> None:
    # Another process whose clock is behind: "early" is created before a job written
    # before it, and lists by its creation time, not by when it was written. (One store's
    # own jobs never go back: it gives each the microsecond after the last it gave.)
    start = datetime.fromtimestamp(clock.now, UTC)
    await store.submit([new("a"), new("b"), new("c")])
    clock.advance(0.000_010)
    await store.submit([new("d")])
    clock.advance(-0.000_005)
    behind = SQLiteStore(path, clock=clock)
    await behind.open()
    try:
        [early] = await behind.submit([new("early")])
    finally:
        await behind.close()
    assert early.job.created_at == start + 5 * ONE_US
    assert await _page(store) == ["d", "early", "c", "b", "a"]
    assert await _page(store, newest_first=False) == ["a", "b", "c", "early", "d"]
    # Keyset pages, also once the anchor is gone (its cursor's time stands in).
    first = await store.page_jobs(JobPageQuery(limit=2))
    assert [j.id for j in first] == ["d", "early"]
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM conveyor_jobs WHERE id = 'early'")
    anchor = (first[-1].created_at, first[-1].id)
    assert await _page(store, after=anchor, limit=2) == ["c", "b"]
    assert await _page(store, after=anchor, newest_first=False) == ["d"]
    # A time filter is exact to the microsecond: after is inclusive, before exclusive.
    window = JobFilter(created_after=start + ONE_US, created_before=start + 10 * ONE_US)
    assert await _page(store, filter=window) == ["c", "b"]
    tenant = JobFilter(tenant="acme", created_after=start + 11 * ONE_US)
    await store.submit([new("acme/t1", tenant="acme"), new("acme/t2", tenant="acme")])
    assert await _page(store, filter=tenant) == ["acme/t2", "acme/t1"]


async def test_the_migration_keeps_every_job_in_the_order_it_listed_in_before(
    path: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = importlib.import_module("conveyor.store.sqlite.backend")
    migrations = backend._MIGRATIONS
    at = next(i for i, m in enumerate(migrations) if m[1].endswith("_creation_key.sql"))
    monkeypatch.setattr(backend, "_MIGRATIONS", migrations[:at])
    old = SQLiteStore(path, clock=clock)
    await old.migrate()
    await old.close()
    t = 1_800_000_000.123_456_4  # a time stored to a fraction of a microsecond
    rows = [
        # (id, created_at): a batch of three sharing a time, a job a microsecond after
        # it (the batch pushes it on), one a second later, one earlier, written last.
        ("b", t), ("a", t), ("c", t), ("d", t + 0.000_001), ("e", t + 1), ("early", t - 1),
    ]  # fmt: skip
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO conveyor_jobs (id, type, queue, payload, status, max_attempts, "
            "run_at, backoff_base, backoff_cap, created_at, result, attempt) "
            "VALUES (?, 't', 'q', '{\"n\": 1}', 'succeeded', 3, 5.5, 1, 60, ?, '[1, 2]', 2)",
            rows,
        )
    monkeypatch.setattr(backend, "_MIGRATIONS", migrations)
    upgraded = SQLiteStore(path, clock=clock)
    assert await upgraded.migrate() == [m[1] for m in migrations[at:]]
    try:
        with sqlite3.connect(path) as conn:  # each time's microsecond, as SQLite rounds
            (us,) = conn.execute("SELECT CAST(round(? * 1000000) AS INTEGER)", (t,)).fetchone()
            (early_us,) = conn.execute(
                "SELECT CAST(round(? * 1000000) AS INTEGER)", (t - 1,)
            ).fetchone()
            (e_us,) = conn.execute(
                "SELECT CAST(round(? * 1000000) AS INTEGER)", (t + 1,)
            ).fetchone()
        assert _keys(path) == [
            (early_us, "early"),
            (us, "a"),
            (us + 1, "b"),
            (us + 2, "c"),
            (us + 3, "d"),
            (e_us, "e"),
        ]
        a = await upgraded.get("a")
        assert a is not None and a.created_at == datetime.fromtimestamp(us / 1e6, UTC)
        assert (a.result, a.attempt, a.run_at.timestamp()) == ([1, 2], 2, 5.5)
        with sqlite3.connect(path) as conn:
            indexes = {
                r[0] for r in conn.execute("SELECT name FROM pragma_index_list('conveyor_jobs')")
            }
            with pytest.raises(sqlite3.IntegrityError, match=r"conveyor_jobs\.id"):
                conn.execute(
                    "INSERT INTO conveyor_jobs (id, type, queue, payload, status, "
                    "max_attempts, run_at, backoff_base, backoff_cap, created_us, created_at) "
                    "VALUES ('a', 't', 'q', '{}', 'queued', 3, 0, 1, 60, 1, 0.000001)"
                )
        assert "conveyor_jobs_created" not in indexes
        assert {"conveyor_jobs_claim", "conveyor_jobs_tenant_created"} <= indexes
        # New jobs go on after the migrated ones.
        [fresh] = await upgraded.submit([new("fresh")])
        assert fresh.job.created_at == datetime.fromtimestamp(clock.now, UTC)
    finally:
        await upgraded.close()


async def test_a_release_before_the_key_can_still_submit_and_its_job_lists_in_order(
    store: SQLiteStore, clock: FakeClock, path: str
) -> None:
    """During a rolling deploy the release before migration 14 still runs: it writes
    created_at and not the key, and SQLite gives its job the key after the newest job's."""
    await store.submit([new("new-1")])
    clock.advance(5)
    with sqlite3.connect(path) as conn:  # the older release's insert_job, as it was
        conn.execute(
            "INSERT INTO conveyor_jobs (id, type, queue, payload, status, max_attempts, "
            "run_at, backoff_base, backoff_cap, created_at) "
            "VALUES ('old-1', 't', 'default', '{\"n\": 1}', 'queued', 3, ?, 1, 60, ?) "
            "ON CONFLICT DO NOTHING",
            (clock.now, clock.now),
        )
    clock.advance(5)
    await store.submit([new("new-2")])
    old = await store.get("old-1")
    assert old is not None and old.created_at == datetime.fromtimestamp(clock.now - 5, UTC)
    assert await _page(store) == ["new-2", "old-1", "new-1"]
    assert [
        job.id for job in await store.claim(worker_id="w", queues=["default"], limit=9, lease=30)
    ] == [
        "new-1",
        "old-1",
        "new-2",
    ]
