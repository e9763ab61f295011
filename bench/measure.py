"""Conveyor's workloads: what each one sets up, runs and reads back.

Every workload gets a fresh database.  Jobs are submitted through the public
API (``Conveyor.submit`` / ``submit_many``) and run by real worker processes
(``python -m conveyor worker bench.app:app``).  Times come from the database
afterwards wherever possible: ``created_at``, ``started_at`` and ``finished_at``
of the jobs and ``started_at`` of the workers, all written by one clock
(``time.time()`` of the writing process on SQLite, the server's ``now()`` on
PostgreSQL).  A drain is timed from the first worker's registration, which
comes after its imports and its connection, to the last job settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.app import build
from bench.db import Db, connect
from bench.procs import PostgresCpu, SyscallCounter, WorkerProcess, Workers
from conveyor import Conveyor, Outcome, Status, Submission
from conveyor.core.model import Settlement
from conveyor.store import sqlite_path

Metrics = dict[str, float]

# Generous limits: a workload that takes longer than these has hung.
_START_TIMEOUT = 60.0
_RUN_TIMEOUT = 300.0
_POLL = 0.05


# --- Reading the database ------------------------------------------------------


def _epoch(backend: str, column: str) -> str:
    """SQL for a time column as seconds since the epoch (a float on both backends)."""
    return column if backend == "sqlite" else f"extract(epoch FROM {column})::float8"


def _mark(db: Db) -> str:
    """The driver's parameter placeholder."""
    return "?" if db.backend == "sqlite" else "%s"


def _time_mark(db: Db) -> str:
    """A parameter holding seconds since the epoch, as the backend stores times."""
    return "?" if db.backend == "sqlite" else "to_timestamp(%s)"


def _finished_times(db: Db, since: float = 0.0) -> list[float]:
    """When each succeeded job finished, in order, for jobs finished after ``since``."""
    column = _epoch(db.backend, "finished_at")
    rows = db.rows(
        f"SELECT {column} FROM conveyor_jobs "
        f"WHERE status = 'succeeded' AND finished_at >= {_time_mark(db)} ORDER BY finished_at",
        (since,),
    )
    return [float(row[0]) for row in rows]


def _count(db: Db, status: str, since: float = 0.0) -> int:
    """Jobs in ``status``; with ``since``, only those that finished after it."""
    mark = _mark(db)
    if not since:
        return int(db.value(f"SELECT count(*) FROM conveyor_jobs WHERE status = {mark}", (status,)))
    return int(
        db.value(
            f"SELECT count(*) FROM conveyor_jobs WHERE status = {mark} "
            f"AND finished_at >= {_time_mark(db)}",
            (status, since),
        )
    )


def _worker_started(db: Db, pid: int) -> float | None:
    """When the worker with this pid registered, or None if it has not yet."""
    mark = _mark(db)
    value = db.value(
        f"SELECT {_epoch(db.backend, 'started_at')} FROM conveyor_workers "
        f"WHERE pid = {mark} AND stopped_at IS NULL ORDER BY started_at DESC LIMIT 1",
        (pid,),
    )
    return None if value is None else float(value)


def _batches(db: Db, column: str) -> int:
    """How many statements wrote ``column``: rows one statement writes share its time."""
    return int(
        db.value(
            f"SELECT count(*) FROM (SELECT DISTINCT lease_owner, {column} FROM conveyor_jobs "
            f"WHERE status = 'succeeded' AND {column} IS NOT NULL) AS t"
        )
    )


