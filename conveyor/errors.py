"""The exceptions conveyor raises, each with a message that says what to do."""

from __future__ import annotations

import difflib
from typing import Any

from conveyor.core.lifecycle import IllegalTransition


class ConveyorError(Exception):
    """Base class of conveyor's errors."""


class ConfigurationError(ConveyorError):
    """A setting is wrong: a malformed URL, a bad option, an unusable database."""


class DatabaseUnavailable(ConveyorError):
    """The database cannot be reached or opened."""


class StorageError(DatabaseUnavailable):
    """The database failed an operation: a full disk, an I/O error, a lock held too long,
    a read-only or corrupt file, a lost connection. The message says which, and what to do.

    A kind of :class:`DatabaseUnavailable`: the CLI exits with code 4, the API answers 503,
    and workers back off and try again, so once the cause is fixed everything resumes.
    """


class NotAConveyorDatabase(ConfigurationError):
    """The database exists but holds something other than conveyor's tables."""


class UnknownJobType(ConveyorError):
    """No handler is registered for a job type.

    >>> str(UnknownJobType("build_reprot", ["build_report", "send_email"]))
    "unknown job type 'build_reprot' (did you mean 'build_report'?): register it with \
@app.job() (known types: build_report, send_email)"
    """

    def __init__(self, job_type: str, known: list[str]) -> None:
        self.job_type = job_type
        self.known = sorted(known)
        close = difflib.get_close_matches(job_type, self.known, n=1)
        self.suggestion = close[0] if close else None
        super().__init__(
            f"unknown job type {job_type!r}{self._did_you_mean()}: register it with "
            f"@app.job() (known types: {self._known()})"
        )

    def _did_you_mean(self) -> str:
        return f" (did you mean {self.suggestion!r}?)" if self.suggestion else ""

    def _known(self) -> str:
        return ", ".join(self.known) if self.known else "none are registered"

    @property
    def for_client(self) -> str:
        """The message for a client of a server, who cannot register types there."""
        return (
            f"unknown job type {self.job_type!r}{self._did_you_mean()}; this server runs: "
            f"{self._known()}"
        )


class InvalidPayload(ConveyorError):
    """A payload does not match its handler's signature, or is not JSON."""

    def __init__(self, job_type: str, message: str, errors: list[dict[str, Any]] | None = None):
        super().__init__(f"invalid payload for {job_type!r}: {message}")
        self.job_type = job_type
        self.errors = errors or []


class JobNotFound(ConveyorError):
    """No job has the given id."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class InvalidDependency(ConveyorError):
    """``depends_on`` names a job that does not exist, or makes a cycle."""


class IdempotencyConflict(ConveyorError):
    """A job with the same id or key exists with a different definition."""


class TooManyQueued(ConveyorError):
    """A tenant's submit would take it past the most queued jobs its operator allows."""


class InvalidState(ConveyorError):
    """The job's status does not allow the requested action."""


class RetryLimitReached(InvalidState):
    """A job was retried by hand as many times as its type allows (``retry_limit=``)."""


class LeaseHeld(ConveyorError):
    """A named lease is held by another owner."""

    def __init__(self, name: str, holder: str, expires_at: Any) -> None:
        until = f" until {expires_at.isoformat()}" if expires_at is not None else ""
        super().__init__(f"lease {name!r} is held by {holder}{until}; try again later")
        self.name = name
        self.holder = holder
        self.expires_at = expires_at


class ScheduleNotFound(ConveyorError):
    """No schedule has the given name."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}; `conveyor schedules list` shows them")
        self.name = name


class LeaseLost(ConveyorError):
    """This worker no longer holds the job's lease; its writes are refused."""


class Forbidden(ConveyorError):
    """A job type's ``authorize=`` check refused a principal this payload."""


class TokenNotFound(ConveyorError):
    """No API token has the given id."""

    def __init__(self, token_id: str) -> None:
        super().__init__(f"no token with id {token_id!r}; see them with `conveyor tokens list`")
        self.token_id = token_id


__all__ = [
    "ConfigurationError",
    "ConveyorError",
    "DatabaseUnavailable",
    "Forbidden",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidDependency",
    "InvalidPayload",
    "InvalidState",
    "JobNotFound",
    "LeaseHeld",
    "LeaseLost",
    "NotAConveyorDatabase",
    "RetryLimitReached",
    "ScheduleNotFound",
    "StorageError",
    "TokenNotFound",
    "TooManyQueued",
    "UnknownJobType",
]
