"""The floor: the simplest durable job queue in raw SQL, to measure conveyor against.

A ``floor_jobs`` table (id, payload, status) with a partial index on the queued
rows.  Enqueue is a plain INSERT; a worker claims up to k queued rows with one
statement and marks them done with one more.  There are no retries, leases,
heartbeats or results, so whatever conveyor costs above these figures is the
price of its features.

Durability matches conveyor's defaults: SQLite in WAL mode with
``synchronous=FULL``; PostgreSQL as configured by the server (the report records
``fsync`` and ``synchronous_commit``, which should both be ``on``).

The SQL is written out once per backend, on purpose: it is the thing to read.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import multiprocessing.process
import multiprocessing.queues
import queue
import sqlite3
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.synchronize import Barrier

from psycopg_pool import AsyncConnectionPool

from bench.databases import sqlite_path

NOOP_PAYLOAD = '{"task": "noop", "args": [], "kwargs": {}}'

# How long the drain processes may take to connect and line up, and to finish.
_START_TIMEOUT = 60.0
_DRAIN_TIMEOUT = 600.0

# A drain worker returns (jobs completed, monotonic start, monotonic end).
DrainOutcome = tuple[int, float, float]


# --- SQLite -----------------------------------------------------------------

SQLITE_SCHEMA = """
CREATE TABLE floor_jobs (
    id      INTEGER PRIMARY KEY,
    payload TEXT NOT NULL,
    status  TEXT NOT NULL DEFAULT 'queued'
);
CREATE INDEX floor_jobs_queued ON floor_jobs (id) WHERE status = 'queued';
"""

SQLITE_INSERT = "INSERT INTO floor_jobs (payload) VALUES (?)"

SQLITE_CLAIM = """
UPDATE floor_jobs SET status = 'running'
WHERE id IN (
    SELECT id FROM floor_jobs
    WHERE status = 'queued'
    ORDER BY id
    LIMIT ?
)
RETURNING id, payload
"""

# The ids arrive as one JSON array so that the whole batch is a single statement.
SQLITE_COMPLETE = """
UPDATE floor_jobs SET status = 'done'
WHERE id IN (SELECT value FROM json_each(?))
"""

SQLITE_NOT_DONE = "SELECT count(*) FROM floor_jobs WHERE status <> 'done'"


def _sqlite_connect(url: str) -> sqlite3.Connection:
    """Open a connection in autocommit mode with conveyor's durability settings."""
    # isolation_level=None stops the sqlite3 module from opening transactions on
    # its own, so each transaction below is exactly the BEGIN ... COMMIT written.
    conn = sqlite3.connect(sqlite_path(url), isolation_level=None, timeout=60.0)
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()
    if mode is None or mode[0] != "wal":
        raise RuntimeError(f"could not switch SQLite to WAL mode (got {mode!r})")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def _sqlite_setup(url: str) -> None:
    """Create the floor schema in a new SQLite file."""
    conn = _sqlite_connect(url)
    try:
        conn.executescript(SQLITE_SCHEMA)
    finally:
        conn.close()


def _sqlite_enqueue_single(url: str, jobs: int) -> float:
    """Insert ``jobs`` rows, each its own statement and commit; return the seconds taken."""
    conn = _sqlite_connect(url)
    try:
        start = time.perf_counter()
        for _ in range(jobs):
            # In autocommit mode a lone INSERT is its own transaction: one fsync each.
            conn.execute(SQLITE_INSERT, (NOOP_PAYLOAD,))
        return time.perf_counter() - start
    finally:
        conn.close()


def _sqlite_enqueue_bulk(url: str, jobs: int, batch: int) -> float:
    """Insert ``jobs`` rows, ``batch`` per transaction; return the seconds taken."""
    conn = _sqlite_connect(url)
    try:
        start = time.perf_counter()
        for offset in range(0, jobs, batch):
            rows = [(NOOP_PAYLOAD,)] * min(batch, jobs - offset)
            # SQLite runs in-process, so executemany of one prepared INSERT costs no
            # round trips; the transaction, and so the fsync, is once per batch.
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(SQLITE_INSERT, rows)
            conn.execute("COMMIT")
        return time.perf_counter() - start
    finally:
        conn.close()


def _sqlite_prepare_drain(url: str) -> None:
    """Start the drain from an empty WAL so that every run begins alike."""
    conn = _sqlite_connect(url)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _sqlite_drain_worker(url: str, batch: int, ready: Callable[[], object]) -> DrainOutcome:
    """Claim and complete batches until none are queued."""
    conn = _sqlite_connect(url)
    try:
        ready()
        done = 0
        start = time.monotonic()
        while True:
            # IMMEDIATE takes the write lock up front, so a claim never fails
            # half-way on a lock upgrade; other writers wait in the busy handler.
            conn.execute("BEGIN IMMEDIATE")
            claimed = conn.execute(SQLITE_CLAIM, (batch,)).fetchall()
            conn.execute("COMMIT")
            if not claimed:
                break
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(SQLITE_COMPLETE, (json.dumps([row[0] for row in claimed]),))
            conn.execute("COMMIT")
            done += len(claimed)
        return done, start, time.monotonic()
    finally:
        conn.close()


