"""The one seam between conveyor and its storage.

A backend implements :class:`Store` with operations named after what happens to jobs.
It owns every query, the maintenance ones included; every write a worker makes is fenced
by the lease token and reports refusal rather than raising.

:class:`Store` is the union of role protocols, each operation in one of them: what a
submitter needs (:class:`SubmitStore`), a worker (:class:`WorkerStore`), the maintenance
duties (:class:`MaintenanceStore`), the readers of the dashboard, API and CLI
(:class:`ReadStore`), operators (:class:`OperatorStore`), named locks
(:class:`LockStore`) and API tokens (:class:`TokenStore`), over the shared
:class:`JobReads`, :class:`Clock` and :class:`StoreLifecycle`. Code that uses a store for
one role is typed against that role, so it sees only what it needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from conveyor.core.auth import Token
from conveyor.core.cron import Schedule
from conveyor.core.filter import JobFilter
from conveyor.core.flow import TenantLimit
from conveyor.core.lifecycle import Status
from conveyor.core.model import JSON, Attempt, Job, NewJob, Progress, Settlement


@dataclass(slots=True)
class Submitted:
    """A submitted job and whether this call created it (False: it existed already); to
    be treated as read-only (not frozen: one is made per submitted job, and a frozen
    dataclass's ``__init__`` costs three times as much)."""

    job: Job
    created: bool


@dataclass(slots=True)
class Inserted:
    """Jobs a store has just inserted as they were submitted, all of them created and
    queued: the chunks of jobs it took, each job's run time and their one creation time.

    What a large batch's COPY returns (PostgreSQL): a :class:`Submitted` and a
    :class:`Job` per job cost the client more than the rest of the job's submit, and a
    batch's handles are mostly never read, so they are made from this when asked for.
    """

    chunks: list[Sequence[NewJob]]
    run_at: list[datetime]
    created_at: datetime
    # How far apart the jobs' creation times are: nothing where they share one
    # (PostgreSQL), a microsecond where each job's is its own (SQLite, whose table is
    # keyed by it). The first job's is created_at.
    created_step: timedelta = timedelta(0)

    def submitted(self) -> list[Submitted]:
        """The jobs as :meth:`SubmitStore.submit` returns them."""
        queued = Status.QUEUED
        jobs = [job for chunk in self.chunks for job in chunk]
        return [
            Submitted(job.stored(queued, run_at, self.creation(i)), created=True)
            for i, (job, run_at) in enumerate(zip(jobs, self.run_at, strict=True))
        ]

    def creation(self, index: int) -> datetime:
        """The creation time of the batch's job ``index`` (counted across chunks)."""
        if not index or not self.created_step:
            return self.created_at
        return self.created_at + index * self.created_step


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease a worker holds: the job and its fencing token."""

    job_id: str
    token: int


@dataclass(frozen=True, slots=True)
class Beat:
    """What a heartbeat learned: leases lost, leases left for the next beat, cancel requests.

    A *busy* job's row was locked by another transaction (its settle, a rescue, a cancel):
    its lease was neither renewed nor found lost, and its progress was not written.
    """

    lost: frozenset[str] = frozenset()
    cancel_requested: frozenset[str] = frozenset()
    busy: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker process as registered in the database."""

    id: str
    hostname: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    stopped_at: datetime | None = None
    # Its lease and heartbeat interval in seconds: health judges the worker by them.
    lease: float = 60.0
    heartbeat_interval: float = 20.0
    # The job types it has handlers for, the only ones it claims (None: a worker from
    # before workers recorded them, which claims any type).
    types: tuple[str, ...] | None = None
    # Seconds after its last heartbeat when the registry forgets it (dead or stopped):
    # health counts a death only inside this window; attempts keep its history.
    forget_after: float = 3600.0

    def state(self, now: datetime) -> str:
        """``stopped``, ``dead`` (silent for longer than its lease), or ``live``."""
        if self.stopped_at is not None:
            return "stopped"
        if self.heartbeat_at is None or (now - self.heartbeat_at).total_seconds() > self.lease:
            return "dead"
        return "live"


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue with its counts per status and whether it is paused."""

    name: str
    paused: bool
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class JobPageQuery:
    """One page of the jobs ``filter`` shows, in creation order, with keyset pagination.

    ``after`` is the ``(created_at, id)`` of the last job of the previous page; the page
    holds the jobs that sort after it (older ones when ``newest_first``).
    """

    filter: JobFilter = field(default_factory=JobFilter)
    newest_first: bool = True
    after: tuple[datetime, str] | None = None
    limit: int = 50


@dataclass(frozen=True, slots=True)
class HealthCounts:
    """What the store knows about the cluster's health, read in one query."""

    queued: int
    due: int  # queued and runnable now
    running: int
    stale_running: int  # running with an expired lease, not yet rescued
    workers: int  # workers ever registered
    live_workers: int  # not stopped, newest heartbeat younger than the worker's lease
    last_heartbeat: datetime | None
    now: datetime
    # Not stopped, silent for longer than their lease, but not for longer than their
    # forget window: deaths older than that no longer count against health.
    dead_workers: int = 0


@dataclass(frozen=True, slots=True)
class UnservedType:
    """Queued jobs of a type that no live worker serves (none has the type and its queue)."""

    type: str
    queued: int


@dataclass(frozen=True, slots=True)
class Rescued:
    """A job whose lease expired, and what became of it."""

    job_id: str
    worker_id: str | None
    status: Status


@dataclass(frozen=True, slots=True)
class QueueLag:
    """A queue's due jobs: how many, and how long the oldest has waited (seconds)."""

    queue: str
    due: int
    oldest_age: float


@dataclass(frozen=True, slots=True)
class Limits:
    """Flow control a claim must respect, per job type.

    ``local``: how many more jobs of a type this worker may start now. ``cluster``: at
    most this many running across all workers (running jobs whose lease expired do not
    count). ``per_key``: at most this many running per ``concurrency_key``. ``rate``:
    at most ``count`` starts in any ``window`` seconds, across all workers. ``tenants``:
    the operator's limits per tenant (``"*"``: of every tenant without its own).
    """

    local: Mapping[str, int] = field(default_factory=dict)
    cluster: Mapping[str, int] = field(default_factory=dict)
    per_key: Mapping[str, int] = field(default_factory=dict)
    rate: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    tenants: Mapping[str, TenantLimit] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.local or self.cluster or self.per_key or self.rate or self.tenants)


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A schedule as stored, with its state."""

    schedule: Schedule
    enabled: bool
    next_run_at: datetime
    last_run_at: datetime | None = None
    skipped_ticks: int = 0  # ticks skipped by overlap="skip" while a run was unfinished


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """A holder of a named lease, current or past."""

    name: str
    owner: str
    token: int
    acquired_at: datetime
    expires_at: datetime | None = None  # current holders
    ended_at: datetime | None = None  # past holders
    ended: str | None = None  # "released" or "expired"


@dataclass(frozen=True, slots=True)
class Retention:
    """How long finished jobs are kept, per status, with per-type overrides (seconds)."""

    succeeded: float = 86_400.0
    failed: float = 7 * 86_400.0
    cancelled: float = 7 * 86_400.0
    per_type: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def seconds(self, status: str, job_type: str | None = None) -> float:
        override = self.per_type.get(job_type or "", {})
        return float(override.get(status, getattr(self, status)))


class StoreLifecycle(Protocol):
    """Opening and closing a store, and migrating its database: whoever owns one."""

    async def open(self) -> None:
        """Connect, check that the database is conveyor's, and migrate it if asked."""

    async def close(self) -> None:
        """Release connections and threads."""

    async def migrate(self) -> list[str]:
        """Apply pending migrations; return the names of those applied.

        May be called on a store that is not open: it connects first (and stays connected
        until :meth:`close`).
        """


