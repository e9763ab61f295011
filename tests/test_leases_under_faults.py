"""Leases under faults, on every backend (issue #16, items 1, 2 and 5).

A claim that waits for the database's write lock longer than the lease, a handler that
holds its worker's event loop past the lease while a settle is open, a job rescued from
the worker still running it, and a sync handler abandoned past its cancel grace. Each
test injects the fault for real (a lock held by a connection of the test's own, a loop
blocked by ``time.sleep``), and would have failed before the fix it guards.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from typing import Any

from conveyor import Conveyor, JobContext, Outcome, Status
from conveyor.core.model import Job, NewJob, Progress
from conveyor.store import Lease
from tests.helpers import eventually, fast_options, running_worker, settled


class _Probe:
    """A connection of the test's own to the database under test, beside conveyor's."""

    def __init__(self, backend: str, db_url: str) -> None:
        self.postgres = backend == "postgres"
        self.conn: Any
        if self.postgres:
            import psycopg

            self.conn = psycopg.connect(db_url, autocommit=True)
        else:
            path = db_url.removeprefix("sqlite:///")
            self.conn = sqlite3.connect(
                path, isolation_level=None, timeout=30, check_same_thread=False
            )

    def close(self) -> None:
        self.conn.close()

    def _one(self, postgres: str, sqlite: str, params: tuple[object, ...] = ()) -> Any:
        query = postgres if self.postgres else sqlite
        row = self.conn.execute(query, params).fetchone()
        return None if row is None else row[0]

    def now(self) -> float:
        """The time on the clock that decides leases, in seconds since the epoch."""
        if self.postgres:
            return float(self._one("SELECT extract(epoch FROM clock_timestamp())", ""))
        return time.time()

    def hold_write_lock(self) -> None:
        """Take the lock every claim needs, until :meth:`release`."""
        self.conn.execute("BEGIN" if self.postgres else "BEGIN IMMEDIATE")
        if self.postgres:
            self.conn.execute("LOCK TABLE conveyor_jobs IN EXCLUSIVE MODE")

    def release(self) -> float:
        """Release the lock; return when, on the lease clock (no claim got it before)."""
        released = self.now()
        if self.postgres or self.conn.in_transaction:
            self.conn.execute("COMMIT")
        return released

    def waiting_for_lock(self) -> bool:
        """Whether another session waits for a lock (PostgreSQL; SQLite cannot tell)."""
        if not self.postgres:
            return True
        # Inside a transaction (the probe's lock), pg_stat_activity is read once, from a
        # snapshot taken at the first read, unless the snapshot is dropped first.
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        return bool(
            self._one(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'",
                "",
            )
        )

    def lock_row(self, job_id: str) -> None:
        """Lock a job's row until :meth:`release` (PostgreSQL; SQLite has no row locks).

        SQLite's transactions run to completion on the store's thread, never across a
        blocked event loop, so no row of a worker's stays locked there.
        """
        if self.postgres:
            self.conn.execute("BEGIN")
            self.conn.execute("SELECT 1 FROM conveyor_jobs WHERE id = %s FOR UPDATE", (job_id,))

    def status(self, job_id: str) -> str:
        return str(
            self._one(
                "SELECT status FROM conveyor_jobs WHERE id = %s",
                "SELECT status FROM conveyor_jobs WHERE id = ?",
                (job_id,),
            )
        )

    def expire_lease(self, job_id: str) -> None:
        """Make a running job's lease expired, as a claim that waited past it stored it."""
        if self.postgres:
            self.conn.execute(
                "UPDATE conveyor_jobs SET lease_expires_at = now() - interval '1 minute' "
                "WHERE id = %s",
                (job_id,),
            )
        else:
            self.conn.execute(
                "UPDATE conveyor_jobs SET lease_expires_at = ? WHERE id = ?",
                (time.time() - 60, job_id),
            )


