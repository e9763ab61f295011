"""The fan-out workload (issue #12): a root with N children drains as fast as N
independent jobs, while reading the root's counts stays cheap and consistent.

One run, one database, two drains by the same burst workers: N independent no-op jobs,
and one root whose N no-op children are spawned (in one write, fenced by the root's
lease) before the workers start, so that neither drain times a submit. Each rate is N
over the time from the first start to the last finish of its jobs, as the database
recorded them. The order of the two drains alternates from run to run.

While the tree drains, a thread reads the root as ``app.get`` does (the job row with
the counts of the jobs below it) every ``read_gap`` seconds and times each read; every
read must add up (the statuses sum to the total, which is N). It also reads one of the
children (a job with nothing below it) right after, as a baseline: on a loaded machine
the difference between the two is what the counts cost. On PostgreSQL it then has the
server run the root's read once more under EXPLAIN ANALYZE (on a connection of its own)
and records the statement's execution time: what the read costs the database, without
the time the reading process waited for a CPU of a machine the drain keeps busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import re
import statistics
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace

from bench.db import Db, connect
from bench.measure import (
    _RUN_TIMEOUT,
    Metrics,
    _epoch,
    _mark,
    _open,
    _percentile,
    _prepare,
    _submit_noops,
    _wait_registered,
    migrate,
)
from bench.procs import Workers
from conveyor import Conveyor, Outcome, Status, Submission
from conveyor.core.model import Settlement
from conveyor.store import Lease

_runs = itertools.count()
ROOT = "fanout-root"


async def _make_tree(url: str, children: int) -> None:
    """Submit the root, claim it, spawn its children, and let its handler return."""
    app = await _open(url)
    try:
        store = await app.store()
        (job,) = app.prepare([_submission("roots")])
        await store.submit([replace(job, id=ROOT)])
        (root,) = await store.claim(
            worker_id="bench", queues=["roots"], types=app.registry.names(), limit=1, lease=600
        )
        noop = app.prepare([_submission("default")])[0]
        batch = [replace(noop, id=f"{ROOT}.{n}") for n in range(children)]
        if await store.spawn(Lease(ROOT, root.lease_token), batch) is None:
            raise RuntimeError("the root's lease was lost while spawning")
        returned = Settlement(ROOT, root.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED)
        await store.settle([returned])
        if (await app.get(ROOT)).status is not Status.WAITING:
            raise RuntimeError("the root does not wait for its children")
    finally:
        await app.close()


def _submission(queue: str) -> Submission:
    return Submission("noop", {}, queue=queue)


def _rate(db: Db, where: str, params: tuple[object, ...]) -> tuple[float, int]:
    """(jobs/s, jobs) of the succeeded jobs ``where`` selects: first start to last finish."""
    started, finished = _epoch(db.backend, "started_at"), _epoch(db.backend, "finished_at")
    (first, last, n) = db.rows(
        f"SELECT min({started}), max({finished}), count(*) FROM conveyor_jobs "
        f"WHERE status = 'succeeded' AND {where}",
        params,
    )[0]
    return int(n) / (float(last) - float(first)), int(n)


def _drain(backend: str, url: str, processes: int, concurrency: int, placing: _Placing) -> None:
    workers = Workers(url)
    with connect(backend, url) as db:
        _prepare(db)
        renicer = _Renicer(url, placing) if placing.active and backend == "postgres" else None
        try:
            if renicer is not None:
                renicer.start()
            started = [
                workers.start(concurrency=concurrency, burst=True, prefix=placing.prefix)
                for _ in range(processes)
            ]
            _wait_registered(db, workers, started)
            workers.wait_all(_RUN_TIMEOUT)
        finally:
            workers.close()
            if renicer is not None:
                renicer.stop.set()
                renicer.join()


READER = "fanout-reader"  # the application_name of the reader's connections


def _as_reader(url: str) -> str:
    """The URL with the reader's application_name (PostgreSQL), to tell its server
    processes from the workers'."""
    if not url.startswith("postgres"):
        return url
    return f"{url}{'&' if '?' in url else '?'}application_name={READER}"


