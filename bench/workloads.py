"""The workload registry: every benchmark the runner knows, and the sizes it runs them at.

A workload is a plain function ``(backend, url, sizes) -> metrics``.  ``backend``
is ``"sqlite"`` or ``"postgres"``, ``url`` points at a fresh empty database made
for this one run (``sqlite:////tmp/.../runN.db`` or
``postgresql://.../conveyor_bench_<token>_<n>``), and the returned dict maps
metric names to numbers.  The runner calls it ``sizes.runs`` times and reports
the median and range of every metric.  Set-up inside the function (schema,
pre-inserted jobs, starting processes) is not timed: the function times only
what it measures.

To add a workload, write the function and decorate it with ``@workload``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from bench import fanout, floor, measure

BACKENDS = ("sqlite", "postgres")


@dataclass(frozen=True)
class Sizes:
    """How much work one run does, and how many runs each workload gets."""

    runs: int
    enqueue_jobs: int
    bulk_jobs: int
    bulk_batch: int
    drain_jobs: int
    drain_batch: int
    # A worker's --concurrency, which is also the most jobs it claims at once: the
    # same as drain_batch, so that conveyor's drain compares with the floor's.
    concurrency: int
    latency_jobs: int
    latency_gap: float
    scale_queued: int
    scale_finished: int
    scale_claims: int
    heartbeat_running: int
    heartbeat_window: float
    heartbeat_lease: float
    progress_calls: int
    tree_children: int
    fanout_jobs: int


PROFILES = {
    "quick": Sizes(
        runs=3,
        enqueue_jobs=10_000,
        bulk_jobs=20_000,
        bulk_batch=1_000,
        drain_jobs=20_000,
        drain_batch=100,
        concurrency=100,
        latency_jobs=200,
        latency_gap=0.020,
        scale_queued=100_000,
        scale_finished=100_000,
        scale_claims=50,
        heartbeat_running=1_000,
        heartbeat_window=5.0,
        heartbeat_lease=3.0,
        progress_calls=10_000,
        tree_children=1_000,
        fanout_jobs=20_000,
    ),
    "full": Sizes(
        runs=5,
        enqueue_jobs=10_000,
        bulk_jobs=100_000,
        bulk_batch=1_000,
        drain_jobs=20_000,
        drain_batch=100,
        concurrency=100,
        latency_jobs=200,
        latency_gap=0.020,
        scale_queued=1_000_000,
        scale_finished=1_000_000,
        scale_claims=100,
        heartbeat_running=1_000,
        heartbeat_window=10.0,
        heartbeat_lease=3.0,
        progress_calls=10_000,
        tree_children=1_000,
        fanout_jobs=100_000,
    ),
}

Metrics = dict[str, float]
WorkloadFn = Callable[[str, str, Sizes], Metrics]


@dataclass(frozen=True)
class Workload:
    """A registered workload: its name, what it measures, and the function that runs it."""

    name: str
    description: str
    run: WorkloadFn
    max_runs: int | None = None  # fewer runs than the profile's, for costly set-ups


REGISTRY: dict[str, Workload] = {}


def workload(
    name: str, description: str, *, max_runs: int | None = None
) -> Callable[[WorkloadFn], WorkloadFn]:
    """Register the decorated function as workload ``name``."""
    if max_runs is not None and max_runs < 3:
        raise ValueError("a workload needs at least 3 runs for a median worth reporting")

    def register(fn: WorkloadFn) -> WorkloadFn:
        if name in REGISTRY:
            raise ValueError(f"workload {name!r} registered twice")
        REGISTRY[name] = Workload(name, description, fn, max_runs)
        return fn

    return register


def throughput(jobs: int, seconds: float) -> Metrics:
    """Return the standard metrics of a run that processed ``jobs`` in ``seconds``."""
    return {"jobs_per_s": jobs / seconds, "seconds": seconds}


# --- Floor: raw SQL on the same drivers (bench/floor.py) ---------------------


@workload("floor_enqueue_single", "raw INSERT, one statement and one commit per job")
def floor_enqueue_single(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Enqueue floor, one job per transaction."""
    return throughput(sizes.enqueue_jobs, floor.enqueue_single(backend, url, sizes.enqueue_jobs))