class _WorkerThread:
    """A worker on an event loop and a thread of its own, so that one can block it."""

    def __init__(self, app: Conveyor, **options: object) -> None:
        self.worker = app.worker(fast_options(**options))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(self.worker.run())
        except BaseException as exc:
            self.error = exc

    async def stop(self) -> None:
        self.worker.stop()
        await asyncio.to_thread(self.thread.join, 60)
        assert not self.thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error


async def _true(check: Any) -> bool:
    return bool(check())


# -- item 2: a claim that waits longer than the lease ------------------------------------


async def test_a_claim_that_waits_for_the_write_lock_leases_from_when_it_got_it(
    app: Conveyor, backend: str, db_url: str
) -> None:
    lease = 1.0

    @app.job()
    async def noop(ctx: JobContext) -> None:
        return None

    await noop.submit()
    store = app.new_store()
    await store.open()
    probe = _Probe(backend, db_url)
    try:
        probe.hold_write_lock()
        claim = asyncio.create_task(
            store.claim(worker_id="w", queues=app.registry.queues(), limit=1, lease=lease)
        )
        await asyncio.sleep(0)  # the claim is sent
        await eventually(lambda: _true(probe.waiting_for_lock))
        await asyncio.sleep(2 * lease)  # the fault: the lock is held for twice the lease
        released = probe.release()
        (claimed,) = await asyncio.wait_for(claim, 30)
        now = probe.now()
    finally:
        probe.close()
        await store.close()
    assert claimed.lease_expires_at is not None
    expires = claimed.lease_expires_at.timestamp()
    assert expires > now, "the claim stored a lease that had already expired"
    assert expires >= released + lease, (
        f"the lease counts from {expires - lease - released:+.2f}s after the lock was "
        "released: its clock was read before the claim got the lock"
    )


async def test_a_job_rescued_from_its_worker_and_claimed_back_runs_once_at_a_time(
    app: Conveyor, backend: str, db_url: str
) -> None:
    events: list[tuple[str, int]] = []
    second_may_end = asyncio.Event()

    @app.job(backoff="10ms")
    async def sticky(ctx: JobContext) -> int:
        events.append(("start", ctx.attempt))
        try:
            if ctx.attempt == 1:
                await asyncio.Event().wait()  # until cancelled
            await second_may_end.wait()
        except asyncio.CancelledError:
            events.append(("cancelled", ctx.attempt))
            raise
        return ctx.attempt

    def running(worker_runs: list[Any]) -> int:
        return sum(1 for r in worker_runs if r.job.id == job.id and not r.done)

    job = await sticky.submit()
    probe = _Probe(backend, db_url)
    try:
        # A long lease: the heartbeat (every 20 s) does not notice the rescue before
        # the worker claims the job back, so the claim meets the run still going.
        async with running_worker(app, lease=60.0, rescue_interval=0.1) as worker:
            await eventually(lambda: _true(lambda: ("start", 1) in events))
            probe.expire_lease(job.id)  # the worker's own rescuer requeues the job
            await eventually(lambda: _true(lambda: ("start", 2) in events))
            await eventually(lambda: _true(lambda: ("cancelled", 1) in events), timeout=10)
            assert running(worker.held()) == 1
            second_may_end.set()
            await settled(job, Status.SUCCEEDED)
    finally:
        probe.close()
    assert job.result == 2
    assert [a.outcome for a in await job.attempts()] == [Outcome.LOST, Outcome.SUCCEEDED]
    # The older run was cancelled as the job was claimed back (its handler sees the
    # cancellation on its next step, which may come after the new run's first).
    assert sorted(events) == [("cancelled", 1), ("start", 1), ("start", 2)]


# -- item 1: a handler that holds the event loop while a held row is locked ---------------