def _sqlite_not_done(url: str) -> int:
    """Count the rows not marked done."""
    conn = _sqlite_connect(url)
    try:
        row = conn.execute(SQLITE_NOT_DONE).fetchone()
        return int(row[0])
    finally:
        conn.close()


# --- PostgreSQL -------------------------------------------------------------

POSTGRES_SCHEMA = """
CREATE TABLE floor_jobs (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    payload jsonb NOT NULL,
    status  text NOT NULL DEFAULT 'queued'
);
CREATE INDEX floor_jobs_queued ON floor_jobs (id) WHERE status = 'queued';
"""

POSTGRES_INSERT = "INSERT INTO floor_jobs (payload) VALUES (%s::jsonb)"

POSTGRES_INSERT_MANY = "INSERT INTO floor_jobs (payload) SELECT unnest(%s::jsonb[])"

# ANY(ARRAY(...)) rather than IN (...): with IN the planner may hash-join the
# 100 claimed ids against a sequential scan of the whole table (it does at
# 20,000 rows), which makes every claim cost as much as the table is long.  The
# array form always finds the rows through the primary key.
POSTGRES_CLAIM = """
UPDATE floor_jobs SET status = 'running'
WHERE id = ANY(ARRAY(
    SELECT id FROM floor_jobs
    WHERE status = 'queued'
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
))
RETURNING id, payload
"""

POSTGRES_COMPLETE = "UPDATE floor_jobs SET status = 'done' WHERE id = ANY(%s)"

POSTGRES_NOT_DONE = "SELECT count(*) FROM floor_jobs WHERE status <> 'done'"


def _postgres_pool(url: str) -> AsyncConnectionPool:
    """Return an unopened pool holding one autocommit connection."""
    # Autocommit makes every statement its own transaction in one round trip;
    # otherwise psycopg adds a BEGIN and a COMMIT around each of them.
    return AsyncConnectionPool(url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False)


async def _postgres_setup(url: str) -> None:
    """Create the floor schema in a new PostgreSQL database."""
    async with _postgres_pool(url) as pool, pool.connection() as conn:
        await conn.execute(POSTGRES_SCHEMA)


async def _postgres_enqueue_single(url: str, jobs: int) -> float:
    """Insert ``jobs`` rows, each its own statement and commit; return the seconds taken."""
    async with _postgres_pool(url) as pool:
        await pool.wait()
        start = time.perf_counter()
        for _ in range(jobs):
            async with pool.connection() as conn:
                await conn.execute(POSTGRES_INSERT, (NOOP_PAYLOAD,))
        return time.perf_counter() - start


async def _postgres_enqueue_bulk(url: str, jobs: int, batch: int) -> float:
    """Insert ``jobs`` rows, ``batch`` per statement and commit; return the seconds taken."""
    async with _postgres_pool(url) as pool:
        await pool.wait()
        start = time.perf_counter()
        for offset in range(0, jobs, batch):
            payloads = [NOOP_PAYLOAD] * min(batch, jobs - offset)
            async with pool.connection() as conn:
                await conn.execute(POSTGRES_INSERT_MANY, (payloads,))
        return time.perf_counter() - start


async def _postgres_prepare_drain(url: str) -> None:
    """Vacuum and analyze the freshly loaded table before timing the drain."""
    # VACUUM sets hint bits and the visibility map now rather than during the
    # first claims, and ANALYZE gives the planner real row counts.
    async with _postgres_pool(url) as pool, pool.connection() as conn:
        await conn.execute("VACUUM ANALYZE floor_jobs")


async def _postgres_drain_worker(url: str, batch: int, ready: Callable[[], object]) -> DrainOutcome:
    """Claim and complete batches until none are queued."""
    async with _postgres_pool(url) as pool:
        await pool.wait()
        ready()
        done = 0
        start = time.monotonic()
        while True:
            async with pool.connection() as conn:
                cursor = await conn.execute(POSTGRES_CLAIM, (batch,))
                claimed = await cursor.fetchall()
            if not claimed:
                break
            async with pool.connection() as conn:
                await conn.execute(POSTGRES_COMPLETE, ([row[0] for row in claimed],))
            done += len(claimed)
        return done, start, time.monotonic()


async def _postgres_not_done(url: str) -> int:
    """Count the rows not marked done."""
    async with _postgres_pool(url) as pool, pool.connection() as conn:
        cursor = await conn.execute(POSTGRES_NOT_DONE)
        row = await cursor.fetchone()
        return int(row[0]) if row else -1


