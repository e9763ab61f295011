"""Spans per submit and per attempt; a job's runs appear under the trace that submitted it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from conveyor import Conveyor, JobContext, Status
from conveyor.web import create_api
from tests.helpers import running_worker, settled

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans finished during the test (the global provider is set once per process)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


async def test_an_attempt_is_a_child_of_the_submit_under_the_callers_span(
    app: Conveyor, spans: InMemorySpanExporter
) -> None:
    @app.job(max_attempts=2, backoff=("10ms", "10ms"))
    async def flaky(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")
        return 1

    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("POST /orders") as request:
        job = await flaky.submit()
    assert job.record.trace_context is not None
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    by_name: dict[str, list[object]] = {}
    for span in spans.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    (submit,) = by_name["conveyor submit"]
    runs = sorted(by_name["conveyor run flaky"], key=lambda s: s.attributes["conveyor.job.attempt"])  # type: ignore[attr-defined]
    trace_id = request.get_span_context().trace_id
    assert submit.parent.span_id == request.get_span_context().span_id  # type: ignore[attr-defined]
    assert submit.kind is SpanKind.PRODUCER  # type: ignore[attr-defined]
    assert [r.attributes["conveyor.job.attempt"] for r in runs] == [1, 2]  # type: ignore[attr-defined]
    for run in runs:
        assert run.context.trace_id == trace_id  # type: ignore[attr-defined]
        assert run.parent.span_id == submit.context.span_id  # type: ignore[attr-defined]
        assert run.kind is SpanKind.CONSUMER  # type: ignore[attr-defined]
        assert run.attributes["messaging.message.id"] == job.id  # type: ignore[attr-defined]
    assert runs[0].status.status_code is StatusCode.ERROR  # type: ignore[attr-defined]
    assert runs[0].attributes["conveyor.job.outcome"] == "failed"  # type: ignore[attr-defined]
    assert runs[1].attributes["conveyor.job.outcome"] == "succeeded"  # type: ignore[attr-defined]


async def test_a_handlers_own_spans_and_children_nest_under_its_attempt(
    app: Conveyor, spans: InMemorySpanExporter
) -> None:
    @app.job()
    def step(ctx: JobContext) -> None:
        with trace.get_tracer("handler").start_as_current_span("inside the sync handler"):
            pass

    @app.job()
    async def parent(ctx: JobContext) -> None:
        await ctx.spawn("step", id=f"{ctx.id}.child")

    with trace.get_tracer("test").start_as_current_span("request"):
        job = await parent.submit()
    async with running_worker(app):
        await settled(job)
        child = await app.get(f"{job.id}.child")
        await settled(child, Status.SUCCEEDED)
    named = {s.name: s for s in spans.get_finished_spans()}
    parent_run, child_run = named["conveyor run parent"], named["conveyor run step"]
    assert child_run.parent.span_id == parent_run.context.span_id  # type: ignore[union-attr]
    inner = named["inside the sync handler"]
    assert inner.parent.span_id == child_run.context.span_id  # type: ignore[union-attr]


async def test_a_job_submitted_over_http_runs_under_the_request(
    app: Conveyor, spans: InMemorySpanExporter
) -> None:
    @app.job()
    async def ping(ctx: JobContext) -> str:
        return "pong"

    _, secret = await app.create_token(tenant="default", role="write")
    transport = httpx.ASGITransport(app=create_api(app))
    headers = {"Authorization": f"Bearer {secret}"}
    with trace.get_tracer("test").start_as_current_span("client call") as caller:
        propagate.inject(headers)  # the W3C traceparent header, as an HTTP client sends it
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.post("/jobs", json={"type": "ping"}, headers=headers)
    job = await app.get(f"default/{r.json()['id']}")
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    finished = {s.context.span_id: s for s in spans.get_finished_spans()}
    (run,) = [s for s in finished.values() if s.name == "conveyor run ping"]
    assert run.context.trace_id == caller.get_span_context().trace_id
    # Up from the run: the submit, then the server's spans of the request, then the caller.
    chain = []
    span = run
    while span.parent is not None and span.parent.span_id in finished:
        span = finished[span.parent.span_id]
        chain.append(span.name)
    assert chain[0] == "conveyor submit" and chain[-1] == "client call", chain


async def test_without_a_current_span_jobs_carry_no_trace_context(
    app: Conveyor, spans: InMemorySpanExporter
) -> None:
    @app.job()
    async def quiet(ctx: JobContext) -> None:
        return None

    job = await quiet.submit()
    assert job.record.trace_context is None
    async with running_worker(app):
        await settled(job, Status.SUCCEEDED)
    names = [s.name for s in spans.get_finished_spans()]
    assert names == ["conveyor run quiet"], "an attempt is a root span of its own"


def test_without_opentelemetry_installed_jobs_run_untraced(tmp_path: Path) -> None:
    script = f"""
import asyncio, sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
from conveyor import Conveyor
from conveyor.observe import tracing

assert not tracing.enabled() and tracing.current_traceparent() is None
app = Conveyor("sqlite:///{tmp_path / "c.db"}")

@app.job()
async def add(ctx, a: int) -> int:
    return a + 1

async def main() -> None:
    job = await add.submit(a=1)
    await app.worker(__import__("conveyor").WorkerOptions(burst=True)).run()
    await job.refresh()
    print(job.status.value, job.result, job.record.trace_context)
    await app.close()

asyncio.run(main())
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["succeeded", "2", "None"], out.stderr
