"""What only the PostgreSQL backend does, against a real server: transactional submit,
the database clock, LISTEN/NOTIFY, connection errors, migrations and the claim index.

Every test gets a new database (the ``postgres_database`` fixture) that is dropped after.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from conveyor import (
    ConfigurationError,
    Conveyor,
    DatabaseUnavailable,
    IdempotencyConflict,
    JobContext,
    JobNotFound,
    NotAConveyorDatabase,
    Outcome,
    Status,
    Submission,
)
from conveyor.app import blocking
from conveyor.core.model import Settlement
from conveyor.store import Lease, create_store
from conveyor.store.postgres import PostgresStore
from conveyor.store.postgres._codec import Q as _Q
from conveyor.store.postgres._settle import settle_with_leaves
from conveyor.store.postgres.backend import _MIGRATIONS
from tests.helpers import eventually, new, running_worker, settled

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def url(postgres_database: str) -> str:
    return postgres_database


@pytest.fixture
def db_url(url: str) -> str:
    """Only PostgreSQL here: the shared ``store`` fixture opens this database."""
    return url


@pytest.fixture
def clock() -> None:
    """No pinned clock: these tests are about the server's own."""
    return None


@pytest.fixture
async def app(url: str) -> AsyncIterator[Conveyor]:
    application = Conveyor(url)
    seen: list[str] = []

    @application.job()
    async def remember(ctx: JobContext, note: str) -> str:
        seen.append(note)
        return note

    application.seen = seen  # type: ignore[attr-defined]
    yield application
    await application.close()


# -- transactional submit -------------------------------------------------------------


