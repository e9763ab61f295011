"""SQLite implementation of the store protocol."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from conveyor.core.auth import Role, Token
from conveyor.core.cron import CatchUp, Cron, Schedule, plan_schedule, schedule_job
from conveyor.core.flow import FlowCapacity
from conveyor.core.lifecycle import (
    Status,
    children_error,
    children_event,
    dependency_event,
    returned_event,
    transition,
)
from conveyor.core.model import (
    JSON,
    Attempt,
    Job,
    NewJob,
    Outcome,
    Progress,
    Settlement,
    after_failure,
)
from conveyor.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidDependency,
    InvalidState,
    NotAConveyorDatabase,
)
from conveyor.store._queries import load_migrations, load_queries
from conveyor.store._rows import STATUS, job_picker
from conveyor.store.protocol import (
    Beat,
    HealthCounts,
    JobPageQuery,
    JobQuery,
    Lease,
    LeaseRecord,
    Limits,
    QueueInfo,
    Rescued,
    Retention,
    ScheduleInfo,
    Submitted,
    WorkerInfo,
)
from conveyor.store.sqlite._errors import rollback, translated

T = TypeVar("T")

_Q = load_queries("conveyor.store.sqlite")
_MIGRATIONS = load_migrations("conveyor.store.sqlite")
_BUSY_TIMEOUT_MS = 30_000
# An idle worker notices a commit from another process by polling PRAGMA data_version,
# which reads shared memory only; 2 ms keeps enqueue-to-start latency low at ~1% CPU.
_WATCH_INTERVAL = 0.002


def _ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _epoch(value: datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _dumps(value: JSON) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


def _one(cursor: sqlite3.Cursor) -> Any:
    """Return the first row and step the statement to its end, so no statement stays open."""
    rows = cursor.fetchall()
    return rows[0] if rows else None


def _switch_to_wal(conn: sqlite3.Connection) -> str:
    """Put the file in WAL mode (a no-op once it is); return the journal mode it is in.

    When several processes open a new file at once, SQLite can refuse the switch with
    "database is locked" at once, without waiting for the busy timeout (it does so
    where waiting could deadlock: this connection reads the file while another waits to
    write it). The refused statement holds no lock, so trying again soon succeeds.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            mode: str = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            return mode
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 0.1)


def _jobs(cursor: sqlite3.Cursor) -> list[Job]:
    """Read every row of a query of conveyor_jobs as a Job."""
    rows = cursor.fetchall()
    if not rows:
        return []
    pick = job_picker(tuple(d[0] for d in cursor.description))
    return [_job_of(*pick(row)) for row in rows]


def _job(row: sqlite3.Row) -> Job:
    return _job_of(*job_picker(tuple(row.keys()))(row))


def _job_of(
    id: str, type: str, queue: str, tenant: str | None, payload: str, status: str,
    priority: int, attempt: int, max_attempts: int, run_at: float, created_at: float,
    timeout: float | None, lease_seconds: float | None, backoff_base: float,
    backoff_cap: float, progress_done: float | None, progress_total: float | None,
    progress_message: str | None, state: str | None, result: str | None,
    result_ref: str | None, error: str | None, parent_id: str | None, root_id: str | None,
    depends_on: str | None, unique_key: str | None, concurrency_key: str | None,
    retry_of: str | None, started_at: float | None, finished_at: float | None,
    lease_owner: str | None, lease_expires_at: float | None, lease_token: int,
    cancel_requested: int,
) -> Job:  # fmt: skip
    return Job(
        id=id,
        type=type,
        queue=queue,
        tenant=tenant,
        payload=json.loads(payload),
        status=STATUS[status],
        priority=priority,
        attempt=attempt,
        max_attempts=max_attempts,
        run_at=datetime.fromtimestamp(run_at, UTC),
        created_at=datetime.fromtimestamp(created_at, UTC),
        timeout=timeout,
        lease=lease_seconds,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        progress=None
        if progress_done is None
        else Progress(done=progress_done, total=progress_total, message=progress_message),
        state=None if state is None else json.loads(state),
        result=None if result is None else json.loads(result),
        result_ref=result_ref,
        error=error,
        parent_id=parent_id,
        root_id=root_id,
        depends_on=tuple(json.loads(depends_on)) if depends_on else (),
        unique_key=unique_key,
        concurrency_key=concurrency_key,
        retry_of=retry_of,
        started_at=None if started_at is None else datetime.fromtimestamp(started_at, UTC),
        finished_at=None if finished_at is None else datetime.fromtimestamp(finished_at, UTC),
        lease_owner=lease_owner,
        lease_expires_at=None
        if lease_expires_at is None
        else datetime.fromtimestamp(lease_expires_at, UTC),
        lease_token=lease_token,
        cancel_requested=bool(cancel_requested),
    )