async def test_a_heartbeat_skips_a_locked_row_as_busy_and_renews_the_others(
    app: Conveyor, backend: str, db_url: str
) -> None:
    @app.job()
    async def noop(ctx: JobContext) -> None:
        return None

    await noop.submit()
    await noop.submit()
    store = app.new_store()
    await store.open()
    locker = _Probe(backend, db_url)
    try:
        claimed = await store.claim(
            worker_id="w", queues=app.registry.queues(), limit=2, lease=30.0
        )
        locked, free = sorted(claimed, key=lambda j: j.id)
        keys = [Lease(j.id, j.lease_token) for j in (locked, free)]
        progress = {key: Progress(1.0, 2.0, "half") for key in keys}
        locker.lock_row(locked.id)  # as the worker's own settle holds it, on PostgreSQL
        beat = await asyncio.wait_for(
            store.heartbeat(worker_id="w", leases=keys, lease=60.0, progress=progress), 10
        )
        locker.release()
        after = {j.id: j for j in await store.get_many([locked.id, free.id])}
    finally:
        locker.close()
        await store.close()
    assert beat.lost == frozenset()
    assert after[free.id].progress == Progress(1.0, 2.0, "half")
    assert _expiry(after[free.id]) > _expiry(free) + 20
    if backend == "postgres":
        assert beat.busy == {locked.id}
        assert _expiry(after[locked.id]) == _expiry(locked), "a busy lease is not renewed"
        assert after[locked.id].progress is None, "a busy job's progress waits"
    else:
        assert beat.busy == frozenset()


def _expiry(job: Job) -> float:
    assert job.lease_expires_at is not None
    return job.lease_expires_at.timestamp()


async def test_a_handler_holding_the_event_loop_does_not_starve_the_heartbeat(
    app: Conveyor, backend: str, db_url: str
) -> None:
    """Worker A holds two leases: the hog, whose handler blocks A's event loop for three
    leases, and quick, whose result waits to be recorded because another transaction
    holds quick's row. In the field that transaction is A's own settle, left open on the
    blocked loop (PostgreSQL); here a connection of the test holds it, so that the fault
    does not hang on a race. A heartbeat that waited for quick's row would renew neither
    lease, and worker B would rescue the hog and run it alongside."""
    lease = 2.0
    starts: list[str] = []  # the worker of each start of the hog
    quick_may_end = threading.Event()
    hog_done = threading.Event()
    locker = _Probe(backend, db_url)
    watcher = _Probe(backend, db_url)

    @app.job()
    async def quick(ctx: JobContext) -> None:
        while not quick_may_end.is_set():
            await asyncio.sleep(0.01)

    @app.job(backoff="10ms")
    async def hog(ctx: JobContext) -> str:
        starts.append(ctx.worker_id)
        if ctx.worker_id == "A":
            # Once quick has ended, its settle is sent and waits for its row (PostgreSQL).
            while not (quick_may_end.is_set() and watcher.waiting_for_lock()):
                await asyncio.sleep(0.01)
            deadline = time.monotonic() + 3 * lease
            while time.monotonic() < deadline and len(starts) == 1:
                time.sleep(0.02)  # CPU-bound work that never yields
            hog_done.set()
        return ctx.worker_id

    quick_job = await quick.submit()
    hog_job = await hog.submit()
    first = _WorkerThread(app, worker_id="A", concurrency=2, lease=lease)
    second: _WorkerThread | None = None
    try:
        await eventually(lambda: _true(lambda: starts == ["A"]))
        await eventually(lambda: _true(lambda: locker.status(quick_job.id) == "running"))
        locker.lock_row(quick_job.id)
        quick_may_end.set()
        # Another worker, free to rescue whatever lease worker A fails to renew.
        second = _WorkerThread(app, worker_id="B", lease=lease, rescue_interval=0.2)
        await eventually(lambda: _true(hog_done.is_set), timeout=30)
        locker.release()
        await settled(hog_job, timeout=30)
        await settled(quick_job, Status.SUCCEEDED, timeout=30)
    finally:
        quick_may_end.set()
        for worker in (first, second):
            if worker is not None:
                await worker.stop()
        locker.close()
        watcher.close()
    assert starts == ["A"], f"the hog ran on {starts}: its lease expired while it ran"
    assert hog_job.status is Status.SUCCEEDED and hog_job.result == "A"
    assert [a.outcome for a in await hog_job.attempts()] == [Outcome.SUCCEEDED]
    assert [a.outcome for a in await quick_job.attempts()] == [Outcome.SUCCEEDED]


