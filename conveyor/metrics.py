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

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Run times of jobs span milliseconds to hours.
_RUN_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 300, 1800, 3600, float("inf"))
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, float("inf"))


class TypeMetrics:
    """The label children of one (job type, queue): looked up once, then incremented."""

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

    def __init__(self, metrics: Metrics, type: str, queue: str) -> None:
        labels = (type, queue)
        self.submitted = metrics.submitted.labels(*labels)
        self.started = metrics.started.labels(*labels)
        self.succeeded = metrics.succeeded.labels(*labels)
        self.failed = metrics.failed.labels(*labels)
        self.retried = metrics.retried.labels(*labels)
        self.cancelled = metrics.cancelled.labels(*labels)
        self.rescued = metrics.rescued.labels(*labels)
        self.lease_losses = metrics.lease_losses.labels(*labels)
        self.run_seconds = metrics.run_seconds.labels(*labels)
        self.wait_seconds = metrics.wait_seconds.labels(*labels)
        self.running = metrics.running.labels(*labels)


class Metrics:
    """The counters, histograms and gauges of one application in this process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        labels = ("type", "queue")

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"conveyor_jobs_{name}", doc, labels, registry=r)

        self.submitted = counter("submitted", "Jobs created by this process.")
        self.started = counter("started", "Attempts started by this worker.")
        self.succeeded = counter("succeeded", "Attempts that ended the job succeeded.")
        self.failed = counter("failed", "Attempts that ended the job failed (no retry left).")
        self.retried = counter("retried", "Failed or timed-out attempts queued for a retry.")
        self.cancelled = counter("cancelled", "Attempts that ended the job cancelled.")
        self.rescued = counter("rescued", "Jobs found with an expired lease by this process.")
        self.lease_losses = Counter(
            "conveyor_lease_losses",
            "Runs this worker stopped because their lease was lost.",
            labels,
            registry=r,
        )
        self.run_seconds = Histogram(
            "conveyor_job_run_seconds",
            "Time from an attempt's start to its handler's end.",
            labels,
            buckets=_RUN_BUCKETS,
            registry=r,
        )
        self.wait_seconds = Histogram(
            "conveyor_job_queue_wait_seconds",
            "Time from when a job was due to when an attempt claimed it.",
            labels,
            buckets=_RUN_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "conveyor_jobs_running", "Attempts running now in this worker.", labels, registry=r
        )
        self.store_seconds = Histogram(
            "conveyor_store_seconds",
            "Round-trip time of the worker's store calls, by operation.",
            ("operation",),
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self._children: dict[tuple[str, str], TypeMetrics] = {}

    def of(self, type: str, queue: str) -> TypeMetrics:
        """The metrics of one job type and queue (cached: cheap on the hot path)."""
        found = self._children.get((type, queue))
        if found is None:
            found = self._children[(type, queue)] = TypeMetrics(self, type, queue)
        return found


__all__ = ["Metrics", "TypeMetrics"]