async def test_a_job_submitted_in_a_rolled_back_transaction_does_not_exist(
    app: Conveyor, url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
        await conn.commit()
        await conn.execute("INSERT INTO orders VALUES (1)")
        job = await app.submit("remember", {"note": "order 1"}, connection=conn)
        assert job.status is Status.QUEUED
        with pytest.raises(JobNotFound):
            await app.get(job.id)  # not visible outside the transaction before commit
        await conn.rollback()
    with pytest.raises(JobNotFound):
        await app.get(job.id)


async def test_a_job_submitted_in_a_committed_transaction_runs(app: Conveyor, url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
        await conn.execute("INSERT INTO orders VALUES (2)")
        jobs = await app.submit_many(
            [Submission("remember", {"note": f"order 2, mail {i}"}) for i in range(3)],
            connection=conn,
        )
        await conn.commit()
    async with running_worker(app):
        for job in jobs:
            await settled(await app.get(job.id), Status.SUCCEEDED)
    assert sorted(app.seen) == [f"order 2, mail {i}" for i in range(3)]  # type: ignore[attr-defined]


async def test_an_application_connection_that_reads_json_as_text_still_reads_jobs_right(
    app: Conveyor, url: str
) -> None:
    # Django registers a text loader for json on its connections: conveyor's rows are read
    # with conveyor's loaders whatever the application's are.
    from psycopg.types.string import TextLoader

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        conn.adapters.register_loader("json", TextLoader)
        first = await app.submit("remember", {"note": "once"}, id="order-3", connection=conn)
        again = await app.submit("remember", {"note": "once"}, id="order-3", connection=conn)
        assert (await (await conn.execute("SELECT payload FROM conveyor_jobs")).fetchone()) == (
            '{"note":"once"}',
        )
    assert again.id == first.id
    assert again.record.payload == {"note": "once"}  # read back from the row


async def test_an_autocommit_connection_commits_the_submit_on_its_own(
    app: Conveyor, url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        job = await app.submit("remember", {"note": "now"}, connection=conn)
        assert (await app.get(job.id)).status is Status.QUEUED
        # Inside the application's transaction block, the submit joins it (a savepoint).
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                inner = await app.submit("remember", {"note": "never"}, connection=conn)
                raise RuntimeError("the request failed")
    with pytest.raises(JobNotFound):
        await app.get(inner.id)


def _while_the_portal_is_blocked(submit: Callable[[], Any]) -> Any:
    """Run ``submit`` on a thread while the portal's loop is blocked, and return its
    result; fail if it waited for the portal."""
    portal = blocking.portal_loop()
    assert portal is not None
    blocked, release = threading.Event(), threading.Event()

    def hold() -> None:
        blocked.set()
        release.wait(60)

    portal.call_soon_threadsafe(hold)
    blocked.wait(30)
    done: list[Any] = []
    submitter = threading.Thread(target=lambda: done.append(submit()))
    submitter.start()
    try:
        submitter.join(30)  # returns at once unless the submit waits for the portal
        assert done, "the submit waited for the blocked portal"
    finally:
        release.set()
        submitter.join(30)
    return done[0]


def test_a_blocking_submit_of_one_job_skips_the_portal(url: str) -> None:
    """Issue 31: app.sync.submit of one job on PostgreSQL is one statement on a connection
    of the store's transaction pool, on the caller's thread, even while the portal's loop
    is blocked. A taken id, several jobs or a job with dependencies go through the portal,
    with the usual answers."""
    app = Conveyor(url)

    @app.job()
    def mail(ctx: JobContext, to: str) -> None: ...

    try:
        first = app.sync.submit("mail", {"to": "a"})  # opens the portal's store
        job = _while_the_portal_is_blocked(lambda: app.sync.submit("mail", {"to": "b"}, priority=3))
        stored = app.sync.get(job.id)
        assert stored.status is Status.QUEUED and stored.record.priority == 3
        assert stored.record.payload == {"to": "b"} and job.record.created_at is not None
        assert app.sync.submit("mail", {"to": "b"}, id=job.id).id == job.id  # taken id
        with pytest.raises(IdempotencyConflict):
            app.sync.submit("mail", {"to": "other"}, id=job.id)
        after = app.sync.submit("mail", {"to": "c"}, depends_on=[first.id])
        more = app.sync.submit_many([Submission("mail", {"to": to}) for to in "de"])
        assert after.status is Status.PENDING
        assert {app.sync.get(h.id).status for h in more} == {Status.QUEUED}
    finally:
        app.sync.close()


def test_blocking_submits_on_a_checked_connection_skip_the_portal(url: str, other_url: str) -> None:
    """A blocking psycopg connection takes part in its transaction: what a rollback
    drops is gone, what a commit keeps is queued. Issue 31 (a Django view's enqueue):
    once the connection was found on the store's database (the first submit on it,
    through the portal), ``app.sync``'s submits in it are written on the caller's thread,
    even while the portal's loop is blocked. A connection never checked still goes
    through the portal and its check."""
    app = Conveyor(url)

    @app.job()
    def mail(ctx: JobContext, to: str) -> None: ...

    try:
        with psycopg.connect(url) as conn:
            conn.execute("SELECT 1")  # the transaction is open, as in a web request
            checked = app.sync.submit("mail", {"to": "a"}, connection=conn)  # the check
            dropped = _while_the_portal_is_blocked(
                lambda: app.sync.submit("mail", {"to": "b"}, connection=conn)
            )
            conn.rollback()
            kept = _while_the_portal_is_blocked(
                lambda: app.sync.submit_many(
                    [Submission("mail", {"to": to}) for to in "cd"], connection=conn
                )
            )
            conn.commit()
            # A taken id in the transaction: the one-statement insert writes nothing, and
            # the steps after it find the job (on this thread still).
            again = _while_the_portal_is_blocked(
                lambda: app.sync.submit("mail", {"to": "c"}, id=kept[0].id, connection=conn)
            )
            assert again.id == kept[0].id
            with pytest.raises(IdempotencyConflict):
                app.sync.submit("mail", {"to": "x"}, id=kept[0].id, connection=conn)
            conn.rollback()
        for gone in (checked, dropped):
            with pytest.raises(JobNotFound):
                app.sync.get(gone.id)
        assert {app.sync.get(h.id).status for h in kept} == {Status.QUEUED}
        with (
            psycopg.connect(other_url) as elsewhere,
            pytest.raises(ConfigurationError, match="connection= is to database"),
        ):
            app.sync.submit("mail", {"to": "lost"}, connection=elsewhere)
    finally:
        app.sync.close()


async def test_idempotent_ids_and_unique_keys_hold_through_an_application_connection(
    app: Conveyor, url: str
) -> None:
    first = await app.submit("remember", {"note": "x"}, id="req-1", unique_key="k")
    async with await psycopg.AsyncConnection.connect(url) as conn:
        again = await app.submit("remember", {"note": "x"}, id="req-1", connection=conn)
        same_key = await app.submit("remember", {"note": "y"}, unique_key="k", connection=conn)
        await conn.commit()
    assert again.id == first.id and same_key.id == first.id


async def test_a_connection_that_is_not_psycopg_is_refused(app: Conveyor) -> None:
    with pytest.raises(ConfigurationError, match="psycopg"):
        await app.submit("remember", {"note": "x"}, connection=object())


async def test_sqlite_refuses_an_application_connection(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")

    @app.job()
    async def remember(ctx: JobContext, note: str) -> None: ...

    try:
        with pytest.raises(ConfigurationError, match="PostgreSQL only"):
            await app.submit("remember", {"note": "x"}, connection=object())
    finally:
        await app.close()


# -- the database clock ---------------------------------------------------------------


async def test_a_machine_whose_clock_is_ten_minutes_ahead_does_not_rescue_live_leases(
    url: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.submit([new("live")])
    (held,) = await store.claim(worker_id="honest", queues=["default"], limit=1, lease=30)

    # This machine's clock now runs ten minutes ahead: every lease looks expired by it.
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 600)
    skewed = create_store(url)  # a production store, as a worker on that machine opens it
    await skewed.open()
    try:
        assert await skewed.rescue(limit=100, jitter=0.0) == []
        after = await skewed.get("live")
        assert after is not None and after.status is Status.RUNNING
        assert after.lease_token == held.lease_token
        assert after.lease_expires_at == held.lease_expires_at
        # Its idea of now is the server's, not its own.
        assert abs((await skewed.now()).timestamp() - real_time()) < 60
    finally:
        await skewed.close()

    # Control: a store that trusted this machine's clock would take the live lease, so
    # the check above is not vacuous.
    trusting = create_store(url, clock=time.time)
    await trusting.open()
    try:
        assert [r.job_id for r in await trusting.rescue(limit=100, jitter=0.0)] == ["live"]
    finally:
        await trusting.close()


async def test_leases_and_run_at_are_server_times(store: PostgresStore) -> None:
    await store.submit([new("soon", delay=3600)])
    server_now = await store.now()
    job = await store.get("soon")
    assert job is not None
    assert job.run_at - server_now == pytest.approx(timedelta(hours=1), abs=timedelta(seconds=5))
    assert await store.claim(worker_id="w", queues=["default"], limit=1, lease=30) == []


def test_a_copied_batch_writes_every_column_the_submit_insert_writes() -> None:
    """Large batches are written with COPY (_submit.copy_chunks): a column added to the
    submit INSERT must be added to the COPY too (unique keys and dependencies never
    take the COPY path)."""
    from conveyor.store.postgres._submit import _COPY_COLUMNS

    inserted = _Q["submit"].split("INSERT INTO conveyor_jobs (", 1)[1].split(")", 1)[0]
    columns = {c.strip() for c in inserted.split(",")}
    assert columns - {"unique_key", "depends_on"} == set(_COPY_COLUMNS)


def test_the_one_job_insert_writes_every_column_the_submit_insert_writes() -> None:
    """One job without dependencies is written by submit_one: a column added to the
    submit INSERT must be added there too."""

    def columns(name: str) -> set[str]:
        inserted = _Q[name].split("INSERT INTO conveyor_jobs (", 1)[1].split(")", 1)[0]
        return {c.strip() for c in inserted.split(",")}

    assert columns("submit") - {"depends_on"} == columns("submit_one")


async def _lane_pid(store: PostgresStore) -> int:
    """The server process of the store's one-job submit lane (opened by a submit)."""
    lane = store._one_job._lane
    assert lane is not None and lane.alive, "one-job submits should have opened their lane"
    return int(lane.pgconn.backend_pid)


async def test_one_job_submits_survive_the_loss_of_their_connection(
    store: PostgresStore, url: str
) -> None:
    """One-job submits run on a connection of their own (_lane.py); when the server ends
    it, the next submit still lands (on the pool, then on a new lane), exactly once."""
    assert (await store.submit([new("first")]))[0].created
    lost = await _lane_pid(store)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
        await admin.execute("SELECT pg_terminate_backend(%s)", (lost,))
        # At once, while the session ends: the submit meets its end one way or another.
        (soon,) = await store.submit([new("soon")])
        assert soon.created and soon.job == await store.get("soon")
        assert (await store.submit([new("later")]))[0].created  # on a new lane
        assert await _lane_pid(store) != lost
        lost = await _lane_pid(store)
        await admin.execute("SELECT pg_terminate_backend(%s)", (lost,))

    async def lane_lost() -> bool:
        return store._one_job._lane is None or not store._one_job._lane.alive

    await eventually(lane_lost, timeout=10)
    results = [await store.submit([new(f"after{i}")]) for i in range(3)]
    for i, r in enumerate(results):
        assert r[0].created and r[0].job == await store.get(f"after{i}")
    assert await _lane_pid(store) != lost
    again = await store.submit([new("after0", payload={"n": 2})])
    assert not again[0].created and again[0].job.payload == {"n": 1}


async def test_one_job_submits_at_once_and_a_cancelled_one_leave_the_lane_usable(
    store: PostgresStore,
) -> None:
    """Submits made at once share the lane and the pool; one cancelled while its reply is
    awaited leaves no reply behind for the next submit to misread."""
    results = await asyncio.gather(*(store.submit([new(f"c{i}")]) for i in range(30)))
    assert [r[0].job.id for r in results] == [f"c{i}" for i in range(30)]
    assert all(r[0].created for r in results)
    await _lane_pid(store)
    task = asyncio.create_task(store.submit([new("cancelled")]))
    lane = store._one_job._lane
    while lane is not None and lane._waiter is None and not task.done():
        await asyncio.sleep(0)  # until the statement is sent and its reply awaited
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for i in range(3):
        (done,) = await store.submit([new(f"next{i}", payload={"n": i})])
        assert done.created and done.job.payload == {"n": i}
        assert done.job == await store.get(f"next{i}")


async def test_a_dependent_submitted_while_its_dependency_settles_is_released(
    store: PostgresStore, url: str
) -> None:
    """A dependent submitted in a transaction that holds its dependency's row while the
    dependency's settle waits for that row is seen by the settle, which queues it."""
    await store.submit([new("upstream")])
    (claimed,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        # The dependent's submit locks its dependency's row until this transaction ends.
        await store.submit([new("downstream", depends_on=("upstream",))], connection=conn)
        done = Settlement(claimed.id, claimed.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        settling = asyncio.create_task(store.settle([done]))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher:

            async def settle_waits() -> bool:
                cur = await watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock'"
                )
                row = await cur.fetchone()
                return row is not None and row[0] > 0

            await eventually(settle_waits, timeout=10)
        await conn.commit()
    assert await settling == []
    downstream = await store.get("downstream")
    assert downstream is not None and downstream.status is Status.QUEUED


# -- notifications --------------------------------------------------------------------


async def _listening(url: str, count: int = 1) -> None:
    """Wait until ``count`` sessions of this database wait on LISTEN."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

        async def ready() -> bool:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE '%LISTEN conveyor_job_ready%'"
            )
            row = await cur.fetchone()
            return row is not None and row[0] >= count

        await eventually(ready, timeout=10)


async def test_wait_for_jobs_returns_at_once_on_submit_and_reports_cancels(
    url: str, store: PostgresStore
) -> None:
    await store.wait_for_jobs(0.01)  # starts listening
    await _listening(url)
    await store.wait_for_jobs(0.5)  # the wake-up that follows LISTEN

    other = PostgresStore(url)
    await other.open()
    try:
        waiting = asyncio.create_task(store.wait_for_jobs(30))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await other.submit([new("a"), new("b")])
        assert await asyncio.wait_for(waiting, 10) == frozenset()

        await other.claim(worker_id="w", queues=["default"], limit=2, lease=30)
        await store.wait_for_jobs(0)  # drain
        waiting = asyncio.create_task(store.wait_for_jobs(30))
        await other.cancel("a", reason="stop")
        assert await asyncio.wait_for(waiting, 10) == {"a"}
    finally:
        await other.close()


async def test_an_idle_worker_starts_a_new_job_long_before_its_next_poll(
    app: Conveyor, url: str
) -> None:
    started = asyncio.Event()

    @app.job()
    async def wake(ctx: JobContext) -> None:
        started.set()

    async with running_worker(app, poll_interval=30.0):
        await _listening(url)
        # Let the claim that follows LISTEN pass, so only a notification can start the job.
        await asyncio.sleep(0.3)
        submitted = time.monotonic()
        await wake.submit()
        await asyncio.wait_for(started.wait(), 10)  # the next poll is 30 s away
        latency = time.monotonic() - submitted
    assert latency < 10


async def test_a_cancel_request_reaches_the_running_handler_before_any_heartbeat(
    app: Conveyor, url: str
) -> None:
    running = asyncio.Event()
    stopped = asyncio.Event()

    @app.job()
    async def endless(ctx: JobContext) -> None:
        running.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise

    # A 60 s lease: the heartbeat (which would also report the request) comes every 20 s.
    async with running_worker(app, lease=60.0, poll_interval=30.0):
        await _listening(url)
        job = await endless.submit()
        await asyncio.wait_for(running.wait(), 10)
        await app.cancel(job.id, reason="user asked")
        await asyncio.wait_for(stopped.wait(), 10)
        await settled(job, Status.CANCELLED)
    assert [a.outcome for a in await job.attempts()] == [Outcome.CANCELLED]


# -- connection errors ----------------------------------------------------------------


async def test_an_unreachable_server_is_a_clear_database_unavailable() -> None:
    app = Conveyor("postgresql://conveyor@127.0.0.1:1/jobs")
    with pytest.raises(DatabaseUnavailable) as caught:
        await app.get("x")
    message = str(caught.value)
    assert "127.0.0.1:1" in message and "'jobs'" in message
    assert "server is running" in message


def test_the_cli_reports_an_unreachable_server_without_a_traceback() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor",
            "status",
            "--database-url",
            "postgresql://conveyor:hunter2@127.0.0.1:1/jobs",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "cannot connect to PostgreSQL at 127.0.0.1:1" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr + result.stdout
    assert "hunter2" not in result.stderr + result.stdout


@pytest.mark.parametrize(
    "bad",
    [
        "postgresql://app@db:notaport/jobs",
        "postgresql://app@db/jobs?no_such_option=1",
        "postgresql://[::1/jobs",
    ],
)
def test_a_malformed_url_is_a_configuration_error(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="PostgreSQL URL"):
        Conveyor(bad)


def test_a_password_never_appears_in_errors() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Conveyor("postgresql://app:s3cret@db:notaport/jobs")
    assert "s3cret" not in str(caught.value)


async def test_a_missing_database_says_to_create_it(url: str) -> None:
    app = Conveyor(url.rsplit("/", 1)[0] + "/conveyor_no_such_database")
    with pytest.raises(DatabaseUnavailable, match=r"does not exist.*createdb"):
        await app.get("x")


# -- migrations -----------------------------------------------------------------------


async def test_migrations_apply_once_however_many_run_them_at_once(url: str) -> None:
    stores = [PostgresStore(url, migrate=False) for _ in range(8)]
    try:
        applied = await asyncio.gather(*(s.migrate() for s in stores))
        assert sorted(applied, key=len) == [[]] * 7 + [[name for _, name, _ in _MIGRATIONS]]
        assert await asyncio.gather(*(s.migrate() for s in stores)) == [[]] * 8
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT version FROM conveyor_migrations ORDER BY version")
        assert [r[0] for r in await cur.fetchall()] == list(range(1, len(_MIGRATIONS) + 1))


async def test_many_workers_opening_a_new_database_at_once_migrate_it_once(url: str) -> None:
    stores = [PostgresStore(url) for _ in range(8)]
    try:
        await asyncio.gather(*(s.open() for s in stores))
        await stores[0].submit([new("a")])
        assert (await stores[7].get("a")) is not None
    finally:
        await asyncio.gather(*(s.close() for s in stores))


async def test_a_database_with_application_tables_is_used_not_refused(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE orders (id integer PRIMARY KEY)")
    store = PostgresStore(url)
    await store.open()
    try:
        assert (await store.submit([new("a")]))[0].created
    finally:
        await store.close()


async def test_missing_migrations_without_migrate_say_what_to_run(url: str) -> None:
    store = PostgresStore(url, migrate=False)
    with pytest.raises(ConfigurationError, match="conveyor migrate"):
        await store.open()
    assert await store.migrate() == [name for _, name, _ in _MIGRATIONS]
    await store.open()
    await store.close()


async def test_a_foreign_conveyor_jobs_table_is_refused(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE conveyor_jobs (id integer)")
    with pytest.raises(NotAConveyorDatabase, match="conveyor_jobs"):
        await PostgresStore(url).open()


# -- claims ---------------------------------------------------------------------------


def _buffers(plan: dict) -> int:  # type: ignore[type-arg]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


async def test_claim_reads_a_few_pages_with_100k_queued_jobs_in_two_queues(
    url: str, store: PostgresStore
) -> None:
    # 100,000 jobs of type t, and behind them (latest, least urgent) 1,000 of a rare type
    # that only a specialised worker serves.
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO conveyor_jobs (id, type, queue, payload, status, priority, "
            "max_attempts, run_at, backoff_base, backoff_cap, created_at) "
            "SELECT lpad(g::text, 26, '0'), CASE WHEN g > 100000 THEN 'rare' ELSE 't' END, "
            "CASE WHEN g % 10 = 0 THEN 'media' ELSE 'default' END, '{}', 'queued', "
            "CASE WHEN g > 100000 THEN 5 ELSE g % 3 END, 3, "
            "now() - make_interval(secs => 200000 - g), 1, 60, now() "
            "FROM generate_series(1, 101000) AS g"
        )
        await conn.execute("ANALYZE conveyor_jobs")
        for types in (["t"], ["rare"], ["t", "rare", "absent"]):
            cur = await conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _Q["claim"],
                {
                    "worker_id": "w",
                    "queues": ["default", "media"],
                    "types": types,
                    "limit": 10,
                    "lease": 30.0,
                    "now": None,
                },
            )
            row = await cur.fetchone()
            plan = (json.loads(row[0]) if isinstance(row[0], str) else row[0])[0]["Plan"]
            # Claiming 10 jobs touches pages for those 10 rows and their index entries,
            # not the 100,000 rows that wait, whichever share of them the worker serves:
            # a sort of every due row, or a scan past other types, would read thousands.
            assert _buffers(plan) < 400, (types, plan)
    claimed = await store.claim(
        worker_id="w", queues=["default", "media"], types=["t"], limit=10, lease=30
    )
    assert [(j.type, j.priority) for j in claimed] == [("t", 0)] * 10
    rare = await store.claim(
        worker_id="w", queues=["default", "media"], types=["rare"], limit=10, lease=30
    )
    assert [(j.type, j.priority) for j in rare] == [("rare", 5)] * 10


@pytest.fixture
def other_url(url: str) -> Iterator[str]:
    """A second database on the same server, dropped after the test."""
    base, _, _ = url.rpartition("/")
    name = f"conveyor_other_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.parametrize("other_has_conveyor", [False, True])
async def test_a_connection_to_another_database_is_refused_before_anything_is_written(
    app: Conveyor, url: str, other_url: str, other_has_conveyor: bool
) -> None:
    other_app = Conveyor(other_url)
    if other_has_conveyor:  # worse than a missing table: the job would land there
        await other_app.migrate()
    mine = url.rpartition("/")[2]
    theirs = other_url.rpartition("/")[2]
    async with await psycopg.AsyncConnection.connect(other_url) as conn:
        with pytest.raises(ConfigurationError) as refused:
            await app.submit("remember", {"note": "lost"}, connection=conn)
        assert str(refused.value).startswith(
            f"connection= is to database {theirs!r}, but this application uses {mine!r}"
        )
        await conn.execute("SELECT 1")  # the application's transaction is intact
        await conn.commit()
    assert await app.list_jobs() == []
    if other_has_conveyor:
        assert await other_app.list_jobs() == []
    await other_app.close()
    # A connection to the right database is checked once, then trusted.
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for note in ("a", "b"):
            await app.submit("remember", {"note": note}, connection=conn)
        await conn.commit()
    assert len(await app.list_jobs()) == 2


def test_a_script_using_app_sync_exits_without_destroyed_tasks(url: str, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import sys\n"
        "from conveyor import Conveyor\n"
        "app = Conveyor(sys.argv[1])\n"
        "@app.job()\n"
        "def mail(ctx, to: str) -> None: ...\n"
        "job = app.sync.submit('mail', {'to': 'a@b.c'})\n"
        "print(app.sync.get(job.id).status.value)\n"
    )
    done = subprocess.run(
        [sys.executable, "-X", "dev", str(script), url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "queued"
    assert "Task was destroyed" not in done.stderr, done.stderr


async def test_a_parent_left_waiting_by_a_settle_that_died_before_deciding_is_ended(
    store: PostgresStore, url: str
) -> None:
    """The leaves' settle commits before their parent is decided (postgres/_settle.py):
    a worker that dies in between leaves the parent waiting with nothing unfinished below
    it, for the maintenance sweep to end, callbacks and all."""
    await store.submit([new("parent")])
    (parent,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
    callbacks = {"complete": new("cb")}
    assert await store.spawn(Lease("parent", parent.lease_token), [new("c")], callbacks)
    returned = Settlement("parent", parent.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    await store.settle([returned])
    (child,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
    ended = Settlement("c", child.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
    with psycopg.connect(url, autocommit=True) as conn:  # the settle, without what follows
        ran = settle_with_leaves(conn, [ended], None)
    assert (ran.refused, ran.rest, ran.done) == ([], [], ["parent"])
    waiting = await store.get("parent")
    assert waiting is not None and waiting.status is Status.WAITING
    assert waiting.below is not None and waiting.below.succeeded == 1
    assert await store.finish_parents(limit=10) == ["parent"]
    done = await store.get("parent")
    assert done is not None and done.status is Status.SUCCEEDED
    assert await store.get("parent.on_complete") is not None


TEXTS = [
    "a",
    None,
    'say "hi"',
    "back\\slash",
    '\\"',
    "NULL",
    "null",
    "{,}",
    " spaced ",
    "é ü 中 🙂",
    "line\nbreak\ttab",
    "",
    "x" * 5000,
]
NUMBERS = [1, None, 2.5, float("inf"), -float("inf"), 1e-07, 2**62, 0.1 + 0.2, -0.0]


def test_a_batchs_arrays_read_back_as_they_were_passed(url: str) -> None:
    # A settle's and a heartbeat's columns go as PostgreSQL's text form of an array, made
    # in _codec: every text, however quoted, and every float come back exactly.
    from conveyor.store.postgres._codec import bool_array, number_array, text_array

    with psycopg.connect(url, autocommit=True) as conn:
        texts = conn.execute("SELECT %s::text[]", [text_array(TEXTS)]).fetchone()
        floats = conn.execute("SELECT %s::float8[]", [number_array(NUMBERS)]).fetchone()
        ints = conn.execute("SELECT %s::bigint[]", [number_array([1, 2**62, None])]).fetchone()
        flags = conn.execute("SELECT %s::boolean[]", [bool_array([True, False])]).fetchone()
        nan = conn.execute("SELECT %s::float8[]", [number_array([float("nan")])]).fetchone()
    assert texts == (TEXTS,)
    assert floats == ([None if n is None else float(n) for n in NUMBERS],)
    assert ints == ([1, 2**62, None],)
    assert flags == ([True, False],)
    assert nan is not None and nan[0][0] != nan[0][0]  # NaN