# -- item 5: an abandoned sync handler keeps its thread, not a slot -----------------------


async def test_a_sync_handler_abandoned_past_its_cancel_grace_keeps_no_job_waiting(
    app: Conveyor,
) -> None:
    stuck = threading.Event()
    let_go = threading.Event()

    @app.job()
    def stubborn(ctx: JobContext) -> None:
        stuck.set()
        let_go.wait(60)  # ignores ctx.cancelled

    @app.job()
    def follower(ctx: JobContext) -> str:
        return "ran"

    first = await stubborn.submit()
    try:
        async with running_worker(app, concurrency=1, cancel_grace=0.2):
            await eventually(lambda: _true(stuck.is_set))
            await first.cancel()
            await settled(first, Status.CANCELLED)
            second = await follower.submit()
            # Its thread is still busy with the abandoned handler; the next job starts
            # anyway, on a thread of its own.
            await settled(second, Status.SUCCEEDED, timeout=15)
            assert not let_go.is_set()
    finally:
        let_go.set()
    assert second.result == "ran"


async def test_sync_handlers_reuse_idle_threads(app: Conveyor) -> None:
    names: list[str] = []

    @app.job()
    def record(ctx: JobContext) -> None:
        names.append(threading.current_thread().name)

    jobs = [await record.submit() for _ in range(20)]
    async with running_worker(app, concurrency=2):
        for job in jobs:
            await settled(job, Status.SUCCEEDED)
    assert len(names) == 20
    assert len(set(names)) < 10, f"a thread per job, not reused: {sorted(set(names))}"


# -- a claim whose result reaches a blocked event loop late --------------------------------


def _claimed_state(probe: _Probe, ids: list[str]) -> list[tuple[str, str | None, float | None]]:
    """(status, worker, lease expiry on the lease clock) of each job, read by the probe."""
    if probe.postgres:
        query = (
            "SELECT status, lease_owner, extract(epoch FROM lease_expires_at) "
            "FROM conveyor_jobs WHERE id = %s"
        )
    else:
        query = "SELECT status, lease_owner, lease_expires_at FROM conveyor_jobs WHERE id = ?"
    rows = []
    for job_id in ids:
        status, worker, expires = probe.conn.execute(query, (job_id,)).fetchone()
        rows.append((str(status), worker, None if expires is None else float(expires)))
    return rows