@dataclass(frozen=True)
class _Placing:
    """Where the drain's processes run beside the reader's, from the environment.

    The reader's times without the wait for a CPU that busy workers on two cores impose
    on any read (as when the reader, a dashboard or an API, has a core of its own):

    - ``BENCH_FANOUT_NICE=N``: the workers run under ``nice -n N``, and on PostgreSQL the
      server processes serving them are reniced too;
    - ``BENCH_FANOUT_IDLE=1``: the workers and their server processes run under
      SCHED_IDLE, so a read takes a CPU from them at once (nice only weighs their share);
    - ``BENCH_FANOUT_SPLIT=1``: the workers and their server processes run on CPU 1 only,
      the reader's thread and its server processes on CPU 0 only. (Moving the server's
      own processes, the WAL writer's and others, to CPU 1 as well made the reads' tails
      longer, not shorter: their locks were then held by processes waiting for CPU 1.)
    """

    prefix: tuple[str, ...] = ()
    demote: Callable[[int], None] | None = None  # a worker's server process
    promote: Callable[[int], None] | None = None  # the reader's (and its thread: 0)

    @property
    def active(self) -> bool:
        return self.demote is not None or self.promote is not None

    @classmethod
    def from_environment(cls) -> _Placing:
        if os.environ.get("BENCH_FANOUT_SPLIT") == "1":
            return cls(
                ("taskset", "-c", "1"),
                lambda pid: os.sched_setaffinity(pid, {1}),
                lambda pid: os.sched_setaffinity(pid, {0}),
            )
        if os.environ.get("BENCH_FANOUT_IDLE") == "1":
            return cls(
                ("chrt", "--idle", "0"),
                lambda pid: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)),
            )
        if nice := os.environ.get("BENCH_FANOUT_NICE"):
            return cls(
                ("nice", "-n", nice),
                lambda pid: os.setpriority(os.PRIO_PROCESS, pid, int(nice)),
            )
        return cls()


class _Renicer(threading.Thread):
    """Places the server processes of the workers' connections and of the reader's as
    ``placing`` says, every 0.2 s (the workers open connections as they go)."""

    def __init__(self, url: str, placing: _Placing) -> None:
        super().__init__(name="fanout-renicer", daemon=True)
        self.url, self.placing = url, placing
        self.stop = threading.Event()
        self.placed: set[int] = set()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            mine = conn.info.backend_pid
            while not self.stop.wait(0.2):
                rows = conn.execute(
                    "SELECT pid, application_name = %s FROM pg_stat_activity "
                    "WHERE datname = current_database() AND backend_type = 'client backend'",
                    (READER,),
                ).fetchall()
                for pid, reader in rows:
                    place = self.placing.promote if reader else self.placing.demote
                    if pid == mine or pid in self.placed or place is None:
                        continue
                    try:
                        place(pid)
                    except (PermissionError, ProcessLookupError):
                        continue
                    self.placed.add(pid)


class _Collections:
    """The time this process has spent collecting garbage (a gc callback)."""

    def __init__(self) -> None:
        self.ms = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.ms += (time.perf_counter() - self._started) * 1000


class _Reader(threading.Thread):
    """Reads the root every ``gap`` seconds until it ends; times each read."""

    def __init__(self, url: str, total: int, gap: float, placing: _Placing) -> None:
        super().__init__(name="fanout-reader", daemon=True)
        self.url, self.total, self.gap, self.placing = url, total, gap, placing
        self.ms: list[float] = []
        self.plain_ms: list[float] = []
        self.server_ms: list[float] = []
        self.bare_ms: list[float] = []
        self.inconsistent = 0
        self.slow = 0  # root reads over 5 ms
        self.slow_in_gc = 0  # those during which Python collected garbage (any thread)
        self.gc = _Collections()
        self.failure: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        promote = self.placing.promote
        if promote is not None:
            promote(0)  # this thread
        gc.callbacks.append(self.gc)
        try:
            asyncio.run(self._read())
        except BaseException as exc:  # reported by the workload, not lost in the thread
            self.failure = exc
        finally:
            gc.callbacks.remove(self.gc)

    async def _read(self) -> None:
        app = await _open(_as_reader(self.url))
        try:
            async with _explainer(self.url) as explain:
                await self._poll(app, explain)
        finally:
            await app.close()

    async def _poll(
        self, app: Conveyor, explain: Callable[[], Awaitable[tuple[float, float]]] | None
    ) -> None:
        for turn in itertools.count():
            if self.stop.is_set():
                return
            # Every other turn the plain read goes first: the first read after the sleep
            # pays the wake-up of an idle connection and thread, which is not the root's.
            if turn % 2:
                await self._read_plain(app)
            before, collected = time.perf_counter(), self.gc.ms
            root = await app.get(ROOT)
            took = (time.perf_counter() - before) * 1000
            self.ms.append(took)
            if took > 5.0:
                self.slow += 1
                self.slow_in_gc += self.gc.ms > collected
            below = root.below
            if (
                below is None
                or sum(below.by_status().values()) != below.total
                or below.total != self.total
            ):
                self.inconsistent += 1
            if root.terminal:
                return
            if not turn % 2:
                await self._read_plain(app)
            if explain is not None:
                server_ms, bare_ms = await explain()
                self.server_ms.append(server_ms)
                self.bare_ms.append(bare_ms)
            await asyncio.sleep(self.gap)

    async def _read_plain(self, app: Conveyor) -> None:
        before = time.perf_counter()
        await app.get(f"{ROOT}.0")
        self.plain_ms.append((time.perf_counter() - before) * 1000)


