"""conveyor: durable background jobs for Python, on SQLite or PostgreSQL.

Define handlers with ``@app.job()``, submit jobs from code, run ``conveyor worker``.
Jobs survive crashes: leases with fencing tokens, heartbeats, rescue of jobs whose
worker died, retries with backoff, timeouts and graceful shutdown.

Every public name is importable from here; each type a public method returns is among
them. The package's layers (docs/architecture.md): ``core`` (pure rules), ``store``
(the database), ``observe`` (logs, metrics, hooks, tracing), ``worker``, ``app`` (the
:class:`Conveyor` facade and its services), and the edges ``cli`` and ``web``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from conveyor import _moved

if TYPE_CHECKING:
    from conveyor.app.blocking import Blocking
    from conveyor.app.client import Conveyor
    from conveyor.app.handles import JobDefinition, JobHandle, JobPage, JobView, Submission
    from conveyor.app.health import Health
    from conveyor.app.locks import NamedLease
    from conveyor.app.ops import Operations
    from conveyor.app.tenants import TenantLimits
    from conveyor.core.auth import Principal, Role, Token
    from conveyor.core.cron import Schedule
    from conveyor.core.filter import JobFilter
    from conveyor.core.flow import TenantLimit
    from conveyor.core.lifecycle import Status
    from conveyor.core.model import Attempt, NewJob, Outcome, Progress, TreeCounts
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
    from conveyor.observe.hooks import AttemptEnded, AttemptStarted
    from conveyor.observe.logs import JobLogger
    from conveyor.store import (
        HealthCounts,
        LeaseRecord,
        QueueInfo,
        QueueLag,
        Retention,
        ScheduleInfo,
        Store,
        UnservedType,
        WorkerInfo,
    )
    from conveyor.store.protocol import AuditEntry, JobEvent, MinuteStats
    from conveyor.worker import Worker, WorkerOptions
    from conveyor.worker.context import Cancel, JobContext, Retry

# Where each public name lives: the one list of exports (tests/test_architecture.py checks
# that it, the imports above and __all__ agree). They are imported when first used (PEP
# 562), so that `conveyor --help` and a worker's start-up load only what they need; an
# import error in a module surfaces, with its traceback, where the name is first used.
_EXPORTS = {
    "Blocking": "conveyor.app.blocking",
    "Conveyor": "conveyor.app.client",
    "Health": "conveyor.app.health",
    "JobDefinition": "conveyor.app.handles",
    "JobHandle": "conveyor.app.handles",
    "JobPage": "conveyor.app.handles",
    "JobView": "conveyor.app.handles",
    "Submission": "conveyor.app.handles",
    "NamedLease": "conveyor.app.locks",
    "Operations": "conveyor.app.ops",
    "TenantLimits": "conveyor.app.tenants",
    "Principal": "conveyor.core.auth",
    "Role": "conveyor.core.auth",
    "Token": "conveyor.core.auth",
    "Schedule": "conveyor.core.cron",
    "JobFilter": "conveyor.core.filter",
    "TenantLimit": "conveyor.core.flow",
    "Status": "conveyor.core.lifecycle",
    "Attempt": "conveyor.core.model",
    "NewJob": "conveyor.core.model",
    "Outcome": "conveyor.core.model",
    "Progress": "conveyor.core.model",
    "TreeCounts": "conveyor.core.model",
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
    "AttemptEnded": "conveyor.observe.hooks",
    "AttemptStarted": "conveyor.observe.hooks",
    "JobLogger": "conveyor.observe.logs",
    "AuditEntry": "conveyor.store.protocol",
    "JobEvent": "conveyor.store.protocol",
    "MinuteStats": "conveyor.store.protocol",
    "HealthCounts": "conveyor.store",
    "LeaseRecord": "conveyor.store",
    "QueueInfo": "conveyor.store",
    "QueueLag": "conveyor.store",
    "Retention": "conveyor.store",
    "ScheduleInfo": "conveyor.store",
    "Store": "conveyor.store",
    "UnservedType": "conveyor.store",
    "WorkerInfo": "conveyor.store",
    "Cancel": "conveyor.worker.context",
    "JobContext": "conveyor.worker.context",
    "Retry": "conveyor.worker.context",
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


_moved.install()

__version__ = "0.1.0"

__all__ = [
    "Attempt",
    "AttemptEnded",
    "AttemptStarted",
    "AuditEntry",
    "Blocking",
    "Cancel",
    "ConfigurationError",
    "Conveyor",
    "ConveyorError",
    "DatabaseUnavailable",
    "Health",
    "HealthCounts",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidPayload",
    "InvalidState",
    "JobContext",
    "JobDefinition",
    "JobEvent",
    "JobFilter",
    "JobHandle",
    "JobLogger",
    "JobNotFound",
    "JobPage",
    "JobView",
    "LeaseHeld",
    "LeaseLost",
    "LeaseRecord",
    "MinuteStats",
    "NamedLease",
    "NewJob",
    "NotAConveyorDatabase",
    "Operations",
    "Outcome",
    "Principal",
    "Progress",
    "QueueInfo",
    "QueueLag",
    "Retention",
    "Retry",
    "RetryLimitReached",
    "Role",
    "Schedule",
    "ScheduleInfo",
    "Status",
    "Store",
    "Submission",
    "TenantLimit",
    "TenantLimits",
    "Token",
    "TreeCounts",
    "UnknownJobType",
    "UnservedType",
    "Worker",
    "WorkerInfo",
    "WorkerOptions",
]
