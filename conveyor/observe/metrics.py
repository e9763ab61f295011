"""Prometheus metrics of one process: the jobs it submitted and the attempts it ran.

Every :class:`~conveyor.Conveyor` has its own :class:`Metrics` (``app.metrics``) in a
registry of its own, so several applications or test cases in one process never count
into each other. A worker process serves them with ``conveyor worker --metrics-port N``;
``conveyor serve`` adds them to ``/metrics``. Counters are per process: Prometheus sums
them across workers (``sum by (type) (rate(conveyor_jobs_succeeded_total[5m]))``).
Gauges of the whole cluster (queue depth, the oldest due job) come from the database,
once, on the server's ``/metrics``, not from each worker.

What each counter counts, per job type and queue:

- ``submitted``: jobs created by this process (an existing job returned for the same
  id or unique key is not counted);
- ``started``: attempts begun; ``succeeded``, ``failed`` (ended failed, no attempt
  left), ``retried`` (failed or timed out, queued again), ``cancelled``: attempt
  outcomes recorded in the database by this worker;
- ``rescued``: jobs whose lease expired, found by this process's rescue duty;
- ``lease_losses``: runs this worker stopped because it lost their lease.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

# Run times of jobs span milliseconds to hours.
_RUN_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 300, 1800, 3600)
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)

# The attempt counters: (attribute, metric name, help).
_COUNTERS = (
    ("submitted", "conveyor_jobs_submitted", "Jobs created by this process."),
    ("started", "conveyor_jobs_started", "Attempts started by this worker."),
    ("succeeded", "conveyor_jobs_succeeded", "Attempts that ended the job succeeded."),
    ("failed", "conveyor_jobs_failed", "Attempts that ended the job failed (no retry left)."),
    ("retried", "conveyor_jobs_retried", "Failed or timed-out attempts queued for a retry."),
    ("cancelled", "conveyor_jobs_cancelled", "Attempts that ended the job cancelled."),
    ("rescued", "conveyor_jobs_rescued", "Jobs found with an expired lease by this process."),
    ("lease_losses", "conveyor_lease_losses", "Runs stopped because their lease was lost."),
)


class Buckets:
    """A histogram's counts, kept as plain numbers (see :class:`TypeMetrics`)."""

    __slots__ = ("_delta_bounds", "_delta_sum", "_sum", "bounds", "counts")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(float(bound) for bound in bounds)  # float to float: faster
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self._sum = 0.0
        # The same bounds as timedeltas, for observe_delta.
        self._delta_bounds = tuple(timedelta(seconds=bound) for bound in bounds)
        self._delta_sum = _NO_TIME

    @property
    def sum(self) -> float:
        """The sum of the values observed."""
        return self._sum + self._delta_sum.total_seconds()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self._sum += value

    def observe_delta(self, value: timedelta) -> None:
        """Observe ``value`` in seconds, or 0 when negative (clock skew).

        For a difference of two datetimes (a job's wait): kept as a timedelta, not
        turned into seconds each time, which would cost more than the rest.
        """
        if value > _NO_TIME:
            self.counts[bisect_left(self._delta_bounds, value)] += 1
            self._delta_sum += value
        else:
            self.counts[0] += 1

    def cumulative(self) -> list[tuple[str, float]]:
        out, total = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(total)))
        return out


_NO_TIME = timedelta(0)


class _Submitted:
    """A counter any thread may add to (submits come from any thread)."""

    __slots__ = ("_lock", "value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        with self._lock:
            self.value += amount


class TypeMetrics:
    """The numbers of one (job type, queue), looked up once per attempt.

    The worker's counters are plain attributes it adds to on its event loop, read when
    Prometheus scrapes: an attempt costs a few additions, not a lock per metric.
    ``submitted`` takes a lock, since any thread may submit.
    """

    __slots__ = (
        "cancelled",
        "failed",
        "lease_losses",
        "rescued",
        "retried",
        "run_seconds",
        "running",
        "started",
        "submitted",
        "succeeded",
        "wait_seconds",
    )

    def __init__(self) -> None:
        self.submitted = _Submitted()
        self.started = 0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.cancelled = 0
        self.rescued = 0
        self.lease_losses = 0
        self.running = 0
        self.run_seconds = Buckets(_RUN_BUCKETS)
        self.wait_seconds = Buckets(_RUN_BUCKETS)


class Metrics:
    """The counters, histograms and gauges of one application in this process.

    Everything is counted in plain numbers; ``registry`` (made when first asked for,
    which is when prometheus_client is imported) turns them into Prometheus metrics
    at each scrape.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # The worker's store calls by operation (looked up once, not per call).
        self.claim_seconds = Buckets(_STORE_BUCKETS)
        self.settle_seconds = Buckets(_STORE_BUCKETS)
        self.heartbeat_seconds = Buckets(_STORE_BUCKETS)
        self._children: dict[tuple[str, str], TypeMetrics] = {}
        self._registry: CollectorRegistry | None = None
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(_Collector(self))
            self._registry = registry

    @property
    def registry(self) -> CollectorRegistry:
        """The Prometheus registry these metrics are collected from."""
        with self._lock:
            if self._registry is None:
                from prometheus_client import CollectorRegistry

                registry = CollectorRegistry()
                registry.register(_Collector(self))
                self._registry = registry
            return self._registry

    def of(self, type: str, queue: str) -> TypeMetrics:
        """The metrics of one job type and queue (cached: cheap on the hot path)."""
        found = self._children.get((type, queue))
        if found is None:
            with self._lock:  # two threads' first submits of a type make one entry
                found = self._children.setdefault((type, queue), TypeMetrics())
        return found


class _Collector:
    """Turns the plain numbers of every (type, queue) into metrics when scraped."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        labels = ["type", "queue"]
        children = list(self.metrics._children.items())
        for attribute, name, doc in _COUNTERS:
            family = CounterMetricFamily(name, doc, labels=labels)
            for key, m in children:
                value: Any = getattr(m, attribute)
                if isinstance(value, _Submitted):
                    value = value.value
                family.add_metric(list(key), float(value))
            yield family
        running = GaugeMetricFamily(
            "conveyor_jobs_running", "Attempts running now in this worker.", labels=labels
        )
        for key, m in children:
            running.add_metric(list(key), float(m.running))
        yield running
        for attribute, name, doc in (
            ("run_seconds", "conveyor_job_run_seconds", "An attempt's run time."),
            (
                "wait_seconds",
                "conveyor_job_queue_wait_seconds",
                "Time from when a job was due to when an attempt claimed it.",
            ),
        ):
            histogram = HistogramMetricFamily(name, doc, labels=labels)
            for key, m in children:
                b: Buckets = getattr(m, attribute)
                histogram.add_metric(list(key), b.cumulative(), b.sum)
            yield histogram
        store = HistogramMetricFamily(
            "conveyor_store_seconds",
            "Round-trip time of the worker's store calls, by operation.",
            labels=["operation"],
        )
        for operation in ("claim", "settle", "heartbeat"):
            b = getattr(self.metrics, f"{operation}_seconds")
            store.add_metric([operation], b.cumulative(), b.sum)
        yield store


__all__ = ["Buckets", "Metrics", "TypeMetrics"]