def _prepare(db: Db) -> None:
    """Start timed work from a tidy database: vacuumed and analyzed, or checkpointed."""
    if db.backend == "sqlite":
        db.value("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        for table in ("conveyor_jobs", "conveyor_attempts"):
            db.script(f"VACUUM ANALYZE {table}")


def _wait_registered(
    db: Db, workers: Workers, started: Sequence[WorkerProcess]
) -> dict[int, tuple[float, float]]:
    """Wait until each worker registered; return its (registration time, CPU seconds then)."""
    seen: dict[int, tuple[float, float]] = {}
    deadline = time.monotonic() + _START_TIMEOUT
    while len(seen) < len(started):
        for worker in started:
            if worker.pid in seen:
                continue
            at = _worker_started(db, worker.pid)
            if at is not None:
                seen[worker.pid] = (at, worker.cpu_seconds())
        if len(seen) < len(started):
            workers.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError("workers did not register in time")
            time.sleep(0.005)
    return seen


def _wait_count(
    db: Db,
    workers: Workers,
    status: str,
    count: int,
    since: float = 0.0,
    poll: float = _POLL,
    at_most: bool = False,
) -> None:
    """Wait until at least (or ``at_most``: at most) ``count`` jobs are in ``status``."""
    deadline = time.monotonic() + _RUN_TIMEOUT
    while True:
        found = _count(db, status, since)
        if found <= count if at_most else found >= count:
            return
        workers.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{found} jobs {status}, not {count}, after {_RUN_TIMEOUT:.0f}s")
        time.sleep(poll)


def _percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _steady(finished: Sequence[float]) -> float:
    """Jobs per second between the 10% and the 90% marks of the finish times."""
    low = finished[len(finished) // 10]
    high = finished[(len(finished) * 9) // 10 - 1]
    jobs = (len(finished) * 9) // 10 - len(finished) // 10
    return jobs / (high - low) if high > low else math.inf


# --- Submitting ----------------------------------------------------------------


async def _open(url: str) -> Conveyor:
    """Build the benchmark app on ``url`` and open (and migrate) its store."""
    app = build(url)
    await app.store()
    return app


async def _submit_noops(url: str, jobs: int, batch: int = 1000) -> None:
    app = await _open(url)
    try:
        for offset in range(0, jobs, batch):
            await app.submit_many([Submission("noop", {})] * min(batch, jobs - offset))
    finally:
        await app.close()


def migrate(url: str) -> None:
    """Create conveyor's schema in the run's database."""

    async def run() -> None:
        app = await _open(url)
        await app.close()

    asyncio.run(run())


# --- enqueue -------------------------------------------------------------------


def enqueue_single(backend: str, url: str, jobs: int) -> Metrics:
    """Time ``jobs`` calls of ``await app.submit("noop", {})``, one job per call."""

    async def run() -> float:
        app = await _open(url)
        try:
            start = time.perf_counter()
            for _ in range(jobs):
                await app.submit("noop", {})
            return time.perf_counter() - start
        finally:
            await app.close()

    seconds = asyncio.run(run())
    _check_stored(backend, url, jobs)
    return {"jobs_per_s": jobs / seconds, "seconds": seconds}


def enqueue_bulk(backend: str, url: str, jobs: int, batch: int) -> Metrics:
    """Time submitting ``jobs`` with ``app.submit_many``, ``batch`` jobs per call."""

    async def run() -> float:
        app = await _open(url)
        try:
            start = time.perf_counter()
            for offset in range(0, jobs, batch):
                await app.submit_many([Submission("noop", {})] * min(batch, jobs - offset))
            return time.perf_counter() - start
        finally:
            await app.close()

    seconds = asyncio.run(run())
    _check_stored(backend, url, jobs)
    return {"jobs_per_s": jobs / seconds, "seconds": seconds}


def _check_stored(backend: str, url: str, jobs: int) -> None:
    with connect(backend, url) as db:
        stored = _count(db, "queued")
    if stored != jobs:
        raise RuntimeError(f"enqueue lost jobs: {stored} of {jobs} stored")


# --- drain ---------------------------------------------------------------------


def drain(
    backend: str,
    url: str,
    jobs: int,
    concurrency: int,
    processes: int,
    *,
    extra: Sequence[str] = (),
    env_extra: Mapping[str, str] | None = None,
) -> Metrics:
    """Time ``processes`` burst workers draining ``jobs`` pre-submitted no-op jobs.

    Reported: jobs/s from the first worker's registration to the last job settled;
    steady state between the 10% and 90% marks; the average number of jobs per
    claim and per settle statement; worker CPU per job (from registration to exit)
    and, on PostgreSQL, the server's CPU per job.
    """
    asyncio.run(_submit_noops(url, jobs))
    workers = Workers(url)
    with connect(backend, url) as db:
        _prepare(db)
        server = PostgresCpu(url) if backend == "postgres" else None
        try:
            started = [
                workers.start(concurrency=concurrency, burst=True, extra=extra, env_extra=env_extra)
                for _ in range(processes)
            ]
            registered = _wait_registered(db, workers, started)
            workers.wait_all(_RUN_TIMEOUT)
        finally:
            server_cpu = server.stop() if server is not None else None
            workers.close()
        finished = _finished_times(db)
        if len(finished) != jobs or _count(db, "queued") or _count(db, "running"):
            raise RuntimeError(f"drain lost jobs: {len(finished)} of {jobs} succeeded")
        start = min(at for at, _ in registered.values())
        seconds = finished[-1] - start
        worker_cpu = sum(w.cpu_seconds() - registered[w.pid][1] for w in started)
        metrics = {
            "jobs_per_s": jobs / seconds,
            "steady_jobs_per_s": _steady(finished),
            "seconds": seconds,
        }
        if db.backend == "sqlite":
            # PostgreSQL's claim stamps each row with its own clock_timestamp() (see the
            # claim query), so the rows of one claim share no time there to count them by.
            metrics["jobs_per_claim"] = jobs / _batches(db, "started_at")
        metrics["jobs_per_settle"] = jobs / _batches(db, "finished_at")
        metrics["worker_cpu_us_per_job"] = worker_cpu / jobs * 1e6
        if server_cpu is not None:
            metrics["server_cpu_us_per_job"] = server_cpu / jobs * 1e6
        return metrics


# --- what logs and metrics cost ---------------------------------------------------

# The two drains of a run alternate which goes first from run to run, so that neither
# always meets the fresher database.
_observed_runs = itertools.count()


def drain_observed(backend: str, url: str, jobs: int, concurrency: int) -> Metrics:
    """Two workers drain ``jobs`` no-ops each at the same time: one quiet, one observed.

    Quiet: ``--log-level WARNING --no-metrics`` (no per-attempt lines, no counters).
    Observed: ``--log-level INFO --metrics-port 0`` (one INFO line per job, to a file,
    and every counter and histogram). Both run at once, so that whatever else the
    machine does weighs on both alike (one after the other, a busy machine's swings
    swamped the difference): on PostgreSQL each on a queue of its own in the run's
    database, on SQLite each in a database file of its own (sharing one file's write
    lock, the slower worker would lose the lock more often than its share). Their
    queues are paused while they start, so that each worker's CPU time is read once it
    is idle and again once all its jobs succeeded; jobs/s runs from a queue's first job
    start to its last job's end. Which queue is resumed first alternates by run.
    """
    configs: dict[str, tuple[Sequence[str], Mapping[str, str]]] = {
        "quiet": (("--no-metrics",), {"CONVEYOR_LOG_LEVEL": "WARNING"}),
        "observed": (("--metrics-port", "0"), {"CONVEYOR_LOG_LEVEL": "INFO"}),
    }
    if os.environ.get("BENCH_OBSERVED_AS_QUIET"):  # an A/A run: the method's own noise
        configs["observed"] = configs["quiet"]
    names = list(configs)
    if next(_observed_runs) % 2:
        names.reverse()
    urls = {name: url for name in names}
    if backend == "sqlite":
        urls["observed"] = url.removesuffix(".db") + "-observed.db"
    for name in names:
        asyncio.run(_submit_to_paused_queue(urls[name], jobs, name))
    cpu: dict[str, float] = {}
    rates: dict[str, float] = {}
    try:
        runs = {name: Workers(urls[name]) for name in names}
        with contextlib.ExitStack() as stack:
            dbs = {name: stack.enter_context(connect(backend, urls[name])) for name in names}
            for name in names:
                stack.callback(runs[name].close)
            started = {}
            for name in names:
                _prepare(dbs[name])
                started[name] = runs[name].start(
                    concurrency=concurrency,
                    burst=False,
                    extra=(*configs[name][0], "--queues", name),
                    env_extra=configs[name][1],
                )
            for name in names:
                _wait_registered(dbs[name], runs[name], [started[name]])
            time.sleep(0.5)  # past their first (empty) claims: idle
            before = {name: w.cpu_seconds() for name, w in started.items()}
            asyncio.run(_resume_queues({name: urls[name] for name in names}))
            done = _wait_queues_done(dbs, runs, started, jobs)
            cpu = {name: done[name] - before[name] for name in names}
            for name in names:
                runs[name].stop_all()
            rates = {name: _queue_rate(dbs[name], name) for name in names}
    finally:
        if backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{sqlite_path(urls['observed'])}{suffix}").unlink(missing_ok=True)
    ratio = rates["observed"] / rates["quiet"]
    return {
        "quiet_jobs_per_s": rates["quiet"],
        "observed_jobs_per_s": rates["observed"],
        "observed_over_quiet": ratio,
        "loss_pct": (1 - ratio) * 100,
        # Worker CPU per job is steadier than wall-clock time on a busy machine.
        "quiet_cpu_us_per_job": cpu["quiet"] / jobs * 1e6,
        "observed_cpu_us_per_job": cpu["observed"] / jobs * 1e6,
        "cpu_observed_over_quiet": cpu["observed"] / cpu["quiet"],
    }


def _wait_queues_done(
    dbs: Mapping[str, Db],
    runs: Mapping[str, Workers],
    workers: Mapping[str, WorkerProcess],
    jobs: int,
) -> dict[str, float]:
    """Wait until every queue's ``jobs`` succeeded; return each worker's CPU seconds then.

    Queue by queue (both may be in one database), each worker's CPU time read as soon
    as its own queue is done, not once the other's is too (idle, it would still count).
    """
    cpu: dict[str, float] = {}
    deadline = time.monotonic() + _RUN_TIMEOUT
    while True:
        for queue, db in dbs.items():
            if queue in cpu:
                continue
            found = int(
                db.value(
                    "SELECT count(*) FROM conveyor_jobs "
                    f"WHERE queue = {_mark(db)} AND status = 'succeeded'",
                    (queue,),
                )
            )
            if found >= jobs:
                cpu[queue] = workers[queue].cpu_seconds()
        if len(cpu) == len(dbs):
            return cpu
        for queue in dbs:
            runs[queue].check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"queues {sorted(set(dbs) - set(cpu))} not drained in time")
        time.sleep(_POLL)


async def _submit_to_paused_queue(url: str, jobs: int, queue: str) -> None:
    app = await _open(url)
    try:
        await app.pause(queue)
        for offset in range(0, jobs, 1000):
            batch = min(1000, jobs - offset)
            await app.submit_many([Submission("noop", {}, queue=queue)] * batch)
    finally:
        await app.close()


async def _resume_queues(queues: Mapping[str, str]) -> None:
    """Resume each queue (its name: its database's URL) as nearly at once as can be.

    Every store is opened first: opened one after the other between the resumes (a
    PostgreSQL pool, on a busy machine), the first queue got a head start of a tenth
    of a second or more, and with it about 5% more jobs/s than the second.
    """
    apps: dict[str, Conveyor] = {}
    try:
        for queue, url in queues.items():
            apps[queue] = await _open(url)
        for queue, app in apps.items():
            await app.resume(queue)
    finally:
        for app in apps.values():
            await app.close()


def _queue_rate(db: Db, queue: str) -> float:
    """Jobs/s of one queue's drain: its jobs over first start to last end."""
    started, finished = _epoch(db.backend, "started_at"), _epoch(db.backend, "finished_at")
    row = db.rows(
        f"SELECT count(*), min({started}), max({finished}) FROM conveyor_jobs "
        f"WHERE queue = {_mark(db)} AND status = 'succeeded'",
        (queue,),
    )[0]
    return float(row[0]) / (float(row[2]) - float(row[1]))


# --- start-up --------------------------------------------------------------------


def startup(backend: str, url: str) -> Metrics:
    """Seconds from spawning ``conveyor worker`` to its first job's start; ``--help``'s time.

    One no-op job waits in a migrated database; the clock starts just before the
    worker process is spawned and stops at the job's ``started_at`` (the same
    machine's clock). ``help_s`` is a whole ``python -m conveyor --help`` run.
    """
    asyncio.run(_submit_noops(url, 1))
    workers = Workers(url)
    with connect(backend, url) as db:
        try:
            spawned = time.time()
            workers.start(concurrency=10, burst=True)
            workers.wait_all(_RUN_TIMEOUT)
        finally:
            workers.close()
        started = float(db.value(f"SELECT {_epoch(backend, 'started_at')} FROM conveyor_jobs"))
    before = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "conveyor", "--help"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return {"first_job_s": started - spawned, "help_s": time.perf_counter() - before}


# --- latency -------------------------------------------------------------------


def latency(backend: str, url: str, jobs: int, gap: float, concurrency: int) -> Metrics:
    """Submit ``jobs`` jobs ``gap`` seconds apart to an idle worker; enqueue→start in ms.

    The gap is kept on an absolute schedule, so a slow submit does not push the
    later ones back.  Latency is ``started_at - created_at`` of each job.
    """
    migrate(url)
    workers = Workers(url)
    with connect(backend, url) as db:
        try:
            worker = workers.start(concurrency=concurrency, burst=False)
            _wait_registered(db, workers, [worker])
            time.sleep(0.5)  # let it make its first (empty) claim and go idle

            async def submit() -> None:
                app = await _open(url)
                try:
                    start = time.monotonic()
                    for number in range(jobs):
                        delay = start + number * gap - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await app.submit("noop", {})
                finally:
                    await app.close()

            asyncio.run(submit())
            _wait_count(db, workers, "succeeded", jobs)
            workers.stop_all()
        finally:
            workers.close()
        started, created = _epoch(backend, "started_at"), _epoch(backend, "created_at")
        rows = db.rows(f"SELECT ({started} - {created}) * 1000 FROM conveyor_jobs")
    waits = [float(row[0]) for row in rows]
    return {
        "p50_ms": _percentile(waits, 50),
        "p95_ms": _percentile(waits, 95),
        "p99_ms": _percentile(waits, 99),
        "max_ms": max(waits),
    }


# --- scale ---------------------------------------------------------------------

# Rows loaded straight into conveyor's tables, in bulk: queued no-op jobs due since
# an hour ago, and jobs that succeeded hours ago with their attempt.  Only columns
# without a default are given; the rest keep the schema's defaults. On SQLite the table's
# key is the creation microsecond, each job's own: a load's jobs are a millisecond apart
# from its start, or from after the last job the table holds.
_SQLITE_LOAD_QUEUED = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows),
first(us) AS (
    SELECT max(CAST(round(:start * 1000000) AS INTEGER), coalesce(max(created_us), 0) + 1)
    FROM conveyor_jobs
)
INSERT INTO conveyor_jobs (
    id, type, queue, payload, status, max_attempts, run_at, backoff_base, backoff_cap,
    created_us, created_at
)
SELECT printf('%s%012d', :prefix, i), 'noop', 'default', '{}', 'queued', 3,
       :start + i * 0.001, 1.0, 3600.0, us + i * 1000, (us + i * 1000) / 1000000.0
FROM n, first
"""

_SQLITE_LOAD_FINISHED = """
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :rows),
first(us) AS (
    SELECT max(CAST(round(:start * 1000000) AS INTEGER), coalesce(max(created_us), 0) + 1)
    FROM conveyor_jobs
)
INSERT INTO conveyor_jobs (
    id, type, queue, payload, status, attempt, max_attempts, run_at, backoff_base,
    backoff_cap, created_us, created_at, started_at, finished_at, lease_owner, lease_token
)
SELECT printf('%s%012d', :prefix, i), 'noop', 'default', '{}', 'succeeded', 1, 3,
       :start + i * 0.001, 1.0, 3600.0, us + i * 1000, (us + i * 1000) / 1000000.0,
       :start + i * 0.001, :start + i * 0.001 + 0.001, 'bench-loader', 1