async def test_jobs_claimed_while_the_event_loop_is_blocked_are_renewed_and_kept(
    app: Conveyor, backend: str, db_url: str
) -> None:
    """A claim is in flight (waiting for a lock the test holds) when a handler blocks
    the worker's event loop for three leases; the claim commits during the block. Its
    jobs' leases must be renewed by the heartbeat during the block, not only once the
    loop comes back to the claim's result: else they expire, another worker rescues
    them as lost, and the worker then starts their handlers on the lost leases."""
    lease = 2.0
    block = threading.Event()  # the test asks the hog to block the loop
    blocking = threading.Event()  # the hog is blocking it
    hog_done = threading.Event()
    fillers_go = threading.Event()
    ran: list[tuple[str, int]] = []
    probe = _Probe(backend, db_url)
    watcher = _Probe(backend, db_url)  # outside the probe's transaction and its snapshot

    @app.job()
    async def hog(ctx: JobContext) -> None:
        while not block.is_set():
            await asyncio.sleep(0.01)
        blocking.set()
        time.sleep(3 * lease)  # CPU-bound work that never yields
        hog_done.set()

    @app.job()
    async def filler(ctx: JobContext) -> None:
        while not fillers_go.is_set():
            await asyncio.sleep(0.01)

    @app.job()
    async def other(ctx: JobContext) -> None:
        ran.append((ctx.id, ctx.attempt))

    hog_job = await hog.submit()
    fillers = [await filler.submit() for _ in range(3)]
    store = app.new_store()
    await store.open()
    worker = _WorkerThread(app, worker_id="A", concurrency=4, lease=lease, rescue_interval=60)
    rescued: list[str] = []
    seen: dict[str, list[float]] = {}
    try:
        # Four slots, all taken: the others below wait until the fillers end.
        for job in (hog_job, *fillers):

            async def running(job_id: str = job.id) -> bool:
                return probe.status(job_id) == "running"

            await eventually(running)
        ids = [f"other-{n}" for n in range(3)]
        await store.submit([NewJob(id=i, type="other", payload={}) for i in ids])
        probe.hold_write_lock()
        fillers_go.set()  # slots free: the worker's claim is sent and waits for the lock
        if probe.postgres:
            await eventually(lambda: _true(lambda: _claim_waits(watcher)))
        else:
            await asyncio.sleep(0.3)  # SQLite cannot tell: six poll intervals
        block.set()
        await eventually(lambda: _true(blocking.is_set))
        probe.release()  # the claim commits while the worker's loop is blocked
        while not hog_done.is_set():
            states = _claimed_state(probe, ids)
            for job_id, (status, owner, expires) in zip(ids, states, strict=True):
                if status == "running" and owner == "A" and expires is not None:
                    seen.setdefault(job_id, []).append(expires)
            # Another worker's rescuer, as the chaos suite runs one.
            rescued += [r.job_id for r in await store.rescue(limit=10, jitter=0.0)]
            await asyncio.sleep(0.05)
        for job_id in ids:
            await settled(await app.get(job_id), Status.SUCCEEDED, timeout=30)
    finally:
        block.set()
        fillers_go.set()
        await worker.stop()
        probe.close()
        watcher.close()
        await store.close()
    assert rescued == [], f"rescued from a live worker whose loop was blocked: {rescued}"
    assert sorted(seen) == ids, "the claim did not commit during the block"
    for job_id, expiries in seen.items():
        assert max(expiries) > min(expiries) + lease / 3, (
            f"{job_id}: its lease was not renewed while the worker's loop was blocked"
        )
    assert sorted(ran) == [(i, 1) for i in ids]


def _claim_waits(probe: _Probe) -> bool:
    """Whether a claim (PostgreSQL) waits for the probe's lock."""
    probe.conn.execute("SELECT pg_stat_clear_snapshot()")
    return bool(
        probe._one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE '%%attempt = attempt + 1%%'",
            "",
        )
    )


