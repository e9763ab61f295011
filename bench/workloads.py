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

from collections.abc import Callable
from dataclasses import dataclass

from bench import floor

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


PROFILES = {
    "quick": Sizes(
        runs=3,
        enqueue_jobs=1_000,
        bulk_jobs=20_000,
        bulk_batch=1_000,
        drain_jobs=20_000,
        drain_batch=100,
    ),
    "full": Sizes(
        runs=5,
        enqueue_jobs=5_000,
        bulk_jobs=100_000,
        bulk_batch=1_000,
        drain_jobs=20_000,
        drain_batch=100,
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


REGISTRY: dict[str, Workload] = {}


def workload(name: str, description: str) -> Callable[[WorkloadFn], WorkloadFn]:
    """Register the decorated function as workload ``name``."""

    def register(fn: WorkloadFn) -> WorkloadFn:
        if name in REGISTRY:
            raise ValueError(f"workload {name!r} registered twice")
        REGISTRY[name] = Workload(name, description, fn)
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


# --- Conveyor ------------------------------------------------------------------
#
# Conveyor workloads go here, registered with @workload like the floor ones and
# named to pair with them (conveyor_enqueue_single, conveyor_drain_1conn, ...),
# so that each conveyor figure sits next to its floor in the table.  They build
# ``Conveyor(url)`` from the run's url, submit no-op jobs defined in a module the
# workers can import (bench/app.py), and time worker subprocesses started as
# ``python -m conveyor worker bench.app:app --burst --concurrency N``.