FROM n, first
"""

_SQLITE_LOAD_ATTEMPTS = """
INSERT INTO conveyor_attempts (job_id, number, worker_id, started_at, finished_at, outcome)
SELECT id, 1, lease_owner, started_at, finished_at, 'succeeded'
FROM conveyor_jobs WHERE id >= ? AND id < ?
"""

_POSTGRES_LOAD_QUEUED = """
INSERT INTO conveyor_jobs (
    id, type, queue, payload, status, max_attempts, run_at, backoff_base, backoff_cap,
    created_at
)
SELECT %s || lpad(i::text, 12, '0'), 'noop', 'default', '{}', 'queued', 3,
       to_timestamp(%s + i * 0.001), 1.0, 3600.0, to_timestamp(%s + i * 0.001)
FROM generate_series(1, %s) AS i
"""

_POSTGRES_LOAD_FINISHED = """
INSERT INTO conveyor_jobs (
    id, type, queue, payload, status, attempt, max_attempts, run_at, backoff_base,
    backoff_cap, created_at, started_at, finished_at, lease_owner, lease_token
)
SELECT %s || lpad(i::text, 12, '0'), 'noop', 'default', '{}', 'succeeded', 1, 3,
       to_timestamp(%s + i * 0.001), 1.0, 3600.0, to_timestamp(%s + i * 0.001),
       to_timestamp(%s + i * 0.001), to_timestamp(%s + i * 0.001 + 0.001), 'bench-loader', 1