async def test_a_run_whose_lease_went_stale_before_its_handler_starts_is_not_started(
    app: Conveyor, backend: str, db_url: str
) -> None:
    """The loop reaches a claimed run after its lease may have expired (it was blocked,
    and nothing renewed the lease): the handler is not started, and the job is handed
    back (fenced: it is queued again at once, its attempt not spent). A run whose lease is
    older than lease/3 waits for a renewal first; with none, it is handed back the same
    way (dropped, it would sit "running" in its worker's name until rescued: three burst
    workers once all exited with 20 such jobs left running, never run)."""
    lease = 1.2
    started: list[str] = []

    @app.job()
    async def victim(ctx: JobContext) -> None:
        started.append(ctx.id)

    stale = await victim.submit()
    aging = await victim.submit()
    worker = app.worker(fast_options(lease=lease))
    store = worker._store = app.new_store()
    await store.open()
    try:
        (job,) = await store.claim(
            worker_id=worker.id,
            queues=app.registry.queues(),
            limit=1,
            lease=lease,
            on_claimed=lambda jobs: worker.leases.hold_claimed(jobs, time.monotonic() - lease),
        )
        worker._start_claimed()
        ((handed, back),) = worker._outbox  # the settle loop (not running here) sends it
        assert handed.done and handed.job.id == job.id and back.status is Status.QUEUED
        worker._outbox.clear()
        assert await store.settle([back]) == []
        worker.leases.release((handed,))
        (job2,) = await store.claim(
            worker_id=worker.id,
            queues=app.registry.queues(),
            limit=1,
            lease=lease,
            on_claimed=lambda jobs: worker.leases.hold_claimed(jobs, time.monotonic() - lease / 2),
        )
        worker._start_claimed()
        (run,) = worker.leases.snapshot()
        assert run.task is not None
        await asyncio.wait_for(run.task, 10)  # no heartbeat runs: no renewal comes
        ((handed2, back2),) = worker._outbox
        assert handed2 is run and run.done and back2.status is Status.QUEUED
        assert await store.settle([back2]) == []
        rows = {j.id: j for j in await store.get_many([stale.id, aging.id])}
    finally:
        await store.close()
    assert {job.id, job2.id} == {stale.id, aging.id}
    assert started == [], "a handler started on a lease it could not show was current"
    assert rows[job.id].status is Status.QUEUED and rows[job.id].attempt == 0, "handed back"
    assert rows[job2.id].status is Status.QUEUED and rows[job2.id].attempt == 0, "handed back"


async def test_jobs_of_a_claim_in_flight_when_the_worker_stops_are_handed_back_unstarted(
    app: Conveyor, backend: str, db_url: str
) -> None:
    filler_go = threading.Event()
    started: list[str] = []
    probe = _Probe(backend, db_url)

    @app.job()
    async def filler(ctx: JobContext) -> None:
        while not filler_go.is_set():
            await asyncio.sleep(0.01)

    @app.job()
    async def late(ctx: JobContext) -> None:
        started.append(ctx.id)

    first = await filler.submit()
    worker = _WorkerThread(app, concurrency=1)
    try:
        await eventually(lambda: _true(lambda: probe.status(first.id) == "running"))
        job = await late.submit()
        probe.hold_write_lock()
        filler_go.set()  # the slot frees: a claim is sent and waits for the lock
        if probe.postgres:
            await eventually(lambda: _true(lambda: _claim_waits(probe)))
        else:
            await asyncio.sleep(0.3)  # SQLite cannot tell: six poll intervals
        worker.worker.stop()
        probe.release()
    finally:
        filler_go.set()
        await worker.stop()
        probe.close()
    await job.refresh()
    assert started == [], "a stopping worker started a job it claimed as it stopped"
    assert job.status is Status.QUEUED and job.attempt == 0


async def test_a_handler_abandoned_at_shutdown_hands_its_job_back_for_when_its_lease_ends(
    app: Conveyor,
) -> None:
    """A stopping worker hands back the job of a handler that ignored cancellation, but
    that handler goes on running until the process exits: the job must not be started
    elsewhere meanwhile. It is queued without spending an attempt, runnable only once
    the lease the stopping worker held would have run out."""
    lease = 6.0
    stuck = threading.Event()
    let_go = threading.Event()

    @app.job()
    def stubborn(ctx: JobContext) -> None:
        stuck.set()
        let_go.wait(60)  # ignores ctx.cancelled

    job = await stubborn.submit()
    try:
        async with running_worker(app, lease=lease, grace=0.1, cancel_grace=0.2):
            await asyncio.get_running_loop().run_in_executor(None, stuck.wait, 20)
            stopping_at = time.time()
        stopped_at = time.time()
        # The worker has stopped (run() returned); the abandoned handler still runs.
        assert not let_go.is_set()
        await job.refresh()
        assert job.status is Status.QUEUED and job.attempt == 0, "handed back, no attempt spent"
        # Runnable once the last lease it held could have run out: that lease was renewed
        # at most lease/3 before the stop (a loaded machine's late heartbeat is allowed
        # another lease/3), and it ran out no later than a lease after the hand-back.
        run_at = job.record.run_at.timestamp()
        assert run_at - stopping_at >= lease / 3, run_at - stopping_at
        assert run_at - stopped_at <= lease, run_at - stopped_at
    finally:
        let_go.set()
    assert [a.outcome for a in await job.attempts()] == []