@contextlib.asynccontextmanager
async def _explainer(
    url: str,
) -> AsyncIterator[Callable[[], Awaitable[tuple[float, float]]] | None]:
    """On PostgreSQL, a function that runs the root's read bare and under EXPLAIN ANALYZE
    and returns the server's execution time and the bare read's, in ms; elsewhere None."""
    if not url.startswith("postgres"):
        yield None
        return
    import psycopg

    from conveyor.store.postgres._codec import Q

    query = "EXPLAIN (ANALYZE, TIMING OFF) " + Q["get_with_counts"]
    params = {"id": ROOT, "now": None}

    async def explain() -> tuple[float, float]:
        # First the bare statement, prepared, as the client sees it without conveyor
        # around it (no pool, no thread, no Job decoded): the read's floor on this
        # machine at this moment. Then its execution time inside the server.
        before = time.perf_counter()
        await (await conn.execute(Q["get_with_counts"], params, prepare=True)).fetchall()
        bare_ms = (time.perf_counter() - before) * 1000
        rows = await (await conn.execute(query, params)).fetchall()
        found = re.search(r"Execution Time: ([0-9.]+) ms", "\n".join(r[0] for r in rows))
        if found is None:
            raise RuntimeError("EXPLAIN ANALYZE gave no execution time")
        return float(found.group(1)), bare_ms

    async with await psycopg.AsyncConnection.connect(_as_reader(url), autocommit=True) as conn:
        yield explain


def fanout(
    backend: str, url: str, *, jobs: int, concurrency: int, processes: int, read_gap: float
) -> Metrics:
    """Drain ``jobs`` independent jobs and a root with ``jobs`` children; their rates and
    the time to read the root's counts during the tree's drain."""
    migrate(url)
    tree_first = next(_runs) % 2 == 1
    placing = _Placing.from_environment()
    reader = _Reader(url, jobs, read_gap, placing)
    for part in ("tree", "flat") if tree_first else ("flat", "tree"):
        if part == "tree":
            asyncio.run(_make_tree(url, jobs))
            reader.start()
        else:
            asyncio.run(_submit_noops(url, jobs))
        _drain(backend, url, processes, concurrency, placing)
        if part == "tree":
            reader.join(_RUN_TIMEOUT)
            reader.stop.set()
    if reader.failure is not None:
        raise RuntimeError(f"the reader failed: {reader.failure!r}")
    with connect(backend, url) as db:
        mark = _mark(db)
        tree_rate, tree_n = _rate(db, f"parent_id = {mark}", (ROOT,))
        flat_rate, flat_n = _rate(db, "parent_id IS NULL AND queue = 'default'", ())
        root_status = db.value(f"SELECT status FROM conveyor_jobs WHERE id = {mark}", (ROOT,))
    if (tree_n, flat_n, root_status) != (jobs, jobs, "succeeded"):
        raise RuntimeError(f"drains incomplete: tree {tree_n}, flat {flat_n}, root {root_status}")
    server = (
        {
            "read_server_ms_median": statistics.median(reader.server_ms),
            "read_server_ms_p95": _percentile(reader.server_ms, 95),
            "read_server_ms_max": max(reader.server_ms),
            "bare_read_ms_median": statistics.median(reader.bare_ms),
            "bare_read_ms_p95": _percentile(reader.bare_ms, 95),
            "bare_read_ms_max": max(reader.bare_ms),
        }
        if reader.server_ms
        else {}
    )
    return server | {
        "flat_jobs_per_s": flat_rate,
        "tree_jobs_per_s": tree_rate,
        "tree_vs_flat": tree_rate / flat_rate,
        "read_ms_median": statistics.median(reader.ms),
        "read_ms_p95": _percentile(reader.ms, 95),
        "read_ms_max": max(reader.ms),
        "plain_read_ms_median": statistics.median(reader.plain_ms),
        "plain_read_ms_p95": _percentile(reader.plain_ms, 95),
        "reads": float(len(reader.ms)),
        "reads_over_5ms": float(reader.slow),
        "of_which_during_gc": float(reader.slow_in_gc),
        "inconsistent_reads": float(reader.inconsistent),
    }
