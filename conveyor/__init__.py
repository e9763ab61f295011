"""conveyor: durable background jobs for Python, on SQLite or PostgreSQL.

Define handlers with ``@app.job()``, submit jobs from code, run ``conveyor worker``.
Jobs survive crashes: leases with fencing tokens, heartbeats, rescue of jobs whose
worker died, retries with backoff, timeouts and graceful shutdown.
"""

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