async def test_a_heartbeat_waiting_on_the_database_still_stops_runs_before_their_leases_end(
    app: Conveyor, backend: str, db_url: str
) -> None:
    """The heartbeat's thread also stops runs whose leases may run out. While its beat
    waits for the database (the write lock held by another process, as a busy machine's
    other workers can hold it for seconds on SQLite), it must go on doing so: a run still
    going when its lease runs out would go on beside the one that rescues its job."""
    lease = 3.0
    started = threading.Event()
    stopped: list[float] = []

    @app.job()
    async def long(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.append(time.monotonic())
            raise

    await long.submit()
    probe = _Probe(backend, db_url)
    try:
        async with running_worker(app, lease=lease, concurrency=1):
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 20)
            probe.hold_write_lock()
            held = time.monotonic()
            try:
                # Every renewal from now on waits for the lock: the run must be stopped
                # a margin before its last lease (renewed before the lock) runs out.
                await eventually(lambda: _true(lambda: stopped), timeout=2 * lease)
            finally:
                probe.release()
    finally:
        probe.close()
    assert stopped[0] - held < lease, "the run went on past its lease"


async def test_a_worker_cut_off_from_postgres_hands_back_runs_it_stopped_spending_no_attempt(
    postgres_database: str,
) -> None:
    """A worker cut off from the database (every connection through a proxy that passes
    nothing) for most of a lease must stop its run before the lease can end, by its own
    clock. Nothing says the job was taken from it, so once the network heals the job is
    handed back and runs again without spending an attempt; before, the stopped run's
    lease was left to expire and the job was rescued as a lost attempt."""
    from urllib.parse import urlsplit

    from chaos.netproxy import NetProxy

    lease = 3.0
    parts = urlsplit(postgres_database)
    proxy = await NetProxy((parts.hostname or "127.0.0.1", parts.port or 5432)).start()
    cut_off = Conveyor(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}").geturl())
    direct = Conveyor(postgres_database)
    starts: list[int] = []
    finish = asyncio.Event()

    async def steady(ctx: JobContext) -> None:
        starts.append(ctx.attempt)
        while not finish.is_set():
            await asyncio.sleep(0.02)

    for app in (cut_off, direct):
        app.job(name="steady")(steady)
    probe = _Probe("postgres", postgres_database)

    def lease_end() -> float:
        return float(
            probe._one("SELECT extract(epoch FROM lease_expires_at) FROM conveyor_jobs", "") or 0.0
        )

    try:
        job = await direct.submit("steady", {})
        async with running_worker(cut_off, lease=lease, concurrency=1):
            await eventually(lambda: _true(lambda: bool(starts)))
            # Cut right after a renewal: the worker must stop the run within the lease
            # it just got, and the database must still hold that lease at the heal.
            renewed = lease_end()
            await eventually(lambda: _true(lambda: lease_end() > renewed))
            proxy.blackhole()
            await asyncio.sleep(0.9 * lease)
            proxy.heal()
            await eventually(lambda: _true(lambda: len(starts) == 2), timeout=30)
            finish.set()
            await settled(job, Status.SUCCEEDED)
    finally:
        finish.set()
        probe.close()
        await cut_off.close()
        await direct.close()
        await proxy.close()
    assert [a.outcome for a in await job.attempts()] == [Outcome.SUCCEEDED]
    assert starts == [1, 1], "stopped once, handed back, ran again as the same attempt"