@workload("floor_enqueue_bulk", "raw INSERT, bulk_batch jobs per statement and commit")
def floor_enqueue_bulk(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Enqueue floor, many jobs per transaction."""
    seconds = floor.enqueue_bulk(backend, url, sizes.bulk_jobs, sizes.bulk_batch)
    return throughput(sizes.bulk_jobs, seconds)


@workload("floor_drain_1conn", "raw claim+complete, drain_batch per claim, 1 connection")
def floor_drain_1conn(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Drain floor with one worker connection."""
    seconds = floor.drain(backend, url, sizes.drain_jobs, sizes.drain_batch, processes=1)
    return throughput(sizes.drain_jobs, seconds)


@workload("floor_drain_4conn", "raw claim+complete, drain_batch per claim, 4 processes")
def floor_drain_4conn(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Drain floor with four worker processes, one connection each."""
    seconds = floor.drain(backend, url, sizes.drain_jobs, sizes.drain_batch, processes=4)
    return throughput(sizes.drain_jobs, seconds)


# --- Conveyor: the public API and real worker processes (bench/measure.py) ----


@workload("conveyor_enqueue_single", "await app.submit(...), one job per call")
def conveyor_enqueue_single(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Enqueue through conveyor, one job per call and per transaction."""
    return measure.enqueue_single(backend, url, sizes.enqueue_jobs)


@workload("conveyor_enqueue_bulk", "await app.submit_many(...), bulk_batch jobs per call")
def conveyor_enqueue_bulk(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Enqueue through conveyor, many jobs per call."""
    return measure.enqueue_bulk(backend, url, sizes.bulk_jobs, sizes.bulk_batch)


@workload("conveyor_drain_1proc", "1 worker process, --concurrency C, drain_jobs no-op jobs")
def conveyor_drain_1proc(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Drain with one burst worker process."""
    return measure.drain(backend, url, sizes.drain_jobs, sizes.concurrency, processes=1)


@workload("conveyor_drain_4proc", "4 worker processes, --concurrency C each")
def conveyor_drain_4proc(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Drain with four burst worker processes."""
    return measure.drain(backend, url, sizes.drain_jobs, sizes.concurrency, processes=4)


@workload(
    "conveyor_drain_observed",
    "2 workers at once: 2 x drain_jobs each with INFO logs + metrics vs. without; ratio, CPU/job",
)
def conveyor_drain_observed(backend: str, url: str, sizes: Sizes) -> Metrics:
    """What per-attempt log lines and metrics cost a draining worker."""
    # Twice the drain's jobs: a worker's CPU time is read in 10 ms ticks, which on
    # 20,000 jobs of about 25 us (PostgreSQL) was 2% of a reading.
    return measure.drain_observed(backend, url, 2 * sizes.drain_jobs, sizes.concurrency)


@workload("conveyor_startup", "spawn `conveyor worker` → its first job starts; `conveyor --help`")
def conveyor_startup(backend: str, url: str, sizes: Sizes) -> Metrics:
    """How soon a fresh worker process runs a waiting job, and how long --help takes."""
    return measure.startup(backend, url)


@workload("conveyor_latency", "idle worker; jobs submitted latency_gap apart; enqueue→start")
def conveyor_latency(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Enqueue-to-start latency on an idle worker, submits from another process."""
    return measure.latency(backend, url, sizes.latency_jobs, sizes.latency_gap, sizes.concurrency)


@workload(
    "conveyor_scale",
    "claim and drain: small table, then + queued and finished rows",
    max_runs=3,
)
def conveyor_scale(backend: str, url: str, sizes: Sizes) -> Metrics:
    """Claim latency and drain rate, without and with a large table."""
    return measure.scale(
        backend,
        url,
        queued=sizes.scale_queued,
        finished=sizes.scale_finished,
        jobs=sizes.drain_jobs,
        concurrency=sizes.concurrency,
        claim_rounds=sizes.scale_claims,
    )


@workload("conveyor_heartbeat", "worker holding 1,000 sleeping async jobs: CPU, RSS, traffic")
def conveyor_heartbeat(backend: str, url: str, sizes: Sizes) -> Metrics:
    """The standing cost of many running jobs: heartbeats, memory, CPU."""
    return measure.heartbeat(
        backend,
        url,
        running=sizes.heartbeat_running,
        window=sizes.heartbeat_window,
        lease=sizes.heartbeat_lease,
    )


@workload("conveyor_progress", "one handler calling ctx.progress progress_calls times")
def conveyor_progress(backend: str, url: str, sizes: Sizes) -> Metrics:
    """The cost of ctx.progress, and how many writes it causes."""
    return measure.progress(backend, url, calls=sizes.progress_calls, pauses=100, pause=0.02)


@workload("conveyor_tree", "a job spawning tree_children no-op children, until all end")
def conveyor_tree(backend: str, url: str, sizes: Sizes) -> Metrics:
    """A job tree: one spawn_many of all children, then the children and the parent's end."""
    return measure.tree(backend, url, children=sizes.tree_children, concurrency=sizes.concurrency)


@workload(
    "conveyor_fanout",
    "4 workers: 1 root + fanout_jobs children vs. fanout_jobs independent jobs, same run; "
    "reads of the root's counts meanwhile",
)
def conveyor_fanout(backend: str, url: str, sizes: Sizes) -> Metrics:
    """A fan-out drains at the rate of independent jobs; reading its root stays cheap."""
    return fanout.fanout(
        backend,
        url,
        jobs=sizes.fanout_jobs,
        concurrency=sizes.concurrency,
        # BENCH_FANOUT_PROCESSES=N: that many worker processes instead of 4.
        processes=int(os.environ.get("BENCH_FANOUT_PROCESSES", "4")),
        read_gap=0.05,
    )