# --- Entry points used by the workloads --------------------------------------


def enqueue_single(backend: str, url: str, jobs: int) -> float:
    """Time inserting ``jobs`` no-op jobs one statement and one commit each."""
    if backend == "sqlite":
        _sqlite_setup(url)
        return _sqlite_enqueue_single(url, jobs)
    asyncio.run(_postgres_setup(url))
    return asyncio.run(_postgres_enqueue_single(url, jobs))


def enqueue_bulk(backend: str, url: str, jobs: int, batch: int) -> float:
    """Time inserting ``jobs`` no-op jobs ``batch`` per transaction."""
    if backend == "sqlite":
        _sqlite_setup(url)
        return _sqlite_enqueue_bulk(url, jobs, batch)
    asyncio.run(_postgres_setup(url))
    return asyncio.run(_postgres_enqueue_bulk(url, jobs, batch))


def drain(backend: str, url: str, jobs: int, batch: int, processes: int) -> float:
    """Time ``processes`` workers draining ``jobs`` pre-inserted jobs, ``batch`` per claim.

    Each worker process holds one connection.  The time runs from the first
    worker's first claim to the last worker's last completion.
    """
    if backend == "sqlite":
        _sqlite_setup(url)
        _sqlite_enqueue_bulk(url, jobs, batch=1000)
        _sqlite_prepare_drain(url)
    else:
        asyncio.run(_postgres_setup(url))
        asyncio.run(_postgres_enqueue_bulk(url, jobs, batch=1000))
        asyncio.run(_postgres_prepare_drain(url))

    if processes == 1:
        outcomes = [_drain_worker(backend, url, batch, ready=lambda: None)]
    else:
        outcomes = _drain_in_processes(backend, url, batch, processes)

    completed = sum(done for done, _, _ in outcomes)
    if backend == "sqlite":
        not_done = _sqlite_not_done(url)
    else:
        not_done = asyncio.run(_postgres_not_done(url))
    if completed != jobs or not_done != 0:
        raise RuntimeError(
            f"drain lost jobs: {completed} of {jobs} completed, {not_done} rows not done"
        )
    return max(end for _, _, end in outcomes) - min(start for _, start, _ in outcomes)


def _drain_worker(backend: str, url: str, batch: int, ready: Callable[[], object]) -> DrainOutcome:
    """Run one drain worker of ``backend`` in this process."""
    if backend == "sqlite":
        return _sqlite_drain_worker(url, batch, ready)
    return asyncio.run(_postgres_drain_worker(url, batch, ready))


def _drain_process(
    backend: str,
    url: str,
    batch: int,
    barrier: Barrier,
    results: multiprocessing.queues.Queue[DrainOutcome | str],
) -> None:
    """Body of a drain process: report its outcome, or its traceback as a string."""
    try:
        results.put(_drain_worker(backend, url, batch, ready=lambda: barrier.wait(_START_TIMEOUT)))
    except BaseException:
        results.put(traceback.format_exc())


def _drain_in_processes(backend: str, url: str, batch: int, processes: int) -> list[DrainOutcome]:
    """Run ``processes`` drain workers in separate processes and collect their outcomes."""
    # Spawned children start clean: no inherited sockets, pools or event loops.
    context = multiprocessing.get_context("spawn")
    # The barrier lines the workers up once connected, so that connecting is not timed.
    barrier = context.Barrier(processes)
    results: multiprocessing.queues.Queue[DrainOutcome | str] = context.Queue()
    workers = [
        context.Process(
            target=_drain_process, args=(backend, url, batch, barrier, results), daemon=True
        )
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    try:
        return _collect(workers, results)
    finally:
        for worker in workers:
            worker.join(timeout=5.0)
            if worker.is_alive():
                worker.terminate()
                worker.join()


def _collect(
    workers: Sequence[multiprocessing.process.BaseProcess],
    results: multiprocessing.queues.Queue[DrainOutcome | str],
) -> list[DrainOutcome]:
    """Wait for one outcome per worker; fail fast if one reports an error or dies."""
    outcomes: list[DrainOutcome] = []
    deadline = time.monotonic() + _START_TIMEOUT + _DRAIN_TIMEOUT
    while len(outcomes) < len(workers):
        try:
            item = results.get(timeout=0.5)
        except queue.Empty:
            crashed = [worker.exitcode for worker in workers if worker.exitcode not in (None, 0)]
            if crashed:
                raise RuntimeError(f"a drain process exited with code {crashed[0]}") from None
            if time.monotonic() > deadline:
                raise TimeoutError("drain processes did not finish in time") from None
            continue
        if isinstance(item, str):
            raise RuntimeError(f"a drain process failed:\n{item}")
        outcomes.append(item)
    return outcomes
