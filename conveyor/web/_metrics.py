"""Prometheus metrics: the API's own requests, and the jobs, queues and workers of the cluster."""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.app.client import Conveyor
from conveyor.app.health import Health
from conveyor.core.lifecycle import Status
from conveyor.store import QueueInfo, QueueLag

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Methods counted by name; any other (a client may send any token as a method) is "other",
# so that made-up methods cannot grow the number of series.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# Scrapes within this many seconds share one read of the cluster's gauges, so that
# several Prometheus servers (or a dashboard) scraping at once cost one round of queries.
CLUSTER_CACHE_SECONDS = 1.0


class ApiMetrics:
    """The API's request counters, in a registry of its own (one per API instance)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "conveyor_http_requests",
            "HTTP requests answered, by route, method and status code.",
            ["route", "method", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "conveyor_http_request_duration_seconds",
            "Time to answer an HTTP request, by route (long polls included).",
            ["route"],
            registry=self.registry,
        )
        self.long_polls = Gauge(
            "conveyor_http_long_polls",
            "Requests waiting now for a job to end (GET /jobs/{id}?wait=...).",
            registry=self.registry,
        )
        self.cluster: tuple[float, list[Metric]] | None = None  # (read at, families)


class MetricsMiddleware:
    """Count every request by its route template, not its raw path (bounded labels)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        code = 500

        async def sending(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.requests.labels(route, method, str(code)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - started)


class _Snapshot(Collector):
    """Gauges read from the database for one scrape."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


async def render(app: Conveyor, metrics: ApiMetrics, *, polls: int) -> bytes:
    """Return the text exposition of every metric: the API's, the application's jobs
    submitted (and run, with ``serve --with-worker``) in this process, and the cluster's,
    read from the database at most once a second."""
    now = time.monotonic()
    cached = metrics.cluster
    if cached is not None and now - cached[0] < CLUSTER_CACHE_SECONDS:
        cluster = cached[1]
    else:
        queues = await app.queues()
        health = await app.health()
        lag = await app.queue_lag()
        cluster = [*_cluster(queues, health), *_lag(lag)]
        metrics.cluster = (now, cluster)
    queries = CounterMetricFamily(
        "conveyor_http_long_poll_queries",
        "Queries made by the shared long-poll loop (one per tick, however many wait).",
    )
    queries.add_metric([], float(polls))
    snapshot = CollectorRegistry()
    snapshot.register(_Snapshot([*cluster, queries]))
    return (
        generate_latest(metrics.registry)
        + generate_latest(app.metrics.registry)
        + generate_latest(snapshot)
    )


def render_tenant(queues: list[QueueInfo]) -> bytes:
    """The metrics a tenant's token reads: its own jobs by queue and status, and which
    queues are paused; nothing of other tenants, the API's traffic or the workers."""
    jobs, paused = _queue_families(queues)
    snapshot = CollectorRegistry()
    snapshot.register(_Snapshot([jobs, paused]))
    return generate_latest(snapshot)


def _queue_families(queues: list[QueueInfo]) -> tuple[Metric, Metric]:
    jobs = GaugeMetricFamily(
        "conveyor_jobs", "Jobs by queue and status.", labels=["queue", "status"]
    )
    paused = GaugeMetricFamily(
        "conveyor_queue_paused", "1 when the queue is paused.", labels=["queue"]
    )
    for q in queues:
        paused.add_metric([q.name], 1.0 if q.paused else 0.0)
        for status in Status:
            jobs.add_metric([q.name, status.value], float(q.counts.get(status.value, 0)))
    return jobs, paused


def _lag(lag: list[QueueLag]) -> list[Metric]:
    due = GaugeMetricFamily(
        "conveyor_queue_due_jobs",
        "Queued jobs whose run_at has passed, by queue.",
        labels=["queue"],
    )
    oldest = GaugeMetricFamily(
        "conveyor_queue_oldest_due_seconds",
        "How long the oldest due job of each queue has waited (absent: none is due).",
        labels=["queue"],
    )
    for q in lag:
        due.add_metric([q.queue], float(q.due))
        oldest.add_metric([q.queue], q.oldest_age)
    return [due, oldest]


def _cluster(queues: list[QueueInfo], health: Health) -> list[Metric]:
    jobs, paused = _queue_families(queues)
    c = health.counts
    due = GaugeMetricFamily("conveyor_jobs_due", "Queued jobs whose run_at has passed.")
    due.add_metric([], float(c.due))
    stale = GaugeMetricFamily(
        "conveyor_jobs_stale_running", "Running jobs whose lease expired, not yet rescued."
    )
    stale.add_metric([], float(c.stale_running))
    workers = GaugeMetricFamily(
        "conveyor_workers", "Workers registered, by state.", labels=["state"]
    )
    workers.add_metric(["live"], float(c.live_workers))
    workers.add_metric(["dead"], float(c.dead_workers))
    workers.add_metric(["stopped"], float(c.workers - c.live_workers - c.dead_workers))
    age = GaugeMetricFamily(
        "conveyor_worker_heartbeat_age_seconds",
        "Seconds since the newest worker heartbeat (NaN when no worker ever ran).",
    )
    age.add_metric([], health.heartbeat_age if health.heartbeat_age is not None else float("nan"))
    verdict = GaugeMetricFamily(
        "conveyor_health", "1 for the cluster's current health verdict.", labels=["status"]
    )
    for name in ("healthy", "degraded", "unhealthy"):
        verdict.add_metric([name], 1.0 if health.status == name else 0.0)
    return [jobs, paused, due, stale, workers, age, verdict]
