"""conveyor: durable background jobs for Python, on SQLite or PostgreSQL.

Define handlers with ``@app.job()``, submit jobs from code, run ``conveyor worker``.
Jobs survive crashes: leases with fencing tokens, heartbeats, rescue of jobs whose
worker died, retries with backoff, timeouts and graceful shutdown.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.client import Conveyor, JobDefinition, JobHandle, Submission
    from conveyor.context import Cancel, JobContext, Retry
    from conveyor.core.lifecycle import Status
    from conveyor.core.model import Attempt, Outcome, Progress
    from conveyor.errors import (
        ConfigurationError,
        ConveyorError,
        DatabaseUnavailable,
        IdempotencyConflict,
        IllegalTransition,
        InvalidPayload,
        InvalidState,
        JobNotFound,
        LeaseHeld,
        LeaseLost,
        NotAConveyorDatabase,
        RetryLimitReached,
        UnknownJobType,
    )
    from conveyor.store import Retention
    from conveyor.worker import Worker, WorkerOptions

# Where each public name lives. They are imported when first used (PEP 562), so that
# `conveyor --help` and a worker's start-up load only what they need; an import error
# in a module surfaces, with its traceback, where the name is first used.
_EXPORTS = {
    "Conveyor": "conveyor.client",
    "JobDefinition": "conveyor.client",
    "JobHandle": "conveyor.client",
    "Submission": "conveyor.client",
    "Cancel": "conveyor.context",
    "JobContext": "conveyor.context",
    "Retry": "conveyor.context",
    "Status": "conveyor.core.lifecycle",
    "Attempt": "conveyor.core.model",
    "Outcome": "conveyor.core.model",
    "Progress": "conveyor.core.model",
    "ConfigurationError": "conveyor.errors",
    "ConveyorError": "conveyor.errors",
    "DatabaseUnavailable": "conveyor.errors",
    "IdempotencyConflict": "conveyor.errors",
    "IllegalTransition": "conveyor.errors",
    "InvalidPayload": "conveyor.errors",
    "InvalidState": "conveyor.errors",
    "JobNotFound": "conveyor.errors",
    "LeaseHeld": "conveyor.errors",
    "LeaseLost": "conveyor.errors",
    "NotAConveyorDatabase": "conveyor.errors",
    "RetryLimitReached": "conveyor.errors",
    "UnknownJobType": "conveyor.errors",
    "Retention": "conveyor.store",
    "Worker": "conveyor.worker",
    "WorkerOptions": "conveyor.worker",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "Cancel",
    "ConfigurationError",
    "Conveyor",
    "ConveyorError",
    "DatabaseUnavailable",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidPayload",
    "InvalidState",
    "JobContext",
    "JobDefinition",
    "JobHandle",
    "JobNotFound",
    "LeaseHeld",
    "LeaseLost",
    "NotAConveyorDatabase",
    "Outcome",
    "Progress",
    "Retention",
    "Retry",
    "RetryLimitReached",
    "Status",
    "Submission",
    "UnknownJobType",
    "Worker",
    "WorkerOptions",
]
