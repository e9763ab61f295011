"""OpenTelemetry spans for submits and attempts, when the ``otel`` extra is installed.

A submit made while a span is current (an HTTP request's, say) opens a ``conveyor
submit`` span under it, and each job stores that span's W3C ``traceparent``. The
worker opens each attempt's ``conveyor run <type>`` span as a child of it, so a job's
runs appear in the trace of the request that created it, however much later and on
whichever machine they run. Without opentelemetry installed, or with no SDK tracer
provider configured, nothing here does more than one check.

opentelemetry is not imported here until something else in the process has imported
it (an application setting a tracer provider must) or the environment names a provider
(``OTEL_PYTHON_TRACER_PROVIDER``): a worker or a command that traces nothing does not
pay for loading it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from conveyor.core.model import Job

_NAME = "conveyor"
_API = "opentelemetry.trace"
# A provider named in the environment is loaded by opentelemetry on first use.
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _api() -> ModuleType | None:
    """``opentelemetry.trace`` if it may have a provider set; None: nothing to trace."""
    found = sys.modules.get(_API)
    if found is not None or not _PROVIDER_FROM_ENV:
        return found
    try:
        return importlib.import_module(_API)
    except ImportError:  # the otel extra is not installed
        return None


def enabled() -> bool:
    """True when spans would be recorded: opentelemetry is installed and configured."""
    trace = _api()
    if trace is None:
        return False
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, or None when no span is recording."""
    trace = _api()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


class Submitted(Protocol):
    """What a submit span tells of each job submitted (a :class:`~conveyor.Submission`)."""

    @property
    def type(self) -> str: ...

    @property
    def id(self) -> str | None: ...


@contextlib.contextmanager
def submit_span(jobs: Sequence[Submitted]) -> Iterator[None]:
    """Open the span of one submit, when a trace is under way and a tracer configured."""
    if not enabled():
        yield
        return
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind

    if not trace.get_current_span().get_span_context().is_valid:
        yield
        return
    types = sorted({j.type for j in jobs})
    attributes: dict[str, Any] = {
        "messaging.system": _NAME,
        "messaging.operation": "publish",
        "messaging.batch.message_count": len(jobs),
        "conveyor.job.type": ",".join(types),
    }
    if len(jobs) == 1 and jobs[0].id is not None:
        attributes["messaging.message.id"] = jobs[0].id
    tracer = trace.get_tracer(_NAME)
    with tracer.start_as_current_span(
        "conveyor submit", kind=SpanKind.PRODUCER, attributes=attributes
    ):
        yield


@contextlib.contextmanager
def attempt_span(job: Job, worker_id: str) -> Iterator[Any]:
    """Open the span of one attempt, under the submitter's trace when the job has one.

    Yields the span (None when tracing is off); :func:`end_attempt` records its outcome.
    """
    if not enabled():
        yield None
        return
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind

    parent = None
    if job.trace_context:
        parent = propagate.extract({"traceparent": job.trace_context})
    tracer = trace.get_tracer(_NAME)
    with tracer.start_as_current_span(
        f"conveyor run {job.type}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": _NAME,
            "messaging.operation": "process",
            "messaging.message.id": job.id,
            "messaging.destination.name": job.queue,
            "conveyor.job.type": job.type,
            "conveyor.job.attempt": job.attempt,
            "conveyor.worker": worker_id,
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_attempt(span: Any, outcome: str | None, error: str | None) -> None:
    """Record an attempt's outcome on its span."""
    if span is None:
        return
    span.set_attribute("conveyor.job.outcome", outcome or "none")
    if error is not None and outcome in ("failed", "timed_out"):
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error))


__all__ = ["attempt_span", "current_traceparent", "enabled", "end_attempt", "submit_span"]
