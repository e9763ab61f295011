"""Three worker processes serve their metrics; the sums of their counters match the database."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conveyor import Conveyor, Submission
from tests.helpers import eventually
from tests.processes import WorkerProcesses

pytestmark = pytest.mark.processes

APP = "tests.apps.observed:app"
FAST = ("--lease", "5", "--rescue-interval", "1", "--poll-interval", "0.1", "-c", "10")
PORT = re.compile(r"metrics at http://127\.0\.0\.1:(\d+)/metrics")
COUNTERS = ("started", "succeeded", "failed", "retried", "cancelled", "rescued")


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    procs = WorkerProcesses(db_url, tmp_path / "runs.log", tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
async def client(db_url: str) -> AsyncIterator[Conveyor]:
    from tests.apps import observed

    app = observed.app
    app.url = db_url
    yield app
    await app.close()


def scrape(port: int) -> Counter[str]:
    """The worker's job counters, summed over job types and queues."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    totals: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("conveyor_jobs_") and s.name.endswith("_total"):
                totals[s.name.removeprefix("conveyor_jobs_").removesuffix("_total")] += int(s.value)
    return totals


async def database_counts(app: Conveyor) -> Counter[str]:
    """What the database says happened: attempts started, outcomes, retries."""
    counts: Counter[str] = Counter()
    cursor = None
    while True:
        page = await app.page_jobs(cursor=cursor, limit=500)
        for job in page.jobs:
            counts["jobs"] += 1
            counts["started"] += job.attempt
            counts["retried"] += job.attempt - 1
            counts[job.status.value] += 1
        if page.next is None:
            return counts
        cursor = page.next


async def test_three_workers_counters_add_up_to_the_database(
    client: Conveyor, workers: WorkerProcesses
) -> None:
    await client.migrate()
    procs = [
        workers.start(*FAST, "--metrics-port", "0", "--log-format", fmt, app=APP)
        for fmt in ("text", "json", "json")
    ]
    ports: list[int] = []

    async def ready() -> bool:
        for index, proc in enumerate(procs):
            assert proc.poll() is None, workers.log(index)
        found = [PORT.search(workers.log(i)) for i in range(len(procs))]
        if not all(found):
            return False
        ports[:] = [int(m.group(1)) for m in found if m]
        return len([w for w in await client.workers() if w.stopped_at is None]) == 3

    await eventually(ready, timeout=120, interval=0.1)
    assert all(scrape(port)["started"] == 0 for port in ports), "the metrics port answers"

    submissions = [Submission("steady", {"i": i}) for i in range(800)]
    submissions += [Submission("flaky", {"i": i}) for i in range(150)]
    submissions += [Submission("doomed", {"i": i}) for i in range(50)]
    steady = {"type": "steady", "queue": "default"}
    registry = client.metrics.registry
    # The module's app is shared by the backends' runs of this test: count from here.
    before = registry.get_sample_value("conveyor_jobs_submitted_total", steady) or 0.0
    await client.submit_many(submissions)
    assert registry.get_sample_value("conveyor_jobs_submitted_total", steady) == before + 800

    async def drained() -> bool:
        page = await client.page_jobs(status=["queued", "running"], limit=1)
        return not page.jobs

    await eventually(drained, timeout=240, interval=0.2)
    db = await database_counts(client)
    assert (db["jobs"], db["succeeded"], db["failed"]) == (1000, 950, 50)
    assert (db["started"], db["retried"]) == (1000 + 150 + 50, 200)
    expected = Counter(
        started=db["started"], succeeded=db["succeeded"], failed=db["failed"], retried=200
    )
    per_worker: list[Counter[str]] = []

    async def counters_add_up() -> bool:
        # A worker counts an outcome once the database has it: an instant after the commit.
        per_worker[:] = [scrape(port) for port in ports]
        total = sum(per_worker, Counter())
        return all(total[name] == expected[name] for name in COUNTERS)

    await eventually(counters_add_up, timeout=30, interval=0.1)
    assert sum(1 for c in per_worker if c["started"]) >= 2, "the work was shared"
    assert all(c["submitted"] == 0 for c in per_worker), "workers submitted nothing"

    # Worker 0 logs plain text lines; workers 1 and 2 one JSON object per line.
    text = workers.log(0).splitlines()
    succeeded = [line for line in text if " INFO conveyor.worker: job succeeded in " in line]
    assert succeeded and all(
        re.search(r" job_id=\S+ job_type=\S+ queue=\S+ attempt=\d+ worker=\S+$", line)
        for line in succeeded
    )
    records = [json.loads(line) for i in (1, 2) for line in workers.log(i).splitlines()]
    finals = [r for r in records if r.get("level") == "ERROR" and r.get("job_type") == "doomed"]
    assert all("ValueError: doomed" in r["traceback"] for r in finals)
    text_finals = [
        line for line in text if "ERROR conveyor.worker: job failed (attempt 2/2" in line
    ]
    assert len(finals) + len(text_finals) == 50, "each final failure is one ERROR line"
    assert workers.log(0).count("Traceback (most recent call last)") == len(text_finals)
    retries = [r for r in records if r.get("job_type") == "flaky" and r.get("retry_at")]
    assert all("(attempt 1/3)" in r["message"] for r in retries)


async def test_a_busy_metrics_port_is_a_usage_error(
    client: Conveyor, workers: WorkerProcesses
) -> None:
    import socket

    await client.migrate()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = workers.start("--metrics-port", str(port), app=APP)
        assert proc.wait(60) == 2
    assert f"cannot serve metrics on 127.0.0.1:{port}" in workers.log(0)