FROM generate_series(1, %s) AS i
"""

_POSTGRES_LOAD_ATTEMPTS = """
INSERT INTO conveyor_attempts (job_id, number, worker_id, started_at, finished_at, outcome)
SELECT id, 1, lease_owner, started_at, finished_at, 'succeeded'
FROM conveyor_jobs WHERE id >= %s AND id < %s
"""


def _load(db: Db, *, prefix: str, queued: int, finished: int) -> None:
    """Bulk-load ``queued`` due jobs and ``finished`` succeeded jobs with their attempts."""
    # Finished jobs end within the last hours, inside the default retention (a day
    # for succeeded jobs), so that the workers' pruning duty leaves them alone.
    now = time.time()
    due, done = now - 3600.0, now - 3 * 3600.0 - finished * 0.002
    if db.backend == "sqlite":
        # One transaction per table: a commit per row would take hours.
        if queued:
            db.rows("BEGIN IMMEDIATE")
            db.rows(_SQLITE_LOAD_QUEUED, {"rows": queued, "prefix": f"{prefix}q", "start": due})
            db.rows("COMMIT")
        if finished:
            db.rows("BEGIN IMMEDIATE")
            load = {"rows": finished, "prefix": f"{prefix}f", "start": done}
            db.rows(_SQLITE_LOAD_FINISHED, load)
            db.rows(_SQLITE_LOAD_ATTEMPTS, (f"{prefix}f", f"{prefix}g"))
            db.rows("COMMIT")
        return
    if queued:
        db.rows(_POSTGRES_LOAD_QUEUED, (f"{prefix}q", due, due, queued))
    if finished:
        db.rows(_POSTGRES_LOAD_FINISHED, (f"{prefix}f", done, done, done, done, finished))
        db.rows(_POSTGRES_LOAD_ATTEMPTS, (f"{prefix}f", f"{prefix}g"))


@dataclass(frozen=True)
class _Claims:
    """Claim and settle latency, in ms, measured on the store a worker uses."""

    claim_1: float
    claim_batch: float
    settle_batch: float


async def _time_claims(url: str, rounds: int, batch: int) -> _Claims:
    """Time ``rounds`` claims of 1 job and of ``batch`` jobs, each followed by its settle.

    The claims are the ones a worker makes, on the store it makes them with; the
    benchmark process plays the worker so that nothing else runs meanwhile.
    """
    app = await _open(url)
    store = await app.store()
    one: list[float] = []
    many: list[float] = []
    settles: list[float] = []
    try:
        for _ in range(rounds):
            for limit, times in ((1, one), (batch, many)):
                start = time.perf_counter()
                claimed = await store.claim(
                    worker_id="bench-claimer",
                    queues=["default"],
                    types=app.registry.names(),
                    limit=limit,
                    lease=30.0,
                )
                times.append((time.perf_counter() - start) * 1000)
                if len(claimed) != limit:
                    raise RuntimeError(f"claimed {len(claimed)} jobs, expected {limit}")
                settlements = [
                    Settlement(
                        job_id=job.id,
                        token=job.lease_token,
                        status=Status.SUCCEEDED,
                        outcome=Outcome.SUCCEEDED,
                    )
                    for job in claimed
                ]
                start = time.perf_counter()
                refused = await store.settle(settlements)
                if limit == batch:
                    settles.append((time.perf_counter() - start) * 1000)
                if refused:
                    raise RuntimeError(f"settle refused {len(refused)} jobs")
    finally:
        await app.close()
    return _Claims(statistics.median(one), statistics.median(many), statistics.median(settles))


def _drain_from_backlog(db: Db, url: str, jobs: int, concurrency: int) -> tuple[float, float]:
    """Run one worker until ``jobs`` more jobs succeeded; return (jobs/s, steady jobs/s).

    The queue is paused before the worker is stopped, and resumed once it has
    exited: a SIGTERM that arrives while a claim is in flight can leave a worker
    unable to exit (see docs/performance.md), and a paused queue has no claims.
    """
    workers = Workers(url)
    since = time.time()
    try:
        worker = workers.start(concurrency=concurrency, burst=False)
        registered = _wait_registered(db, workers, [worker])
        _wait_count(db, workers, "succeeded", jobs, since=since, poll=0.2)
        asyncio.run(_set_paused(url, True))
        _wait_count(db, workers, "running", 0, at_most=True)
        workers.stop_all()
    finally:
        workers.close()
        asyncio.run(_set_paused(url, False))
    start = registered[worker.pid][0]
    finished = _finished_times(db, since)[:jobs]
    return jobs / (finished[-1] - start), _steady(finished)


async def _set_paused(url: str, paused: bool) -> None:
    app = await _open(url)
    try:
        await (app.pause("default") if paused else app.resume("default"))
    finally:
        await app.close()


def scale(
    backend: str,
    url: str,
    *,
    queued: int,
    finished: int,
    jobs: int,
    concurrency: int,
    claim_rounds: int,
) -> Metrics:
    """Claim latency and drain rate on a small table, then with a large backlog and history.

    Both halves run in the same database, one after the other: first with only the
    jobs to drain queued, then after loading ``queued`` more queued jobs and
    ``finished`` succeeded ones (with their attempts).  The drain is the first
    ``jobs`` jobs a worker finishes.
    """
    migrate(url)
    needed = jobs + claim_rounds * (1 + concurrency)
    metrics: Metrics = {}
    with connect(backend, url) as db:
        for phase, extra_queued, extra_finished in (
            ("empty", needed, 0),
            ("loaded", queued, finished),
        ):
            _load(db, prefix=phase[0], queued=extra_queued, finished=extra_finished)
            _prepare(db)
            claims = asyncio.run(_time_claims(url, claim_rounds, concurrency))
            rate, steady = _drain_from_backlog(db, url, jobs, concurrency)
            metrics[f"claim_1_ms_{phase}"] = claims.claim_1
            metrics[f"claim_{concurrency}_ms_{phase}"] = claims.claim_batch
            metrics[f"settle_{concurrency}_ms_{phase}"] = claims.settle_batch
            metrics[f"jobs_per_s_{phase}"] = rate
            metrics[f"steady_jobs_per_s_{phase}"] = steady
        total = int(db.value("SELECT count(*) FROM conveyor_jobs"))
    metrics["rows_loaded"] = float(total)
    metrics["drain_loaded_vs_empty"] = metrics["jobs_per_s_loaded"] / metrics["jobs_per_s_empty"]
    metrics["claim_1_loaded_vs_empty"] = metrics["claim_1_ms_loaded"] / metrics["claim_1_ms_empty"]
    return metrics


# --- overhead ------------------------------------------------------------------


def heartbeat(backend: str, url: str, *, running: int, window: float, lease: float) -> Metrics:
    """A worker holding ``running`` sleeping async jobs: its CPU, memory and database traffic.

    Two windows of ``window`` seconds once every job runs: the first measures the
    worker's CPU and resident memory, the second counts its system calls with
    strace (statements sent on PostgreSQL, WAL syncs on SQLite).  ``lease`` is
    short so that several heartbeats (every lease/3) fall in each window.
    """
    migrate(url)
    workers = Workers(url)
    with connect(backend, url) as db:
        try:
            worker = workers.start(
                concurrency=running, burst=False, extra=["--lease", str(lease), "--grace", "0"]
            )
            _wait_registered(db, workers, [worker])
            idle_rss = worker.rss_mb()

            async def submit() -> None:
                app = await _open(url)
                try:
                    await app.submit_many([Submission("sleep", {"seconds": 3600.0})] * running)
                finally:
                    await app.close()

            asyncio.run(submit())
            _wait_count(db, workers, "running", running)
            time.sleep(1.0)
            cpu = worker.cpu_seconds()
            time.sleep(window)
            cpu = worker.cpu_seconds() - cpu
            rss = worker.rss_mb()
            counts: dict[str, int] | None = None
            if SyscallCounter.available():
                counter = SyscallCounter(worker.pid)
                time.sleep(window)
                counts = counter.stop()
            workers.stop_all()
        finally:
            workers.close()
    metrics = {
        "worker_cpu_pct": cpu / window * 100,
        "rss_mb": rss,
        "idle_rss_mb": idle_rss,
    }
    if counts is not None:
        if backend == "postgres":
            metrics["statements_per_s"] = counts["sendto"] / window
        else:
            metrics["commits_per_s"] = (counts["fsync"] + counts["fdatasync"]) / window
    return metrics


_SQLITE_COUNT_PROGRESS = """
CREATE TABLE bench_progress_writes (at REAL NOT NULL);
CREATE TRIGGER bench_progress_written AFTER UPDATE OF progress_done ON conveyor_jobs
WHEN NEW.progress_done IS NOT OLD.progress_done
BEGIN
    INSERT INTO bench_progress_writes (at) VALUES (julianday('now'));
