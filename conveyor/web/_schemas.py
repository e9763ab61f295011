"""The API's documents: what a request may send and what each answer holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from conveyor.core.ids import ID_PATTERN, check_job_id
from conveyor.core.lifecycle import Status
from conveyor.core.model import RUN_AT_PATTERN, as_utc, check_run_at

# The one pattern for strings the API accepts: any text without NUL, which databases refuse.
NUL_FREE = r"^[^\x00]*$"


def utc(value: datetime | None) -> datetime | None:
    """Return a datetime in UTC, as :func:`~conveyor.core.model.as_utc` does.

    A time that falls outside what datetime holds once converted (year 1 at +05:00) is
    clamped to the first or last representable instant.
    """
    if value is None:
        return None
    try:
        return as_utc(value)
    except OverflowError:
        edge = datetime.min if value.year < 5000 else datetime.max
        return edge.replace(tzinfo=UTC)


def _a_number(value: Any) -> Any:
    if isinstance(value, bool | str):
        raise ValueError("must be a JSON number, not a boolean or a string")
    return value


_NUMBER = BeforeValidator(_a_number)


class JobSubmission(BaseModel):
    """One job to submit; only ``type`` is required."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(
        min_length=1, max_length=200, pattern=NUL_FREE, description="A registered job type."
    )
    payload: dict[str, Any] = Field(
        default_factory=dict, description="The handler's keyword arguments."
    )
    id: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        json_schema_extra={"pattern": ID_PATTERN},
        description=(
            "A client id: submitting the same id again returns the existing job. Letters, "
            "digits and . _ : @ + = - (starting with a letter or digit)."
        ),
    )
    queue: str | None = Field(None, min_length=1, max_length=100, pattern=NUL_FREE)
    # Numbers are numbers: true or "5" is not one (5.0 is, as in JSON Schema).
    priority: Annotated[int, Field(ge=-1_000_000, le=1_000_000), _NUMBER] | None = Field(
        None, description="Lower runs first."
    )
    run_at: Annotated[datetime, Field(json_schema_extra={"pattern": RUN_AT_PATTERN})] | None = (
        Field(None, description="Not before this time (in the years 2000 to 8999).")
    )
    delay: (
        Annotated[float, Field(ge=0, le=10 * 365 * 86400, allow_inf_nan=False), _NUMBER] | None
    ) = Field(None, description="Seconds from now.")
    max_attempts: Annotated[int, Field(ge=1, le=1000), _NUMBER] | None = None
    timeout: Annotated[float, Field(gt=0, le=365 * 86400, allow_inf_nan=False), _NUMBER] | None = (
        Field(None, description="Seconds per attempt.")
    )
    unique_key: str | None = Field(None, min_length=1, max_length=200, pattern=NUL_FREE)
    depends_on: list[Annotated[str, Field(min_length=1, max_length=200, pattern=NUL_FREE)]] = Field(
        default_factory=list, max_length=1000, description="Ids of jobs to wait for."
    )
    tenant: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,99}$",
        description="Admin tokens only: submit for another tenant (default: the token's).",
    )

    @field_validator("id")
    @classmethod
    def _client_id(cls, value: str | None) -> str | None:
        return None if value is None else check_job_id(value)

    @field_validator("run_at")
    @classmethod
    def _run_at_utc(cls, value: datetime | None) -> datetime | None:
        return None if value is None else check_run_at(value)


class ProgressOut(BaseModel):
    done: float
    total: float | None
    message: str | None
    fraction: float | None = Field(description="done/total between 0 and 1, if total is known.")


class JobLinks(BaseModel):
    """Where to go from a job; null where the action or relation does not apply."""

    self: str
    attempts: str
    children: str
    parent: str | None
    root: str | None
    cancel: str | None = Field(description="Set while the job is not terminal.")
    retry: str | None = Field(
        description="Set when the job failed or was cancelled (and no retry replaced it yet)."
    )
    events: str
    retry_failed_children: str


class BelowOut(BaseModel):
    """The jobs below a parent (every level) by status, kept as they change; ``done`` of
    ``total`` have finished. A job a manual retry replaced is not counted; its retry is."""

    pending: int
    queued: int
    running: int
    waiting: int
    succeeded: int
    failed: int
    cancelled: int
    done: int
    total: int