def parse_sqlite_url(url: str) -> str:
    """Return the file path of a ``sqlite:///path`` URL (``sqlite:///:memory:`` is refused).

    >>> parse_sqlite_url("sqlite:///conveyor.db")
    'conveyor.db'
    >>> parse_sqlite_url("sqlite:////var/lib/app/jobs.db")
    '/var/lib/app/jobs.db'
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigurationError(
            f"malformed SQLite URL {url!r}: write sqlite:///relative/path.db "
            "or sqlite:////absolute/path.db"
        )
    path = url[len(prefix) :].split("?", 1)[0]
    if path == ":memory:":
        raise ConfigurationError(
            "sqlite:///:memory: cannot be shared between a worker and its clients: "
            "use a file such as sqlite:///conveyor.db"
        )
    return path


def _schedule_params(s: Schedule) -> dict[str, Any]:
    return {
        "name": s.name,
        "cron": s.cron.expression,
        "timezone": s.cron.timezone,
        "type": s.type,
        "payload": json.dumps(s.payload, separators=(",", ":")),
        "queue": s.queue,
        "priority": s.priority,
        "max_attempts": s.max_attempts,
        "timeout": s.timeout,
        "lease_seconds": s.lease,
        "backoff_base": s.backoff_base,
        "backoff_cap": s.backoff_cap,
        "catch_up": s.catch_up.value,
        "backfill_limit": s.backfill_limit,
        "grace": s.grace,
    }


def _schedule(row: sqlite3.Row) -> ScheduleInfo:
    return ScheduleInfo(
        schedule=Schedule(
            name=row["name"],
            cron=Cron(row["cron"], row["timezone"]),
            type=row["type"],
            payload=json.loads(row["payload"]),
            queue=row["queue"],
            priority=row["priority"],
            max_attempts=row["max_attempts"],
            timeout=row["timeout"],
            lease=row["lease_seconds"],
            backoff_base=row["backoff_base"],
            backoff_cap=row["backoff_cap"],
            catch_up=CatchUp(row["catch_up"]),
            backfill_limit=row["backfill_limit"],
            grace=row["grace"],
        ),
        enabled=bool(row["enabled"]),
        next_run_at=datetime.fromtimestamp(row["next_run_at"], UTC),
        last_run_at=_ts(row["last_run_at"]),
    )


def _lease(row: sqlite3.Row) -> LeaseRecord:
    return LeaseRecord(
        name=row["name"],
        owner=row["owner"] or "",
        token=row["token"],
        acquired_at=datetime.fromtimestamp(row["acquired_at"] or 0, UTC),
        expires_at=_ts(row["expires_at"]),
    )


class SQLiteStore:
    """A store on one SQLite file."""

    def __init__(
        self, path: str, *, clock: Callable[[], float] = time.time, migrate: bool = True
    ) -> None:
        self.path = path
        self._clock = clock
        self._auto_migrate = migrate
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._watcher: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._wake: asyncio.Event | None = None
        self._commits = 0

    # -- plumbing -----------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None or self._conn is None:
            raise RuntimeError("the store is not open: call open() first")
        conn = self._conn
        with translated(self.path):
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, conn)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` inside one ``BEGIN IMMEDIATE`` transaction."""

        def tx(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise
            self._commits += 1  # read by the watcher: this commit is not news
            return result

        return await self._run(tx)

    def _connect(self) -> sqlite3.Connection:
        path = Path(self.path)
        if path.is_dir():
            raise ConfigurationError(f"database path {self.path!r} is a directory: name a file")
        if not path.parent.exists():
            raise ConfigurationError(
                f"cannot create database {self.path!r}: folder {str(path.parent)!r} does not "
                "exist; create it or choose another path"
            )
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise ConfigurationError(
                f"database {self.path!r} is not readable and writable by this user: "
                "fix its permissions or choose another path"
            )
        if not path.exists() and not os.access(path.parent, os.W_OK):
            raise ConfigurationError(
                f"cannot create database {self.path!r}: folder {str(path.parent)!r} is not "
                "writable; fix its permissions or choose another path"
            )
        try:
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30
            )
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            mode = _switch_to_wal(conn)
            conn.execute("PRAGMA synchronous = FULL")
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise NotAConveyorDatabase(
                    f"{self.path!r} is not a SQLite database ({exc}): point "
                    "CONVEYOR_DATABASE_URL at a conveyor database or a new file"
                ) from exc
            raise DatabaseUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
        if mode.lower() != "wal":
            conn.close()
            raise ConfigurationError(
                f"cannot switch {self.path!r} to WAL journal mode (got {mode!r}): "
                "conveyor needs WAL to share the file between processes"
            )
        return conn

    async def open(self) -> None:
        if self._executor is not None:
            return
        try:
            await self._connect_once()
            version = await self._run(self._schema_version)
            if version < len(_MIGRATIONS):
                if not self._auto_migrate:
                    raise ConfigurationError(
                        f"database {self.path!r} needs migrations: run `conveyor migrate`"
                    )
                await self.migrate()
        except BaseException:
            await self.close()
            raise

    async def _connect_once(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conveyor-sqlite")
            self._conn = await asyncio.get_running_loop().run_in_executor(
                self._executor, self._connect
            )

    async def close(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=1)
            self._watcher = None
        if self._executor is not None:
            conn, self._conn = self._conn, None
            if conn is not None:
                self._executor.submit(conn.close).result()
            self._executor.shutdown(wait=True)
            self._executor = None

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "conveyor_migrations" in tables:
            row = conn.execute("SELECT max(version) FROM conveyor_migrations").fetchone()
            return int(row[0] or 0)
        others = sorted(t for t in tables if not t.startswith("sqlite_"))
        if others:
            raise NotAConveyorDatabase(
                f"{self.path!r} is a SQLite database but not conveyor's (it has tables "
                f"{', '.join(others[:5])}): use a new file for conveyor"
            )
        return 0

    async def migrate(self) -> list[str]:
        await self._connect_once()
        await self._run(self._schema_version)  # refuses a database that is not conveyor's

        def apply(conn: sqlite3.Connection) -> list[str]:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS conveyor_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in conn.execute("SELECT version FROM conveyor_migrations")}
            applied = []
            for version, name, sql in _MIGRATIONS:
                if version in done:
                    continue
                # Comments may hold semicolons; statements are split only outside them.
                code = "\n".join(
                    line for line in sql.splitlines() if not line.lstrip().startswith("--")
                )
                for statement in code.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(
                    "INSERT INTO conveyor_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, self._clock()),
                )
                applied.append(name)
            return applied

        return await self._write(apply)

    async def now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    # -- jobs ---------------------------------------------------------------------------

    async def submit(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> list[Submitted]:
        if connection is not None:
            raise ConfigurationError(
                "submit(connection=...) is supported on PostgreSQL only: on SQLite, jobs "
                "are written by conveyor's own connection; leave connection out"
            )
        now = self._clock()
        rows = [self._new_job_params(job, now) for job in jobs]
        # Without dependencies (which must find the jobs before them), many jobs go in
        # one statement; those it did not create (an id or unique key taken) take the
        # one-by-one path, which finds the job holding it.
        together = len(jobs) > 1 and not any(job.depends_on for job in jobs)

        def insert(conn: sqlite3.Connection) -> list[Submitted]:
            created: dict[str, tuple[str, str, float, float]] = {}
            if together:
                params = {"jobs": json.dumps(rows), "now": now}
                created = {r[0]: r for r in conn.execute(_Q["insert_jobs"], params)}
            results = []
            for job, params in zip(jobs, rows, strict=True):
                # pop: when an id repeats within the batch, only its first job is created.
                row = created.pop(job.id, None)
                if row is None:
                    results.append(self._insert(conn, job, params, now))
                    continue
                _, status, run_at, created_at = row
                stored = job.stored(
                    STATUS[status],
                    datetime.fromtimestamp(run_at, UTC),
                    datetime.fromtimestamp(created_at, UTC),
                )
                results.append(Submitted(stored, created=True))
            return results

        return await self._write(insert)

    def _insert(
        self, conn: sqlite3.Connection, job: NewJob, params: dict[str, Any], now: float
    ) -> Submitted:
        """Insert one job (and its dependency edges), or return the job that holds its id."""
        blocked_by: tuple[str, Status] | None = None
        if job.depends_on:
            found = {
                r["id"]: Status(r["status"])
                for r in conn.execute(_Q["get_many"], {"ids": json.dumps(list(job.depends_on))})
            }
            missing = [d for d in job.depends_on if d not in found]
            if missing:
                raise InvalidDependency(
                    f"job {job.id!r} depends on jobs that do not exist: {', '.join(missing)}; "
                    "submit those first (or in the same batch, before it)"
                )
            if all(st is Status.SUCCEEDED for st in found.values()):
                params = params | {"status": Status.QUEUED.value}
            blocked_by = next(
                ((d, st) for d, st in found.items() if dependency_event(st) is not None), None
            )
        row = _one(conn.execute(_Q["insert_job"], params))
        if row is not None:
            for upstream in job.depends_on:
                conn.execute(_Q["insert_dependency"], {"job_id": job.id, "depends_on_id": upstream})
            if blocked_by is not None:
                upstream, status = blocked_by
                reason = f"dependency {upstream} {status.value}"
                conn.execute(_Q["cancel_pending"], {"id": job.id, "reason": reason, "now": now})
                row = _one(conn.execute(_Q["get_job"], {"id": job.id}))
            return Submitted(_job(row), created=True)
        existing = _one(conn.execute(_Q["get_job"], {"id": params["id"]}))
        if existing is None and params["unique_key"] is not None:
            existing = _one(
                conn.execute(_Q["get_active_by_unique_key"], {"unique_key": params["unique_key"]})
            )
        if existing is None:
            raise RuntimeError(f"job {params['id']!r} was neither inserted nor found")
        return Submitted(_job(existing), created=False)

    @staticmethod
    def _new_job_params(job: NewJob, now: float) -> dict[str, Any]:
        run_at = _epoch(job.run_at) if job.run_at is not None else now + job.delay
        return {
            "id": job.id,
            "type": job.type,
            "queue": job.queue,
            "tenant": job.tenant,
            "payload": json.dumps(job.payload, separators=(",", ":")),
            "status": (Status.PENDING if job.depends_on else Status.QUEUED).value,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "run_at": run_at,
            "timeout": job.timeout,
            "lease_seconds": job.lease,
            "backoff_base": job.backoff_base,
            "backoff_cap": job.backoff_cap,
            "state": _dumps(job.state),
            "parent_id": job.parent_id,
            "root_id": job.root_id,
            "depends_on": json.dumps(list(job.depends_on)) if job.depends_on else None,
            "unique_key": job.unique_key,
            "concurrency_key": job.concurrency_key,
            "retry_of": job.retry_of,
            "now": now,
        }

    async def get(self, job_id: str) -> Job | None:
        def read(conn: sqlite3.Connection) -> Job | None:
            row = _one(conn.execute(_Q["get_job"], {"id": job_id}))
            return None if row is None else _job(row)

        return await self._run(read)

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        params = {
            "statuses": json.dumps([s.value for s in query.status]) if query.status else None,
            "type": query.type,
            "queue": query.queue,
            "tenant": query.tenant,
            "parent_id": query.parent_id,
            "root_id": query.root_id,
            "before_id": query.before_id,
            "limit": query.limit,
        }

        def read(conn: sqlite3.Connection) -> list[Job]:
            return _jobs(conn.execute(_Q["list_jobs"], params))

        return await self._run(read)

    async def attempts(self, job_id: str) -> list[Attempt]:
        def read(conn: sqlite3.Connection) -> list[Attempt]:
            return [
                Attempt(
                    job_id=r["job_id"],
                    number=r["number"],
                    worker_id=r["worker_id"],
                    started_at=_ts(r["started_at"]),
                    finished_at=_ts(r["finished_at"]),
                    outcome=Outcome(r["outcome"]),
                    error=r["error"],
                    traceback=r["traceback"],
                )
                for r in conn.execute(_Q["attempts"], {"job_id": job_id})
            ]

        return await self._run(read)

    # -- the worker's hot path ----------------------------------------------------------

    async def claim(
        self,
        *,
        worker_id: str,
        queues: Sequence[str],
        limit: int,
        lease: float,
        limits: Limits | None = None,
    ) -> list[Job]:
        params = {
            "worker_id": worker_id,
            "queues": json.dumps(list(queues)),
            "limit": limit,
            "lease": lease,
        }
        if limits:
            flow = limits

            def claim_limited(conn: sqlite3.Connection) -> list[Job]:
                return self._claim_limited(conn, params, flow)

            return await self._write(claim_limited)

        def claim(conn: sqlite3.Connection) -> list[Job]:
            # The lease starts now that this transaction holds the write lock: a time read
            # before waiting for it would store a lease that may already have expired.
            return _jobs(conn.execute(_Q["claim"], params | {"now": self._clock()}))

        return await self._write(claim)

    def _claim_limited(
        self, conn: sqlite3.Connection, params: dict[str, Any], limits: Limits
    ) -> list[Job]:
        """Claim within concurrency and rate limits; the write lock makes the counts exact."""
        # Read the clock only now that this transaction holds the write lock: a time read
        # before waiting for it would record rate-limited starts in the past.
        now = params["now"] = self._clock()
        capacity = FlowCapacity.start(limits)
        if limits.cluster:
            types = json.dumps(list(limits.cluster))
            running = conn.execute(_Q["running_per_type"], {"now": now, "types": types})
            capacity.count_running({r["type"]: r["n"] for r in running})
        if limits.per_key:
            types = json.dumps(list(limits.per_key))
            per_key = conn.execute(_Q["running_per_key"], {"now": now, "types": types})
            capacity.count_keys({(r["type"], r["concurrency_key"]): r["n"] for r in per_key})
        for job_type, (_count, window) in limits.rate.items():
            since = now - window
            conn.execute(_Q["forget_rate_window"], {"type": job_type, "since": since})
            used = conn.execute(_Q["rate_window_count"], {"type": job_type, "since": since})
            capacity.count_rate(job_type, used.fetchone()[0])
        taken: list[str] = []
        taken_types: list[str] = []
        for _ in range(8):  # each round blocks at least one more type or key
            want = params["limit"] - len(taken)
            rows = conn.execute(
                _Q["claim_candidates"],
                params
                | {
                    "limit": want,
                    "blocked_types": json.dumps(sorted(capacity.blocked_types)),
                    "blocked_keys": json.dumps(
                        sorted(f"{t}\x1f{k}" for t, k in capacity.blocked_keys)
                    ),
                    "taken": json.dumps(taken),
                },
            ).fetchall()
            for r in rows:
                if capacity.take(r["type"], r["concurrency_key"]):
                    taken.append(r["id"])
                    taken_types.append(r["type"])
            if len(rows) < want or len(taken) >= params["limit"]:
                break
        if not taken:
            return []
        for job_type in taken_types:
            if job_type in limits.rate:
                conn.execute(_Q["record_rate_start"], {"type": job_type, "now": now})
        return _jobs(conn.execute(_Q["claim_ids"], params | {"ids": json.dumps(taken)}))

    async def heartbeat(
        self,
        *,
        worker_id: str,
        leases: Sequence[Lease],
        lease: float,
        progress: Mapping[Lease, Progress],
    ) -> Beat:
        held = json.dumps([[x.job_id, x.token] for x in leases])
        updates = [
            {
                "id": key.job_id,
                "token": key.token,
                "done": p.done,
                "total": p.total,
                "message": p.message,
            }
            for key, p in progress.items()
        ]

        def beat(conn: sqlite3.Connection) -> Beat:
            now = self._clock()  # under the write lock, as for a claim
            conn.execute(_Q["touch_worker"], {"worker_id": worker_id, "now": now})
            renewed = {}
            if leases:
                rows = conn.execute(
                    _Q["renew_leases"], {"leases": held, "lease": lease, "now": now}
                ).fetchall()
                renewed = {r[0]: bool(r[1]) for r in rows}
            if updates:
                conn.executemany(_Q["write_progress"], updates)
            return Beat(
                lost=frozenset(x.job_id for x in leases if x.job_id not in renewed),
                cancel_requested=frozenset(k for k, v in renewed.items() if v),
            )

        return await self._write(beat)

    async def settle(self, settlements: Sequence[Settlement]) -> list[str]:
        now = self._clock()

        def settle(conn: sqlite3.Connection) -> list[str]:
            return self._settle(conn, settlements, now)

        return await self._write(settle)

    def _settle(
        self, conn: sqlite3.Connection, settlements: Sequence[Settlement], now: float
    ) -> list[str]:
        """End the attempts of a batch in one UPDATE, then record them and carry the ends on.

        Per-job statements are left only for what needs them: a job reported succeeded
        that has children, and a job that ended with a parent or with dependents.
        """
        ids = json.dumps([s.job_id for s in settlements])
        with_children = (
            {r[0] for r in conn.execute(_Q["parents_among"], {"ids": ids})}
            if any(s.status is Status.SUCCEEDED for s in settlements)
            else set()
        )
        rows = []
        decided: dict[str, tuple[Settlement, Status]] = {}
        for s in settlements:
            status, error = s.status, s.error
            if status is Status.SUCCEEDED and s.job_id in with_children:
                children = self._children_counts(conn, s.job_id)
                status = transition(Status.RUNNING, returned_event(children))
                if status is Status.FAILED:
                    error = children_error(children)
            decided[s.job_id] = (s, status)
            progress = s.progress
            rows.append(
                (
                    s.job_id,
                    s.token,
                    status.value,
                    _dumps(s.result),
                    s.result_ref,
                    error,
                    s.retry_delay,
                    1 if s.outcome is None else 0,
                    None if progress is None else progress.done,
                    None if progress is None else progress.total,
                    None if progress is None else progress.message,
                )
            )
        settled = conn.execute(_Q["settle"], {"batch": json.dumps(rows), "now": now}).fetchall()
        attempts = []
        finished: list[tuple[str, str | None, Status]] = []
        for job_id, attempt, lease_owner, started_at, parent_id in settled:
            s, status = decided.pop(job_id)
            if s.outcome is not None:
                attempts.append(
                    (job_id, attempt, lease_owner, started_at, now, s.outcome.value, s.error,
                     s.traceback)
                )  # fmt: skip
            if status.terminal:
                finished.append((job_id, parent_id, status))
        if attempts:
            conn.executemany(_Q["insert_attempt"], attempts)
        if finished:
            ended = json.dumps([job_id for job_id, _, _ in finished])
            upstream = {r[0] for r in conn.execute(_Q["upstream_among"], {"ids": ended})}
            self._cascade_all(
                conn,
                [f for f in finished if f[1] is not None or f[0] in upstream],
                now,
                without_dependents=frozenset(f[0] for f in finished if f[0] not in upstream),
            )
        return list(decided)  # the ones the UPDATE did not take: refused

    @staticmethod
    def _children_counts(conn: sqlite3.Connection, job_id: str) -> dict[Status, int]:
        return {
            Status(r["status"]): r["n"] for r in conn.execute(_Q["children_counts"], {"id": job_id})
        }

    def _cascade(
        self,
        conn: sqlite3.Connection,
        job_id: str,
        parent_id: str | None,
        status: Status,
        now: float,
    ) -> None:
        """Carry a job's end to its waiting parent and its pending dependents, transitively."""
        self._cascade_all(conn, [(job_id, parent_id, status)], now)

    def _cascade_all(
        self,
        conn: sqlite3.Connection,
        ended: list[tuple[str, str | None, Status]],
        now: float,
        *,
        without_dependents: frozenset[str] = frozenset(),
    ) -> None:
        """Carry many jobs' ends on, a round at a time: each parent is decided once per
        round, however many of its children ended (its children are counted whole), and
        dependents are looked for except of ``without_dependents``, known to have none."""
        todo = ended
        while todo:
            round_, todo = todo, []
            for parent_id in sorted({p for _, p, _ in round_ if p is not None}):
                finished = self._finish_parent(conn, parent_id, now)
                if finished is not None:
                    todo.append(finished)
            for job_id, _, status in round_:
                if job_id in without_dependents:
                    continue
                for r in conn.execute(_Q["pending_dependents"], {"id": job_id}).fetchall():
                    if dependency_event(status) is None:
                        unmet = conn.execute(_Q["unmet_dependencies"], {"id": r["id"]}).fetchone()[
                            0
                        ]
                        if unmet == 0:
                            conn.execute(_Q["release_pending"], {"id": r["id"]})
                        continue
                    reason = f"dependency {job_id} {status.value}"
                    row = _one(
                        conn.execute(
                            _Q["cancel_pending"], {"id": r["id"], "reason": reason, "now": now}
                        )
                    )
                    if row is not None:
                        todo.append((row["id"], row["parent_id"], Status.CANCELLED))

    def _finish_parent(
        self, conn: sqlite3.Connection, parent_id: str, now: float
    ) -> tuple[str, str | None, Status] | None:
        """End a waiting parent whose children have all ended; return it if it ended."""
        counts = self._children_counts(conn, parent_id)
        event = children_event(counts)
        if event is None:
            return None
        status = transition(Status.WAITING, event)
        error = children_error(counts) if status is Status.FAILED else None
        row = _one(
            conn.execute(
                _Q["finish_waiting"],
                {"id": parent_id, "status": status.value, "error": error, "now": now},
            )
        )
        return None if row is None else (row["id"], row["parent_id"], status)

    async def checkpoint(self, lease: Lease, state: JSON) -> bool:
        params = {"id": lease.job_id, "token": lease.token, "state": _dumps(state)}

        def write(conn: sqlite3.Connection) -> bool:
            return conn.execute(_Q["checkpoint"], params).rowcount == 1

        return await self._write(write)

    async def rescue(self, *, limit: int, jitter: float) -> list[Rescued]:
        now = self._clock()

        def rescue(conn: sqlite3.Connection) -> list[Rescued]:
            rows = conn.execute(_Q["expired_leases"], {"now": now, "limit": limit}).fetchall()
            decisions = [
                after_failure(
                    job_id=r["id"],
                    token=r["lease_token"],
                    attempt=r["attempt"],
                    max_attempts=r["max_attempts"],
                    outcome=Outcome.LOST,
                    error=f"lease expired: worker {r['lease_owner']} stopped heartbeating",
                    backoff_base=r["backoff_base"],
                    backoff_cap=r["backoff_cap"],
                    jitter=jitter,
                )
                for r in rows
            ]
            refused = set(self._settle(conn, decisions, now))
            owners = {r["id"]: r["lease_owner"] for r in rows}
            return [
                Rescued(job_id=d.job_id, worker_id=owners[d.job_id], status=d.status)
                for d in decisions
                if d.job_id not in refused
            ]

        return await self._write(rescue)

    async def cancel(self, job_id: str, *, reason: str) -> Job | None:
        now = self._clock()

        def cancel(conn: sqlite3.Connection) -> Job | None:
            self._cancel_one(conn, job_id, reason, now)
            row = _one(conn.execute(_Q["get_job"], {"id": job_id}))
            return None if row is None else _job(row)

        return await self._write(cancel)

    def _cancel_one(self, conn: sqlite3.Connection, job_id: str, reason: str, now: float) -> None:
        """Cancel a job now, or ask its worker to; a waiting job takes its subtree along."""
        params = {"id": job_id, "reason": reason, "now": now}
        row = _one(conn.execute(_Q["cancel_unstarted"], params))
        if row is None:
            row = _one(conn.execute(_Q["cancel_waiting"], params))
            if row is not None:
                below = conn.execute(_Q["unfinished_descendants"], {"id": job_id}).fetchall()
                for child in below:
                    child_params = {
                        "id": child["id"],
                        "reason": f"parent {job_id} cancelled",
                        "now": now,
                    }
                    if child["status"] == Status.RUNNING.value:
                        conn.execute(_Q["request_cancel"], child_params)
                    else:
                        conn.execute(_Q["cancel_unstarted"], child_params)
                        conn.execute(_Q["cancel_waiting"], child_params)
                        self._cascade(conn, child["id"], None, Status.CANCELLED, now)
        if row is None:
            conn.execute(_Q["request_cancel"], params)
            return
        self._cascade(conn, job_id, row["parent_id"], Status.CANCELLED, now)

    async def retry(self, job_id: str, new: NewJob) -> Job | None:
        now = self._clock()
        params = self._new_job_params(new, now)

        def retry(conn: sqlite3.Connection) -> Job | None:
            old = _one(conn.execute(_Q["get_job"], {"id": job_id}))
            if old is None:
                return None
            if old["status"] not in (Status.FAILED.value, Status.CANCELLED.value):
                raise InvalidState(
                    f"job {job_id} is {old['status']}: only failed or cancelled jobs can be retried"
                )
            return self._insert(conn, new, params, now).job

        return await self._write(retry)

    async def spawn(self, lease: Lease, jobs: Sequence[NewJob]) -> list[Submitted] | None:
        now = self._clock()

        def spawn(conn: sqlite3.Connection) -> list[Submitted] | None:
            holder = _one(
                conn.execute(_Q["lease_holder"], {"id": lease.job_id, "token": lease.token})
            )
            if holder is None:
                return None
            out = []
            for job in jobs:
                child = dataclasses.replace(job, parent_id=lease.job_id, root_id=holder["root_id"])
                out.append(self._insert(conn, child, self._new_job_params(child, now), now))
            return out

        return await self._write(spawn)

    async def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        params = {"ids": json.dumps(list(job_ids))}

        def read(conn: sqlite3.Connection) -> list[Job]:
            return _jobs(conn.execute(_Q["get_many"], params))

        return await self._run(read)

    async def finish_parents(self, *, limit: int) -> list[str]:
        now = self._clock()

        def finish(conn: sqlite3.Connection) -> list[str]:
            done = []
            for r in conn.execute(_Q["waiting_parents"], {"limit": limit}).fetchall():
                finished = self._finish_parent(conn, r["id"], now)
                if finished is not None:
                    done.append(finished[0])
                    self._cascade(conn, *finished, now)
            return done

        return await self._write(finish)

    # -- schedules ----------------------------------------------------------------------

    async def sync_schedules(self, schedules: Sequence[Schedule]) -> None:
        now = self._clock()
        moment = datetime.fromtimestamp(now, UTC)
        rows = [
            _schedule_params(s) | {"next_run_at": _epoch(s.cron.next_after(moment)), "now": now}
            for s in schedules
        ]

        def sync(conn: sqlite3.Connection) -> None:
            conn.executemany(_Q["upsert_schedule"], rows)

        await self._write(sync)

    async def fire_schedules(self, *, limit: int, min_grace: float = 0.0) -> list[str]:
        now = self._clock()

        def fire(conn: sqlite3.Connection) -> list[str]:
            created = []
            for row in conn.execute(_Q["due_schedules"], {"now": now, "limit": limit}).fetchall():
                info = _schedule(row)
                firing = plan_schedule(
                    info.schedule,
                    next_run_at=info.next_run_at,
                    now=datetime.fromtimestamp(now, UTC),
                    min_grace=min_grace,
                )
                moved = conn.execute(
                    _Q["advance_schedule"],
                    {
                        "name": info.schedule.name,
                        "expected": row["next_run_at"],
                        "next_run_at": _epoch(firing.next_run_at),
                        "last_run_at": _epoch(firing.ticks[-1])
                        if firing.ticks
                        else row["last_run_at"],
                    },
                ).rowcount
                if moved != 1:
                    continue  # another worker fired these ticks
                for tick in firing.ticks:
                    job = schedule_job(info.schedule, tick)
                    submitted = self._insert(conn, job, self._new_job_params(job, now), now)
                    if submitted.created:
                        created.append(job.id)
            return created

        return await self._write(fire)

    async def schedules(self) -> list[ScheduleInfo]:
        def read(conn: sqlite3.Connection) -> list[ScheduleInfo]:
            return [_schedule(r) for r in conn.execute(_Q["schedules"])]

        return await self._run(read)

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleInfo | None:
        now = self._clock()

        def toggle(conn: sqlite3.Connection) -> ScheduleInfo | None:
            row = _one(conn.execute(_Q["get_schedule"], {"name": name}))
            if row is None:
                return None
            cron = Cron(row["cron"], row["timezone"])
            upcoming = _epoch(cron.next_after(datetime.fromtimestamp(now, UTC)))
            params = {"name": name, "enabled": int(enabled), "next_run_at": upcoming, "now": now}
            return _schedule(_one(conn.execute(_Q["set_schedule_enabled"], params)))

        return await self._write(toggle)

    async def run_schedule(self, name: str) -> Job | None:
        now = self._clock()

        def run(conn: sqlite3.Connection) -> Job | None:
            row = _one(conn.execute(_Q["get_schedule"], {"name": name}))
            if row is None:
                return None
            job = schedule_job(
                _schedule(row).schedule, datetime.fromtimestamp(now, UTC), manual=True
            )
            return self._insert(conn, job, self._new_job_params(job, now), now).job

        return await self._write(run)

    # -- named leases -------------------------------------------------------------------

    async def acquire_lease(self, name: str, *, owner: str, ttl: float) -> LeaseRecord:
        now = self._clock()

        def acquire(conn: sqlite3.Connection) -> LeaseRecord:
            before = _one(conn.execute(_Q["get_lease"], {"name": name}))
            row = _one(
                conn.execute(
                    _Q["take_lease"], {"name": name, "owner": owner, "ttl": ttl, "now": now}
                )
            )
            if row is None:
                return _lease(before)
            if before is not None and before["owner"] is not None:
                self._record_lease_end(conn, before, before["expires_at"], "expired")
            return _lease(row)

        return await self._write(acquire)

    def _record_lease_end(
        self, conn: sqlite3.Connection, row: sqlite3.Row, ended_at: float, how: str
    ) -> None:
        conn.execute(
            _Q["record_lease_end"],
            {
                "name": row["name"],
                "token": row["token"],
                "owner": row["owner"],
                "acquired_at": row["acquired_at"],
                "ended_at": ended_at,
                "ended": how,
            },
        )
        conn.execute(_Q["trim_lease_history"], {"name": row["name"]})

    async def renew_lease(self, name: str, *, token: int, ttl: float) -> datetime | None:
        params = {"name": name, "token": token, "ttl": ttl, "now": self._clock()}

        def renew(conn: sqlite3.Connection) -> datetime | None:
            row = _one(conn.execute(_Q["renew_lease"], params))
            return None if row is None else _ts(row["expires_at"])

        return await self._write(renew)

    async def release_lease(self, name: str, *, token: int) -> bool:
        now = self._clock()

        def release(conn: sqlite3.Connection) -> bool:
            before = _one(conn.execute(_Q["get_lease"], {"name": name}))
            row = _one(conn.execute(_Q["release_lease"], {"name": name, "token": token}))
            if row is None or before is None:
                return False
            expired = before["expires_at"] is not None and before["expires_at"] <= now
            ended_at = before["expires_at"] if expired else now
            self._record_lease_end(conn, before, ended_at, "expired" if expired else "released")
            return not expired

        return await self._write(release)

    async def lease_history(self, name: str) -> list[LeaseRecord]:
        def read(conn: sqlite3.Connection) -> list[LeaseRecord]:
            current = _one(conn.execute(_Q["get_lease"], {"name": name}))
            past = [
                LeaseRecord(
                    name=r["name"],
                    owner=r["owner"],
                    token=r["token"],
                    acquired_at=datetime.fromtimestamp(r["acquired_at"], UTC),
                    ended_at=_ts(r["ended_at"]),
                    ended=r["ended"],
                )
                for r in conn.execute(_Q["lease_history"], {"name": name})
            ]
            if current is not None and current["owner"] is not None:
                return [_lease(current), *past]
            return past

        return await self._run(read)

    # -- retention ----------------------------------------------------------------------

    async def prune(self, retention: Retention, *, limit: int) -> int:
        now = self._clock()

        def prune(conn: sqlite3.Connection) -> int:
            roots: list[str] = []
            overridden = sorted(retention.per_type)
            for status in ("succeeded", "failed", "cancelled"):
                for job_type in [None, *overridden]:
                    if len(roots) >= limit:
                        break
                    cutoff = now - retention.seconds(status, job_type)
                    rows = conn.execute(
                        _Q["prunable_roots"],
                        {
                            "status": status,
                            "cutoff": cutoff,
                            "type": job_type,
                            "excluded_types": json.dumps(overridden if job_type is None else []),
                            "limit": limit - len(roots),
                        },
                    )
                    roots.extend(r["id"] for r in rows)
            if not roots:
                return 0
            params = {"roots": json.dumps(roots)}
            conn.execute(_Q["delete_tree_attempts"], params)
            conn.execute(_Q["delete_tree_dependencies"], params)
            return conn.execute(_Q["delete_trees"], params).rowcount

        return await self._write(prune)

    # -- workers and queues -------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo) -> None:
        params = {
            "id": worker.id,
            "hostname": worker.hostname,
            "pid": worker.pid,
            "queues": json.dumps(list(worker.queues)),
            "concurrency": worker.concurrency,
            "now": self._clock(),
        }
        await self._write(lambda conn: conn.execute(_Q["register_worker"], params))

    async def deregister_worker(self, worker_id: str) -> None:
        params = {"worker_id": worker_id, "now": self._clock()}
        await self._write(lambda conn: conn.execute(_Q["deregister_worker"], params))

    async def workers(self) -> list[WorkerInfo]:
        def read(conn: sqlite3.Connection) -> list[WorkerInfo]:
            return [
                WorkerInfo(
                    id=r["id"],
                    hostname=r["hostname"],
                    pid=r["pid"],
                    queues=tuple(json.loads(r["queues"])),
                    concurrency=r["concurrency"],
                    started_at=_ts(r["started_at"]),
                    heartbeat_at=_ts(r["heartbeat_at"]),
                    stopped_at=_ts(r["stopped_at"]),
                )
                for r in conn.execute(_Q["workers"])
            ]

        return await self._run(read)

    async def queues(self) -> list[QueueInfo]:
        def read(conn: sqlite3.Connection) -> list[QueueInfo]:
            counts: dict[str, dict[str, int]] = {}
            for r in conn.execute(_Q["queue_counts"]):
                counts.setdefault(r["queue"], {})[r["status"]] = r["n"]
            paused = {r["name"]: bool(r["paused"]) for r in conn.execute(_Q["paused_queues"])}
            names = sorted(set(counts) | set(paused))
            return [QueueInfo(n, paused.get(n, False), counts.get(n, {})) for n in names]

        return await self._run(read)

    async def set_paused(self, queue: str, paused: bool) -> None:
        params = {"name": queue, "paused": int(paused), "now": self._clock()}
        await self._write(lambda conn: conn.execute(_Q["set_paused"], params))

    # -- wake-ups -----------------------------------------------------------------------

    async def wait_for_jobs(self, timeout: float) -> frozenset[str]:
        if self._watcher is None:
            self._start_watcher()
        wake = self._wake
        if wake is None:
            await asyncio.sleep(timeout)
            return frozenset()
        try:
            async with asyncio.timeout(timeout):
                await wake.wait()
        except TimeoutError:
            pass
        wake.clear()
        return frozenset()

    def _start_watcher(self) -> None:
        """Wake waiters when another connection commits.

        A thread polls ``PRAGMA data_version`` on a connection of its own, which changes
        on every commit of any other connection, this store's included. While the store
        itself is writing (a draining worker commits every few milliseconds), a change
        may be its own commit: the watcher then asks the store's thread, whose own
        connection's data_version changes only with other connections' commits, instead
        of waking the event loop for nothing.
        """
        loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        stop = self._watch_stop
        path = self.path
        executor = self._executor
        seen: int | None = None  # the store connection's data_version, last read
        checking = threading.Event()  # a check is queued on the store's thread

        def check(conn: sqlite3.Connection) -> None:
            nonlocal seen
            try:
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version != seen:
                    seen = version
                    loop.call_soon_threadsafe(wake.set)
            except (sqlite3.Error, RuntimeError):
                pass
            finally:
                checking.clear()

        def ask_store() -> None:
            conn = self._conn
            if executor is None or conn is None:
                loop.call_soon_threadsafe(wake.set)
            elif not checking.is_set():
                checking.set()
                try:
                    executor.submit(check, conn)
                except RuntimeError:  # the store is closing
                    checking.clear()

        def watch() -> None:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            try:
                ask_store()  # learn the store connection's data_version
                commits = self._commits
                last = conn.execute("PRAGMA data_version").fetchone()[0]
                while not stop.wait(_WATCH_INTERVAL):
                    before = commits
                    commits = self._commits
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if version == last:
                        continue
                    last = version
                    if commits == before:
                        loop.call_soon_threadsafe(wake.set)  # not ours: someone else's
                    else:
                        ask_store()
            except (sqlite3.Error, RuntimeError):
                # The database went away or the loop closed: waiters fall back to timeouts.
                pass
            finally:
                conn.close()

        self._watcher = threading.Thread(target=watch, name="conveyor-sqlite-watch", daemon=True)
        self._watcher.start()

    # -- the API's reads and tokens -----------------------------------------------------

    async def page_jobs(self, query: JobPageQuery) -> list[Job]:
        params = {
            "statuses": json.dumps([s.value for s in query.status]) if query.status else None,
            "type": query.type,
            "queue": query.queue,
            "tenant": query.tenant,
            "parent_id": query.parent_id,
            "root_id": query.root_id,
            "top_level": int(query.top_level),
            "created_after": _epoch(query.created_after) if query.created_after else None,
            "created_before": _epoch(query.created_before) if query.created_before else None,
            "after_created": _epoch(query.after[0]) if query.after else None,
            "after_id": query.after[1] if query.after else None,
            "limit": query.limit,
        }
        scope = "page_jobs" if query.tenant is None else "page_tenant_jobs"
        name = f"{scope}_{'newest' if query.newest_first else 'oldest'}_first"

        def read(conn: sqlite3.Connection) -> list[Job]:
            return _jobs(conn.execute(_Q[name], params))

        return await self._run(read)

    async def health(self) -> HealthCounts:
        now = self._clock()

        def read(conn: sqlite3.Connection) -> HealthCounts:
            r = _one(conn.execute(_Q["health"], {"now": now}))
            return HealthCounts(
                queued=r["queued"],
                due=r["due"],
                running=r["running"],
                stale_running=r["stale_running"],
                workers=r["workers"],
                live_workers=r["live_workers"],
                last_heartbeat=_ts(r["last_heartbeat"]),
                now=datetime.fromtimestamp(now, UTC),
            )

        return await self._run(read)

    async def create_token(self, token: Token) -> None:
        params = {
            "id": token.id,
            "tenant": token.tenant,
            "role": token.role.value,
            "secret_hash": token.secret_hash,
            "name": token.name,
            "created_at": _epoch(token.created_at),
        }
        await self._write(lambda conn: conn.execute(_Q["create_token"], params))

    async def find_token(self, token_id: str) -> Token | None:
        def read(conn: sqlite3.Connection) -> Token | None:
            row = _one(conn.execute(_Q["find_token"], {"id": token_id}))
            return None if row is None else _token(row)

        return await self._run(read)

    async def touch_token(self, token_id: str) -> None:
        params = {"id": token_id, "now": self._clock()}
        await self._write(lambda conn: conn.execute(_Q["touch_token"], params))

    async def revoke_token(self, token_id: str) -> Token | None:
        params = {"id": token_id, "now": self._clock()}

        def revoke(conn: sqlite3.Connection) -> Token | None:
            row = _one(conn.execute(_Q["revoke_token"], params))
            return None if row is None else _token(row)

        return await self._write(revoke)

    async def list_tokens(self) -> list[Token]:
        def read(conn: sqlite3.Connection) -> list[Token]:
            return [_token(r) for r in conn.execute(_Q["list_tokens"])]

        return await self._run(read)


def _token(row: sqlite3.Row) -> Token:
    return Token(
        id=row["id"],
        tenant=row["tenant"],
        role=Role(row["role"]),
        secret_hash=row["secret_hash"],
        name=row["name"],
        created_at=datetime.fromtimestamp(row["created_at"], UTC),
        last_used_at=_ts(row["last_used_at"]),
        revoked_at=_ts(row["revoked_at"]),
    )