END;
"""

_POSTGRES_COUNT_PROGRESS = """
CREATE TABLE bench_progress_writes (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION bench_progress_written() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO bench_progress_writes DEFAULT VALUES;
    RETURN NULL;
END
$$;
CREATE TRIGGER bench_progress_written AFTER UPDATE OF progress_done ON conveyor_jobs
FOR EACH ROW WHEN (NEW.progress_done IS DISTINCT FROM OLD.progress_done)
EXECUTE FUNCTION bench_progress_written();
"""


def progress(backend: str, url: str, *, calls: int, pauses: int, pause: float) -> Metrics:
    """One handler calling ``ctx.progress`` ``calls`` times over ``pauses`` short sleeps.

    A trigger the benchmark adds to its copy of the schema counts the writes that
    change the stored progress (heartbeats and the final settle).
    """
    migrate(url)
    with connect(backend, url) as db:
        db.script(_SQLITE_COUNT_PROGRESS if backend == "sqlite" else _POSTGRES_COUNT_PROGRESS)

        async def submit() -> str:
            app = await _open(url)
            try:
                payload = {"calls": calls, "pauses": pauses, "pause": pause}
                return (await app.submit("progress", payload)).id
            finally:
                await app.close()

        job_id = asyncio.run(submit())
        workers = Workers(url)
        try:
            workers.start(concurrency=10, burst=True)
            workers.wait_all(_RUN_TIMEOUT)
        finally:
            workers.close()
        writes = int(db.value("SELECT count(*) FROM bench_progress_writes"))

        async def result() -> dict[str, float]:
            app = await _open(url)
            try:
                job = await app.get(job_id)
            finally:
                await app.close()
            if job.status is not Status.SUCCEEDED or not isinstance(job.result, dict):
                raise RuntimeError(f"progress job ended {job.status.value}: {job.error}")
            return {k: float(v) for k, v in job.result.items() if isinstance(v, int | float)}

        timings = asyncio.run(result())
    return {
        "call_us": timings["in_calls_s"] / calls * 1e6,
        "handler_s": timings["handler_s"],
        "progress_writes": float(writes),
    }


def tree(backend: str, url: str, *, children: int, concurrency: int) -> Metrics:
    """A job spawning ``children`` no-op children in one write, run until the tree ends."""
    migrate(url)

    async def submit() -> str:
        app = await _open(url)
        try:
            return (await app.submit("tree", {"children": children})).id
        finally:
            await app.close()

    root = asyncio.run(submit())
    workers = Workers(url)
    with connect(backend, url) as db:
        try:
            worker = workers.start(concurrency=concurrency, burst=True)
            registered = _wait_registered(db, workers, [worker])
            workers.wait_all(_RUN_TIMEOUT)
        finally:
            workers.close()
        mark = _mark(db)
        finished = db.rows(
            f"SELECT status, {_epoch(backend, 'finished_at')} FROM conveyor_jobs WHERE id = {mark}",
            (root,),
        )
        done = int(
            db.value(
                f"SELECT count(*) FROM conveyor_jobs WHERE parent_id = {mark} "
                "AND status = 'succeeded'",
                (root,),
            )
        )

        async def result() -> float:
            app = await _open(url)
            try:
                job = await app.get(root)
            finally:
                await app.close()
            value = job.result.get("spawn_s") if isinstance(job.result, dict) else None
            return float(value) if isinstance(value, int | float) else math.nan

        spawn_s = asyncio.run(result())
    if not finished or finished[0][0] != "succeeded" or done != children:
        raise RuntimeError(f"tree did not succeed: root {finished}, {done} children succeeded")
    seconds = float(finished[0][1]) - registered[worker.pid][0]
    return {
        "jobs_per_s": (children + 1) / seconds,
        "seconds": seconds,
        "spawn_s": spawn_s,
    }