class JobOut(BaseModel):
    """A job: its definition, its status and what it produced."""

    id: str
    type: str
    queue: str
    tenant: str | None
    status: Status
    terminal: bool
    payload: dict[str, Any]
    priority: int
    attempts: int = Field(description="Attempts started so far.")
    max_attempts: int
    progress: ProgressOut | None
    result: Any = Field(description="The handler's JSON result, once succeeded.")
    result_ref: str | None
    error: str | None
    cancel_requested: bool
    parent_id: str | None
    root_id: str | None
    depends_on: list[str]
    unique_key: str | None
    retry_of: str | None = Field(description="A manual retry: the first job of its chain.")
    retry_count: int = Field(description="Manual retries before this job in its chain.")
    retried_by: str | None = Field(description="The manual retry that replaced this job.")
    submitted_by: str = Field(description='Who submitted it: "token:<id>", "local" (code)...')
    below: BelowOut | None = Field(
        description="Read as one job: the jobs below it by status (null if none, and in lists)."
    )
    timeout: float | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    links: JobLinks


class JobListOut(BaseModel):
    """A page of jobs; ``next`` is the URL of the following page, null on the last one."""

    jobs: list[JobOut]
    next: str | None


class AttemptOut(BaseModel):
    job_id: str
    number: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    outcome: Literal["succeeded", "failed", "timed_out", "cancelled", "lost"]
    error: str | None
    traceback: str | None


class AttemptListOut(BaseModel):
    attempts: list[AttemptOut]


class EventOut(BaseModel):
    job_id: str
    at: datetime
    event: str = Field(description="reopened: a manual retry below it made it wait again.")
    detail: str | None


class EventListOut(BaseModel):
    events: list[EventOut]


class RetriedOut(BaseModel):
    """The jobs a "retry failed children" created."""

    retried: list[JobOut]


class WorkerOut(BaseModel):
    id: str
    hostname: str | None  # null for tokens that are not admins'
    pid: int | None
    queues: list[str]
    concurrency: int
    started_at: datetime | None
    heartbeat_at: datetime | None
    stopped_at: datetime | None
    state: Literal["running", "stopped"]
    live: bool = Field(
        description="It heartbeated within its lease: it claims jobs of its queues now "
        "(a running worker that fell silent for longer is dead)."
    )


class WorkerListOut(BaseModel):
    workers: list[WorkerOut]


class QueueOut(BaseModel):
    name: str
    paused: bool
    counts: dict[str, int] = Field(description="Jobs per status.")


class QueueListOut(BaseModel):
    queues: list[QueueOut]


class ScheduleOut(BaseModel):
    name: str
    cron: str
    timezone: str
    type: str
    queue: str
    overlap: Literal["allow", "skip"] = Field(
        description="allow: every tick fires; skip: a tick is skipped while the previous "
        "run is pending, queued, running or waiting"
    )
    skipped_ticks: int = Field(description="Ticks skipped so far under overlap=skip")
    enabled: bool
    next_run_at: datetime
    last_run_at: datetime | None


class ScheduleListOut(BaseModel):
    schedules: list[ScheduleOut]


class LiveOut(BaseModel):
    status: Literal["alive"]


class HealthOut(BaseModel):
    """The cluster's health (SPEC §9): a verdict; with an API token also the workers'
    counts and newest heartbeat, and with an admin token the job counts."""

    status: Literal["healthy", "degraded", "unhealthy"]
    queued: int | None = None
    due: int | None = Field(None, description="Queued jobs whose run_at has passed.")
    running: int | None = None
    stale_running: int | None = Field(None, description="Running jobs whose lease expired.")
    workers: int | None = Field(None, description="Workers ever registered.")
    live_workers: int | None = Field(
        None,
        description="Workers not stopped whose newest heartbeat is younger than their lease.",
    )
    dead_workers: int | None = Field(
        None, description="Workers not stopped but silent for longer than their lease."
    )
    last_heartbeat: datetime | None = None
    heartbeat_age: float | None = Field(None, description="Seconds since the newest heartbeat.")
    hint: str | None = Field(
        None,
        description="Why the verdict is not healthy, and what to do (null when healthy).",
    )
    error: str | None = Field(None, description="Why the database could not be read.")