class Clock(Protocol):
    """The store's time, which decides every due time and lease."""

    async def now(self) -> datetime:
        """Return the store's clock (the database's, where it has one)."""


class JobReads(Protocol):
    """Reading jobs by id: every role that acts on jobs reads them back."""

    async def get(self, job_id: str) -> Job | None:
        """Return one job, or None, with ``below``: the counts of the jobs below it."""

    async def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        """Return the jobs that exist among ``job_ids``."""

    async def attempts(self, job_id: str) -> list[Attempt]:
        """Return a job's attempts, oldest first."""

    async def job_events(self, job_id: str) -> list[JobEvent]:
        """A job's events besides its attempts, oldest first."""


class SubmitStore(JobReads, Clock, Protocol):
    """What a submitter needs: inserting jobs, and the count a tenant's limit on queued
    jobs is checked against."""

    async def submit(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> list[Submitted]:
        """Insert jobs in one transaction; an existing id or active unique key returns its job.

        ``connection`` is the application's own database connection (PostgreSQL only):
        the jobs are written in its transaction and exist only if it commits.
        """

    async def count_queued(self, tenant: str) -> int:
        """How many jobs ``tenant`` has queued."""


class WorkerStore(JobReads, Protocol):
    """What a worker needs to run jobs: claims, leases renewed, attempts settled,
    checkpoints and children written through its lease, its registration and wake-ups."""

    async def claim(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        limit: int,
        lease: float,
        types: Sequence[str] | None = None,
        limits: Limits | None = None,
        on_claimed: Callable[[Sequence[Job]], None] | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` due jobs: status running, new token, attempt + 1.

        Only jobs of ``types`` are claimed: a worker names the types it has handlers for,
        so a type it lacks waits, its attempts unspent, for a worker that knows it
        (during a rolling deploy). ``None``, for tests and tools, claims any type: the
        store first reads which types have queued jobs, one more round trip.
        Jobs held back by ``limits`` stay queued and do not block other types or keys.
        ``on_claimed`` is called with the claimed jobs on the store's own thread as soon
        as the claim has committed, before the caller's event loop hears of it, even if
        the caller has stopped waiting: a worker hands the leases to its heartbeat
        there, however long its event loop is busy. It must be quick and thread-safe.
        """

    async def heartbeat(
        self,
        *,
        worker_id: str,
        leases: Sequence[Lease],
        lease: float,
        progress: Mapping[Lease, Progress],
    ) -> Beat:
        """Renew all of a worker's leases in one statement and write buffered progress."""

    async def settle(self, settlements: Sequence[Settlement]) -> list[str]:
        """Record the end of attempts; return the ids whose lease was lost (refused)."""

    async def checkpoint(self, lease: Lease, state: JSON) -> bool:
        """Store a job's state; False when the lease was lost."""

    async def spawn(
        self,
        lease: Lease,
        jobs: Sequence[NewJob],
        callbacks: Mapping[str, NewJob] | None = None,
    ) -> list[Submitted] | None:
        """Insert children of the leased job (parent and root set here), fenced by the lease.

        ``callbacks`` by kind (``complete``, ``success``) are submitted when everything
        below the job has ended. Returns None, inserting nothing, when the lease was lost.
        """

    async def wait_for_jobs(self, timeout: float) -> frozenset[str]:
        """Return when new work may be available, or after ``timeout`` seconds.

        The result holds the ids of running jobs whose cancellation was requested
        meanwhile, where the backend learns of them at once (PostgreSQL notifications);
        other backends report cancel requests through :meth:`heartbeat` only.
        """

    async def register_worker(self, worker: WorkerInfo) -> None:
        """Record a worker process as started."""

    async def deregister_worker(self, worker_id: str) -> None:
        """Record a worker process as stopped."""


class MaintenanceStore(JobReads, Clock, Protocol):
    """What the maintenance duties need: rescue, parents, schedule ticks, pruning,
    forgetting silent workers."""

    async def rescue(self, *, limit: int, jitter: float) -> list[Rescued]:
        """Settle up to ``limit`` jobs whose lease expired as ``lost`` attempts."""

    async def finish_parents(self, *, limit: int) -> list[str]:
        """End waiting parents whose children have all ended; return their ids.

        Settling a child already does this in the same transaction; this duty is the
        safety net for parents left waiting (for instance by a race between backends'
        transactions), and is safe to run on every worker at once.
        """

    async def sync_schedules(self, schedules: Sequence[Schedule]) -> None:
        """Create or update schedules declared in code (a changed cron restarts its ticks)."""

    async def fire_schedules(self, *, limit: int, min_grace: float = 0.0) -> list[str]:
        """Fire due schedule ticks; return the ids of the jobs created.

        Each tick fires once across all workers: the schedule's next tick is advanced by
        compare-and-set in the same transaction as the insert of a job whose id derives
        from the schedule and the tick. A tick at most ``min_grace`` seconds late counts
        as on time whatever the schedule's own grace (see ``core.cron.plan_schedule``).
        """

    async def prune(self, retention: Retention, *, limit: int) -> int:
        """Delete up to ``limit`` finished trees older than their retention; return jobs deleted."""

    async def forget_workers(self, *, limit: int) -> list[str]:
        """Delete up to ``limit`` workers silent for longer than their own forget window
        (dead or stopped); return their ids. Their attempts keep their history."""


class ReadStore(JobReads, Clock, Protocol):
    """What the dashboard, the API and the CLI read: pages of jobs, queues, workers,
    schedules, health, the audit log and per-minute figures."""

    async def page_jobs(self, query: JobPageQuery) -> list[Job]:
        """Return one page of jobs matching ``query``, in creation order."""

    async def queues(self, *, tenant: str | None = None) -> list[QueueInfo]:
        """Return every known queue with its counts (``tenant``: of that tenant's jobs only,
        with the queues it has jobs in and the paused ones)."""

    async def workers(self) -> list[WorkerInfo]:
        """Return workers, live ones first."""

    async def unserved_types(self) -> list[UnservedType]:
        """Return the types of queued jobs that no live worker serves, by name: none
        heartbeating within its lease has the job's queue among its queues and the type
        among its types (a worker with no recorded types serves every type)."""

    async def schedules(self) -> list[ScheduleInfo]:
        """Return every schedule."""

    async def health(self) -> HealthCounts:
        """Return the counts the health check decides from."""

    async def queue_lag(self) -> list[QueueLag]:
        """Return, per queue with due jobs, their number and the oldest one's wait."""

    async def audit_log(
        self, *, tenant: str | None = None, before_id: int | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        """Return audit entries newest first; ``tenant`` only that tenant's; keyset on id."""

    async def minute_stats(
        self, since: datetime, *, tenant: str | None = None
    ) -> list[MinuteStats]:
        """Per minute since ``since``: jobs that ended succeeded or failed, and their mean
        queue wait, read by a range of the index on ``finished_at``; of ``tenant``'s jobs
        only when one is named."""

    async def running_by_worker(self, *, tenant: str | None = None) -> dict[str, int]:
        """Count running jobs per worker id, on the index of running jobs' leases
        (``tenant``: that tenant's jobs only)."""

    async def lease_history(self, name: str) -> list[LeaseRecord]:
        """Return the last holders of a lease, newest first."""

    async def lease_names(self, *, limit: int = 200) -> list[str]:
        """Return the names of named leases ever taken, by name."""


class OperatorStore(ReadStore, Protocol):
    """What an operator does besides reading: cancel, retry, pause, run or switch
    schedules, and the audit entry recording it."""

    async def cancel(self, job_id: str, *, reason: str) -> Job | None:
        """Cancel a job that has not started, or ask its worker to stop a running one.

        A waiting job is cancelled with its unfinished descendants (running ones are asked
        to stop); pending dependents of every job cancelled here are cancelled too.
        """

    async def retry(self, job_id: str, new: NewJob) -> Job | None:
        """Submit ``new`` as the retry of a failed or cancelled job (else InvalidState).

        The new job takes the old one's place below its parents (the old row only records
        ``retried_by``; a job is retried once), and the ancestors that failed go back to
        ``waiting``. Returns None when ``job_id`` does not exist.
        """

    async def retry_many(self, retries: Sequence[tuple[str, NewJob]]) -> list[Job]:
        """Retry many jobs as :meth:`retry` does, in one transaction; return the new jobs
        (a job no longer failed or cancelled, or already retried, is left out)."""

    async def note_retry_limit(self, job_id: str, error: str) -> Job | None:
        """Write ``error`` on a failed or cancelled job whose retry was refused."""

    async def failed_below(self, job_id: str, *, limit: int) -> list[str]:
        """The failed jobs below ``job_id`` that no retry replaced yet and below which
        nothing failed: the ones a "retry failed children" retries."""

    async def set_paused(self, queue: str, paused: bool) -> None:
        """Pause or resume claiming from a queue."""

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleInfo | None:
        """Enable or disable a schedule; None if it does not exist."""

    async def run_schedule(self, name: str) -> Job | None:
        """Submit a schedule's job now, outside its ticks; None if it does not exist."""

    async def record_audit(self, entry: AuditEntry) -> None:
        """Append an entry to the audit log (who did what, when, on what)."""


class LockStore(Protocol):
    """Named locks (``app.lease``): taken, renewed and given up by token."""

    async def acquire_lease(self, name: str, *, owner: str, ttl: float) -> LeaseRecord:
        """Take a named lease with a new token, or return its current holder unchanged.

        The caller holds the lease when the returned record's owner is ``owner``.
        """

    async def renew_lease(self, name: str, *, token: int, ttl: float) -> datetime | None:
        """Extend a held lease; None when the token no longer holds it."""

    async def release_lease(self, name: str, *, token: int) -> bool:
        """Give a lease up; False when the token no longer held it."""


class TokenStore(Clock, Protocol):
    """API tokens and the servers' secrets."""

    async def create_token(self, token: Token) -> None:
        """Store a new API token (its secret's digest only)."""

    async def find_token(self, token_id: str) -> Token | None:
        """Return a token by id, revoked or not, or None."""

    async def touch_token(self, token_id: str) -> None:
        """Record that a token was just used."""

    async def revoke_token(self, token_id: str) -> Token | None:
        """Revoke a token (once; revoking again keeps the first time); None if unknown."""

    async def list_tokens(self) -> list[Token]:
        """Return every token, newest first."""

    async def rotate_token(
        self, token_id: str, *, secret_hash: str, grace_until: datetime | None
    ) -> Token | None:
        """Give a live token a new secret digest; the previous one stays valid until
        ``grace_until`` (None: at once invalid). None if unknown or revoked."""

    async def server_secret(self, name: str) -> str | None:
        """Return a secret the migrations made for this database's servers."""


class Store(
    StoreLifecycle,
    SubmitStore,
    WorkerStore,
    MaintenanceStore,
    OperatorStore,
    LockStore,
    TokenStore,
    Protocol,
):
    """Storage operations, named after what happens to jobs: every role's, which a backend
    implements. A caller that needs one role is typed against it, and sees only that."""


@dataclass(frozen=True, slots=True)
class JobEvent:
    """Something that happened to a job besides its attempts (``reopened``: a manual
    retry of a job below it moved it back to waiting)."""

    job_id: str
    at: datetime
    event: str
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One action taken through the API or the dashboard: who, what, when, on what."""

    at: datetime
    tenant: str
    token_id: str
    action: str  # e.g. "job.cancel", "queue.pause", "schedule.run"
    target: str  # what it acted on: a job id, a queue or schedule name
    detail: str | None = None
    id: int | None = None  # assigned by the store


@dataclass(frozen=True, slots=True)
class MinuteStats:
    """What ended during one minute."""

    minute: datetime
    succeeded: int
    failed: int
    wait_seconds: float | None  # mean of started_at - run_at over the jobs that ended
