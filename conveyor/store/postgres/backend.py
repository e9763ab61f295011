"""PostgreSQL implementation of the store protocol."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import operator
import random
import re
import weakref
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, overload

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg.types.datetime import TimestamptzLoader
from psycopg.types.json import JsonLoader
from psycopg_pool import AsyncConnectionPool

from conveyor.core.auth import Role, Token
from conveyor.core.cron import CatchUp, Cron, Schedule, plan_schedule, schedule_job
from conveyor.core.flow import FlowCapacity
from conveyor.core.lifecycle import (
    ACTIVE,
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
from conveyor.store._rows import JOB_COLUMNS, STATUS, job_picker
from conveyor.store.postgres._errors import translated
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

T = TypeVar("T")
Connection = psycopg.AsyncConnection[DictRow]

log = logging.getLogger("conveyor.store.postgres")

# psycopg_pool logs a warning for every connection it discards and every reconnection
# attempt: a restart of the server would flood each worker's log. For conveyor's own
# pools, the store logs the outage once instead (PostgresStore._connect_failed).
_QUIET_POOLS: weakref.WeakValueDictionary[str, PostgresStore] = weakref.WeakValueDictionary()
_OUR_CONNECTIONS: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()


class _PoolNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == "error connecting in %r: %s" and len(args) == 2:
            store = _QUIET_POOLS.get(str(args[0]))
            if store is not None:
                store._connect_failed(_reason(args[1]) if isinstance(args[1], Exception) else "")
                return False
        if str(record.msg).startswith("discarding ") and args:
            try:
                return args[0] not in _OUR_CONNECTIONS
            except TypeError:
                return True
        return True


logging.getLogger("psycopg.pool").addFilter(_PoolNoise())

_Q = load_queries("conveyor.store.postgres")
_MIGRATIONS = load_migrations("conveyor.store.postgres")

JOB_READY_CHANNEL = "conveyor_job_ready"
CANCEL_CHANNEL = "conveyor_cancel"

# Connection settings applied unless the URL sets them: fail fast when the server is
# unreachable, and notice a silently dead peer (a network partition) within ~30s.
_CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "application_name": "conveyor",
}
# How long an operation waits for a pooled connection. A restart of the server takes a
# few seconds: operations made meanwhile wait for it rather than fail.
_ACQUIRE_TIMEOUT = 5.0
_POOL_MIN = 1
_POOL_MAX = 10
# A heartbeat is useless once it cannot finish well within the lease: give it half of the
# margin the worker keeps before it stops a run whose lease it could not renew, so that a
# hung database makes the heartbeat fail (and the worker self-fence) in time.
_HEARTBEAT_MARGIN_FRACTION = 1 / 6
_HEARTBEAT_MARGIN_CAP = 2.0
# How often an operation runs when its connection was dead or its transaction deadlocked.
_ATTEMPTS = 3
# A retention longer than this (about 95 years) keeps jobs forever.
_FOREVER = 3e9
# A unique key whose holder ends between our insert and our read-back is retried; more
# than a few rounds would mean a bug, not a race.
_SUBMIT_ROUNDS = 5


@overload
def _utc(value: datetime) -> datetime: ...
@overload
def _utc(value: None) -> None: ...
def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if value.tzinfo is UTC:
        return value
    return value.astimezone(UTC)


def _dumps(value: JSON) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"))


_pick_job = operator.itemgetter(*JOB_COLUMNS)  # a dict row's job columns, by name


async def _fetch_jobs(conn: Connection, query: str, params: Mapping[str, Any]) -> list[Job]:
    """Run a query of conveyor_jobs and read its rows as Jobs, as tuples (no dict per row)."""
    async with conn.cursor(row_factory=tuple_row) as cursor:
        await cursor.execute(query, params)
        rows = await cursor.fetchall()
        if not rows or cursor.description is None:
            return []
        pick = job_picker(tuple(d.name for d in cursor.description))
        return [_job_of(*pick(row)) for row in rows]


def _job(row: Mapping[str, Any]) -> Job:
    return _job_of(*_pick_job(row))


def _job_of(
    id: str, type: str, queue: str, tenant: str | None, payload: Any, status: str,
    priority: int, attempt: int, max_attempts: int, run_at: datetime, created_at: datetime,
    timeout: float | None, lease_seconds: float | None, backoff_base: float,
    backoff_cap: float, progress_done: float | None, progress_total: float | None,
    progress_message: str | None, state: JSON, result: JSON, result_ref: str | None,
    error: str | None, parent_id: str | None, root_id: str | None,
    depends_on: list[str] | None, unique_key: str | None, concurrency_key: str | None,
    retry_of: str | None, started_at: datetime | None, finished_at: datetime | None,
    lease_owner: str | None, lease_expires_at: datetime | None, lease_token: int,
    cancel_requested: bool,
) -> Job:  # fmt: skip
    return Job(
        id=id,
        type=type,
        queue=queue,
        tenant=tenant,
        payload=payload,
        status=STATUS[status],
        priority=priority,
        attempt=attempt,
        max_attempts=max_attempts,
        run_at=_utc(run_at),
        created_at=_utc(created_at),
        timeout=timeout,
        lease=lease_seconds,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        progress=None
        if progress_done is None
        else Progress(done=progress_done, total=progress_total, message=progress_message),
        state=state,
        result=result,
        result_ref=result_ref,
        error=error,
        parent_id=parent_id,
        root_id=root_id,
        depends_on=tuple(depends_on) if depends_on else (),
        unique_key=unique_key,
        concurrency_key=concurrency_key,
        retry_of=retry_of,
        started_at=None if started_at is None else _utc(started_at),
        finished_at=None if finished_at is None else _utc(finished_at),
        lease_owner=lease_owner,
        lease_expires_at=None if lease_expires_at is None else _utc(lease_expires_at),
        lease_token=lease_token,
        cancel_requested=cancel_requested,
    )


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


def _schedule(row: Mapping[str, Any]) -> ScheduleInfo:
    next_run_at = _utc(row["next_run_at"])
    if next_run_at is None:
        raise RuntimeError(f"schedule {row['name']!r} has no next_run_at")
    return ScheduleInfo(
        schedule=Schedule(
            name=row["name"],
            cron=Cron(row["cron"], row["timezone"]),
            type=row["type"],
            payload=row["payload"],
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
        next_run_at=next_run_at,
        last_run_at=_utc(row["last_run_at"]),
    )


def _lease(row: Mapping[str, Any]) -> LeaseRecord:
    return LeaseRecord(
        name=row["name"],
        owner=row["owner"] or "",
        token=row["token"],
        acquired_at=_utc(row["acquired_at"]) or datetime.fromtimestamp(0, UTC),
        expires_at=_utc(row["expires_at"]),
    )


def _redact(url: str) -> str:
    """Hide the password of a URL.

    >>> _redact("postgresql://app:s3cret@db:5432/jobs")
    'postgresql://app:***@db:5432/jobs'
    """
    return re.sub(r"(//[^/@:]*:)[^@/]*@", r"\1***@", url)


def parse_postgres_url(url: str) -> dict[str, str]:
    """Return the connection parameters of a ``postgresql://`` URL, or raise ConfigurationError.

    >>> parse_postgres_url("postgresql://app@db.internal:6432/jobs")["port"]
    '6432'
    """
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "cannot be parsed"
        raise ConfigurationError(
            f"malformed PostgreSQL URL {_redact(url)!r} ({reason}): write "
            "postgresql://user:password@host:5432/dbname"
        ) from None
    for port in str(params.get("port", "5432")).split(","):
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(
                f"malformed PostgreSQL URL {_redact(url)!r}: port {port!r} is not a number "
                "from 1 to 65535"
            )
    return {k: str(v) for k, v in params.items()}


def _describe(params: Mapping[str, str]) -> str:
    host = params.get("host") or params.get("hostaddr") or "localhost (default socket)"
    port = params.get("port", "5432")
    database = params.get("dbname") or params.get("user") or "(default)"
    user = params.get("user") or "(current user)"
    return f"PostgreSQL at {host}:{port} (database {database!r}, user {user!r})"


def _reason(exc: BaseException) -> str:
    """The server's or libpq's reason for a failure, on one line."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = re.sub(r"^connection failed: ", "", lines[0])
    first = re.sub(r'^connection to server (at|on) "[^"]*"(, port \d+)? failed: ', "", first)
    return re.sub(r"^(FATAL|ERROR):\s+", "", first)


def _advice(reason: str) -> str:
    """What to do about a failed connection, from libpq's reason."""
    if re.search(r'database "[^"]*" does not exist', reason):
        return "Create the database (createdb NAME) or fix its name in the URL"
    if "password" in reason or re.search(r'role "[^"]*" does not exist', reason):
        return "Check the user and password in the URL"
    return (
        "Check that the server is running and reachable from this machine, and the host "
        "and port in the URL (CONVEYOR_DATABASE_URL)"
    )


# -- submit, written once for conveyor's pool and for an application's connection -------

_Step = tuple[str, dict[str, Any]]
_Steps = Generator[_Step, list[dict[str, Any]], T]


def _submit_params(
    jobs: Sequence[NewJob], now: datetime | None, status: Status = Status.QUEUED
) -> dict[str, Any]:
    return {
        "now": now,
        "status": status.value,
        "jobs": json.dumps(
            [
                {
                    "id": j.id,
                    "type": j.type,
                    "queue": j.queue,
                    "tenant": j.tenant,
                    "payload": json.dumps(j.payload, separators=(",", ":")),
                    "priority": j.priority,
                    "max_attempts": j.max_attempts,
                    "run_at": None if j.run_at is None else _utc(j.run_at).isoformat(),
                    "delay": j.delay,
                    "timeout": j.timeout,
                    "lease_seconds": j.lease,
                    "backoff_base": j.backoff_base,
                    "backoff_cap": j.backoff_cap,
                    "state": _dumps(j.state),
                    "parent_id": j.parent_id,
                    "root_id": j.root_id,
                    "depends_on": list(j.depends_on) if j.depends_on else None,
                    "unique_key": j.unique_key,
                    "concurrency_key": j.concurrency_key,
                    "retry_of": j.retry_of,
                }
                for j in jobs
            ],
            separators=(",", ":"),
            allow_nan=False,
        ),
    }


def _submit_steps(jobs: Sequence[NewJob], now: datetime | None) -> _Steps[list[Submitted]]:
    """Yield a submit's statements, receive their rows, and return what was submitted.

    A generator, so that the same steps run on conveyor's pool, on an application's
    async connection and on its sync one; the caller runs them in one transaction. Runs
    of jobs without dependencies are inserted with one statement each; a job with
    dependencies on its own, in batch order, so it may depend on jobs before it. Every
    statement returns rows, which the drivers fetch.
    """
    results: list[Submitted] = []
    start = 0
    while start < len(jobs):
        if jobs[start].depends_on:
            results.append((yield from _insert_dependent(jobs[start], now)))
            start += 1
            continue
        end = start
        while end < len(jobs) and not jobs[end].depends_on:
            end += 1
        results.extend((yield from _insert_batch(jobs[start:end], now, Status.QUEUED)))
        start = end
    return results


def _insert_batch(
    jobs: Sequence[NewJob], now: datetime | None, status: Status
) -> _Steps[list[Submitted]]:
    """Insert jobs with one statement; an existing id or active unique key returns its job."""
    results: dict[int, Submitted] = {}
    pending = list(range(len(jobs)))
    for _ in range(_SUBMIT_ROUNDS):
        inserted = yield _Q["submit"], _submit_params([jobs[i] for i in pending], now, status)
        created = {row["id"]: row for row in inserted}
        missing = []
        for i in pending:
            # pop: when an id repeats within the batch, only its first job is created.
            row = created.pop(jobs[i].id, None)
            if row is not None:
                stored = jobs[i].stored(
                    STATUS[row["status"]], _utc(row["run_at"]), _utc(row["created_at"])
                )
                results[i] = Submitted(stored, created=True)
            else:
                missing.append(i)
        if not missing:
            break
        existing = yield (
            _Q["existing_jobs"],
            {
                "ids": [jobs[i].id for i in missing],
                "unique_keys": [jobs[i].unique_key for i in missing if jobs[i].unique_key],
            },
        )
        by_id = {row["id"]: row for row in existing}
        by_key = {
            row["unique_key"]: row
            for row in existing
            if row["unique_key"] is not None and Status(row["status"]) in ACTIVE
        }
        pending = []
        for i in missing:
            new = jobs[i]
            found = by_id.get(new.id)
            if found is None and new.unique_key is not None:
                found = by_key.get(new.unique_key)
            if found is None:
                pending.append(i)  # its key's holder ended meanwhile: insert it again
            else:
                results[i] = Submitted(_job(found), created=False)
        if not pending:
            break
    else:
        raise RuntimeError(f"jobs {[jobs[i].id for i in pending]} were neither inserted nor found")
    return [results[i] for i in range(len(jobs))]


def _insert_dependent(job: NewJob, now: datetime | None) -> _Steps[Submitted]:
    """Insert a job with dependencies: pending, queued when all succeeded, or cancelled."""
    rows = yield _Q["lock_dependencies"], {"ids": list(job.depends_on)}
    found = {row["id"]: Status(row["status"]) for row in rows}
    missing = [d for d in job.depends_on if d not in found]
    if missing:
        raise InvalidDependency(
            f"job {job.id!r} depends on jobs that do not exist: {', '.join(missing)}; "
            "submit those first (or in the same batch, before it)"
        )
    done = all(status is Status.SUCCEEDED for status in found.values())
    (submitted,) = yield from _insert_batch([job], now, Status.QUEUED if done else Status.PENDING)
    if not submitted.created:
        return submitted
    yield _Q["insert_dependencies"], {"job_id": job.id, "ids": list(dict.fromkeys(job.depends_on))}
    blocked_by = next((d for d in job.depends_on if dependency_event(found[d]) is not None), None)
    if blocked_by is None:
        return submitted
    reason = f"dependency {blocked_by} {found[blocked_by].value}"
    yield _Q["cancel_pending"], {"id": job.id, "reason": reason, "now": now}
    (row,) = yield _Q["get"], {"id": job.id}
    return Submitted(_job(row), created=True)


def _standard_loaders(cursor: psycopg.AsyncCursor[Any] | psycopg.Cursor[Any]) -> None:
    """Read json and timestamptz the standard way on an application's connection.

    Frameworks register their own loaders (Django reads json as text, and timestamps
    naive when USE_TZ is off); the cursor's own adapters override them for our rows only.
    """
    cursor.adapters.register_loader("json", JsonLoader)
    cursor.adapters.register_loader("timestamptz", TimestamptzLoader)


async def _run_steps(conn: psycopg.AsyncConnection[Any], steps: _Steps[T]) -> T:
    async with conn.cursor(row_factory=dict_row) as cursor:
        _standard_loaders(cursor)
        query, params = next(steps)
        while True:
            await cursor.execute(query, params)
            rows = await cursor.fetchall()
            try:
                query, params = steps.send(rows)
            except StopIteration as done:
                result: T = done.value
                return result


def _run_steps_sync(conn: psycopg.Connection[Any], steps: _Steps[T]) -> T:
    def run() -> T:
        with conn.cursor(row_factory=dict_row) as cursor:
            _standard_loaders(cursor)
            query, params = next(steps)
            while True:
                cursor.execute(query, params)
                rows = cursor.fetchall()
                try:
                    query, params = steps.send(rows)
                except StopIteration as done:
                    result: T = done.value
                    return result

    if conn.autocommit:
        with conn.transaction():
            return run()
    return run()


class PostgresStore:
    """A store on one PostgreSQL database, shared by any number of workers and clients.

    Queries run on a pool of autocommit connections; ``wait_for_jobs`` keeps one more
    connection of its own that LISTENs for wake-ups and cancel requests.
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] | None = None,
        migrate: bool = True,
        pool_size: int = _POOL_MAX,
    ) -> None:
        self.url = url
        self._params = parse_postgres_url(url)
        self._clock = clock
        self._auto_migrate = migrate
        if pool_size < 1:
            raise ConfigurationError("pool_size must be at least 1")
        self._pool_size = pool_size
        self._kwargs: dict[str, Any] = {
            k: v for k, v in _CONNECTION_DEFAULTS.items() if k not in self._params
        }
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._checking: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._cancelled: set[str] = set()
        self._pool_name = f"conveyor-{id(self):x}"
        self._reconnecting = False

    def __repr__(self) -> str:
        return f"<PostgresStore {_redact(self.url)}>"

    # -- plumbing -----------------------------------------------------------------------

    def _now(self) -> datetime | None:
        """The pinned time, or None: the queries then use the server's now()."""
        return None if self._clock is None else datetime.fromtimestamp(self._clock(), UTC)

    async def _connect(self) -> Connection:
        """Open a connection of our own, or raise DatabaseUnavailable saying what to do."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.url, autocommit=True, row_factory=dict_row, **self._kwargs
            )
        except psycopg.OperationalError as exc:
            reason = _reason(exc)
            raise DatabaseUnavailable(
                f"cannot connect to {_describe(self._params)}: {reason}. {_advice(reason)}"
            ) from None

    async def _run(
        self, work: Callable[[Connection], Awaitable[T]], *, timeout: float = _ACQUIRE_TIMEOUT
    ) -> T:
        """Run ``work`` on a pooled connection.

        A connection that died while idle (the server restarted) fails its first
        statement, before anything ran: the other idle connections are checked and the
        work runs once more on a fresh one. A transaction the server chose to break a
        lock cycle (rare: a tree cancelled while its children settle) runs again too.
        Every operation is safe to repeat: writes are fenced by lease tokens and submits
        are idempotent by id.
        """
        pool = self._pool
        if pool is None:
            raise RuntimeError("the store is not open: call open() first")
        with translated(self._where):
            for attempt in range(1, _ATTEMPTS + 1):
                async with pool.connection(timeout=timeout) as conn:
                    try:
                        return await work(conn)
                    except psycopg.errors.DeadlockDetected:
                        if attempt == _ATTEMPTS:
                            raise
                        continue
                    except psycopg.OperationalError:
                        if attempt == _ATTEMPTS or not conn.broken:
                            raise
                self._check_pool(pool)
        raise AssertionError("not reached")

    async def _connected(self, conn: Connection) -> None:
        """Set up a new pooled connection (and do not log its routine discarding)."""
        await conn.execute(_Q["session_settings"])
        _OUR_CONNECTIONS.add(conn)
        if self._reconnecting:
            self._reconnecting = False
            log.warning("connected again to %s", self._where())

    def _connect_failed(self, reason: str) -> None:
        """Log the first failed reconnection of an outage, not every attempt."""
        if not self._reconnecting:
            self._reconnecting = True
            log.warning(
                "lost the connection to %s (%s); reconnecting in the background",
                self._where(),
                reason,
            )

    def _check_pool(self, pool: AsyncConnectionPool[Connection]) -> None:
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(
                pool.check(), name="conveyor-postgres-check"
            )

    async def _transaction(
        self, work: Callable[[Connection], Awaitable[T]], *, timeout: float = _ACQUIRE_TIMEOUT
    ) -> T:
        async def tx(conn: Connection) -> T:
            async with conn.transaction():
                return await work(conn)

        return await self._run(tx, timeout=timeout)

    async def _fetch(self, name: str, params: Mapping[str, Any] | None = None) -> list[DictRow]:
        async def fetch(conn: Connection) -> list[DictRow]:
            cursor = await conn.execute(_Q[name], params)
            return await cursor.fetchall()

        return await self._run(fetch)

    async def _execute(self, name: str, params: Mapping[str, Any]) -> int:
        async def execute(conn: Connection) -> int:
            return (await conn.execute(_Q[name], params)).rowcount

        return await self._run(execute)

    # -- opening and migrating ----------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        conn = await self._connect()
        async with conn:
            version = await self._schema_version(conn)
        if version < len(_MIGRATIONS):
            if not self._auto_migrate:
                raise ConfigurationError(
                    f"database {_describe(self._params)} needs migrations: run `conveyor migrate`"
                )
            await self.migrate()
        elif version > len(_MIGRATIONS):
            raise ConfigurationError(
                f"database {_describe(self._params)} was migrated by a newer conveyor (schema "
                f"version {version}, this one knows {len(_MIGRATIONS)}): upgrade conveyor"
            )
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self.url,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs={"autocommit": True, "row_factory": dict_row, **self._kwargs},
            min_size=_POOL_MIN,
            max_size=self._pool_size,
            timeout=_ACQUIRE_TIMEOUT,
            name=self._pool_name,
            configure=self._connected,
            open=False,
        )
        _QUIET_POOLS[self._pool_name] = self
        try:
            await pool.open(wait=True, timeout=float(self._kwargs.get("connect_timeout", 10)))
        except psycopg.OperationalError as exc:
            await pool.close()
            raise DatabaseUnavailable(
                f"cannot open a connection pool to {_describe(self._params)}: {_reason(exc)}"
            ) from None
        self._pool = pool

    async def _schema_version(self, conn: Connection) -> int:
        found = await (await conn.execute(_Q["schema_tables"])).fetchone()
        if found is None or not found["migrations"]:
            if found is not None and found["jobs"]:
                raise NotAConveyorDatabase(
                    f"database {_describe(self._params)} has a conveyor_jobs table that "
                    "conveyor's migrations did not create: use another database or schema"
                )
            # Other tables are expected: conveyor usually shares the application's database.
            return 0
        row = await (await conn.execute(_Q["schema_version"])).fetchone()
        return int(row["version"]) if row is not None else 0

    async def migrate(self) -> list[str]:
        """Apply pending migrations on a connection of its own, under an advisory lock."""
        conn = await self._connect()
        async with conn:
            await self._schema_version(conn)  # refuses a database that is not conveyor's
            async with conn.transaction():
                await conn.execute(_Q["lock_migrations"])
                await conn.execute(_Q["create_migrations_table"])
                rows = await (await conn.execute(_Q["applied_migrations"])).fetchall()
                done = {row["version"] for row in rows}
                applied = []
                for version, name, sql in _MIGRATIONS:
                    if version in done:
                        continue
                    await conn.execute(sql)
                    await conn.execute(
                        _Q["record_migration"],
                        {"version": version, "name": name, "now": self._now()},
                    )
                    applied.append(name)
        if applied:
            log.info("applied migrations to %s: %s", _describe(self._params), ", ".join(applied))
        return applied

    async def close(self) -> None:
        tasks = [t for t in (self._listener, self._checking) if t is not None]
        self._listener = self._checking = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def now(self) -> datetime:
        pinned = self._now()
        if pinned is not None:
            return pinned
        (row,) = await self._fetch("now")
        now = _utc(row["now"])
        if now is None:
            raise RuntimeError("the database returned no time")
        return now

    # -- jobs ---------------------------------------------------------------------------

    async def submit(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> list[Submitted]:
        """Insert jobs in one transaction, on conveyor's pool or on ``connection``.

        With an application's psycopg connection the jobs are written in its transaction
        and exist only if it commits: conveyor never commits or rolls back a connection it
        did not open. An autocommit connection gets a transaction (or a savepoint inside
        one already open) of its own.
        """
        if not jobs:
            return []
        if connection is None:

            async def insert(conn: Connection) -> list[Submitted]:
                # New steps for each try: a retry after a lost connection starts over.
                return await _run_steps(conn, _submit_steps(jobs, self._now()))

            if len(jobs) == 1 and not jobs[0].depends_on:
                # One job is one INSERT, atomic on its own: in autocommit it takes one
                # round trip instead of three (BEGIN, INSERT, COMMIT). Should its id or
                # unique key be taken, the look-up that follows writes nothing.
                return await self._run(insert)
            return await self._transaction(insert)
        steps = _submit_steps(jobs, self._now())
        if isinstance(connection, psycopg.AsyncConnection):
            if connection.autocommit:
                async with connection.transaction():
                    return await _run_steps(connection, steps)
            return await _run_steps(connection, steps)
        if isinstance(connection, psycopg.Connection):
            # A blocking connection blocks: run it on a thread, its owner is waiting for us.
            return await asyncio.to_thread(_run_steps_sync, connection, steps)
        raise ConfigurationError(
            "connection= takes a psycopg 3 connection (psycopg.AsyncConnection or "
            f"psycopg.Connection), not {type(connection).__name__}: with SQLAlchemy pass "
            "its driver_connection, with Django django.db.connection.connection"
        )

    async def get(self, job_id: str) -> Job | None:
        rows = await self._fetch("get", {"id": job_id})
        return _job(rows[0]) if rows else None

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        params = {
            "statuses": [s.value for s in query.status] if query.status else None,
            "type": query.type,
            "queue": query.queue,
            "tenant": query.tenant,
            "parent_id": query.parent_id,
            "root_id": query.root_id,
            "before_id": query.before_id,
            "limit": query.limit,
        }
        return [_job(row) for row in await self._fetch("list_jobs", params)]

    async def attempts(self, job_id: str) -> list[Attempt]:
        return [
            Attempt(
                job_id=row["job_id"],
                number=row["number"],
                worker_id=row["worker_id"],
                started_at=_utc(row["started_at"]),
                finished_at=_utc(row["finished_at"]),
                outcome=Outcome(row["outcome"]),
                error=row["error"],
                traceback=row["traceback"],
            )
            for row in await self._fetch("attempts", {"job_id": job_id})
        ]

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
            "queues": list(queues),
            "limit": limit,
            "lease": float(lease),
            "now": self._now(),
        }
        if limits:
            flow = limits
            jobs = await self._transaction(lambda conn: self._claim_limited(conn, params, flow))
        else:
            jobs = await self._run(lambda conn: _fetch_jobs(conn, _Q["claim"], params))
        # RETURNING does not keep the claim order; the worker starts jobs in this order.
        return sorted(jobs, key=lambda j: (j.priority, j.run_at, j.id))

    async def _claim_limited(
        self, conn: Connection, params: dict[str, Any], limits: Limits
    ) -> list[Job]:
        """Claim within concurrency and rate limits.

        The claims of each limited type are serialised by an advisory lock per type, so
        the counts read under it are exact. Nobody waits for it: a type whose lock another
        worker holds is skipped by this claim, and claims of other types go on.
        """
        now = params["now"]
        capacity = FlowCapacity.start(limits)
        shared = sorted(set(limits.cluster) | set(limits.per_key) | set(limits.rate))
        if shared:
            locked = {r["type"] for r in await self._rows(conn, "lock_limited_types", types=shared)}
            capacity.blocked_types.update(t for t in shared if t not in locked)
        if limits.cluster:
            rows = await self._rows(conn, "running_per_type", now=now, types=list(limits.cluster))
            capacity.count_running({r["type"]: int(r["n"]) for r in rows})
        if limits.per_key:
            rows = await self._rows(conn, "running_per_key", now=now, types=list(limits.per_key))
            capacity.count_keys({(r["type"], r["concurrency_key"]): int(r["n"]) for r in rows})
        for job_type, (_count, window) in limits.rate.items():
            window_params = {"type": job_type, "window": float(window), "now": now}
            await conn.execute(_Q["forget_rate_window"], window_params)
            (used,) = await self._rows(conn, "rate_window_count", **window_params)
            capacity.count_rate(job_type, int(used["n"]))
        taken: list[str] = []
        taken_types: list[str] = []
        for _ in range(8):  # each round blocks at least one more type or key
            want = params["limit"] - len(taken)
            round_params = params | {
                "limit": want,
                "blocked_types": sorted(capacity.blocked_types),
                "blocked_keys": sorted(f"{t}\x1f{k}" for t, k in capacity.blocked_keys),
                "taken": taken,
            }
            rows = await self._rows(conn, "claim_candidates", **round_params)
            for r in rows:
                if capacity.take(r["type"], r["concurrency_key"]):
                    taken.append(r["id"])
                    taken_types.append(r["type"])
            if len(rows) < want or len(taken) >= params["limit"]:
                break
        if not taken:
            return []
        claimed = await self._rows(conn, "claim_ids", **(params | {"ids": taken}))
        rated = [t for t in taken_types if t in limits.rate]
        if rated:
            await conn.execute(_Q["record_rate_starts"], {"types": rated, "now": now})
        return [_job(r) for r in claimed]

    @staticmethod
    async def _rows(conn: Connection, query: str, /, **params: Any) -> list[DictRow]:
        return await (await conn.execute(_Q[query], params)).fetchall()

    async def _db_now(self, conn: Connection) -> datetime:
        """The pinned time, or the server's now() (the transaction's start)."""
        pinned = self._now()
        if pinned is not None:
            return pinned
        (row,) = await self._rows(conn, "now")
        now = _utc(row["now"])
        if now is None:
            raise RuntimeError("the database returned no time")
        return now

    async def heartbeat(
        self,
        *,
        worker_id: str,
        leases: Sequence[Lease],
        lease: float,
        progress: Mapping[Lease, Progress],
    ) -> Beat:
        keys = list(dict.fromkeys([*leases, *progress]))
        held = set(leases)
        params = {
            "worker_id": worker_id,
            "lease": float(lease),
            "now": self._now(),
            "ids": [k.job_id for k in keys],
            "tokens": [k.token for k in keys],
            "renew": [k in held for k in keys],
            "done": [float(progress[k].done) if k in progress else None for k in keys],
            "total": [_float(progress[k].total) if k in progress else None for k in keys],
            "message": [progress[k].message if k in progress else None for k in keys],
        }
        budget = max(0.05, min(lease * _HEARTBEAT_MARGIN_FRACTION, _HEARTBEAT_MARGIN_CAP) / 2)

        async def beat(conn: Connection) -> list[DictRow]:
            return await (await conn.execute(_Q["heartbeat"], params)).fetchall()

        try:
            async with asyncio.timeout(budget):
                rows = await self._run(beat, timeout=budget)
        except TimeoutError:
            raise TimeoutError(
                f"no answer from {self._where()} within {budget:.2f}s (a small part of the "
                "lease, so that runs are stopped before their leases can expire)"
            ) from None
        busy = frozenset(row["id"] for row in rows if row["busy"])
        renewed = {
            row["id"]: bool(row["cancel_requested"])
            for row in rows
            if row["renew"] and not row["busy"]
        }
        return Beat(
            lost=frozenset(x.job_id for x in leases if x.job_id not in renewed.keys() | busy),
            cancel_requested=frozenset(k for k, v in renewed.items() if v),
            busy=busy,
        )

    async def settle(self, settlements: Sequence[Settlement]) -> list[str]:
        if not settlements:
            return []
        return await self._transaction(lambda conn: self._settle(conn, settlements))

    async def _settle(self, conn: Connection, settlements: Sequence[Settlement]) -> list[str]:
        """Settle in the caller's transaction; a job's end reaches its parent and dependents.

        The common batch, jobs without parent, children or dependents, is one round trip
        (BEGIN, settle and the look-up of dependents pipelined) plus the COMMIT.
        """
        now = self._now()
        ended = [s.job_id for s in settlements if s.status.terminal]
        async with conn.pipeline():
            settled = await conn.execute(_Q["settle"], _settle_params(settlements, now, False))
            awaited = await conn.execute(_Q["awaited"], {"ids": ended}) if ended else None
            rows = await settled.fetchall()
            upstream = {r["id"] for r in await awaited.fetchall()} if awaited else set()
        by_id = {row["id"]: row for row in rows}
        deferred = [s for s in settlements if s.job_id in by_id and by_id[s.job_id]["deferred"]]
        finished = [
            (s.job_id, by_id[s.job_id]["parent_id"], s.status)
            for s in settlements
            if s.job_id in by_id and not by_id[s.job_id]["deferred"] and s.status.terminal
        ]
        if deferred:
            decided = await self._decide_from_children(conn, deferred)
            params = _settle_params(decided, now, True)
            for row in await (await conn.execute(_Q["settle"], params)).fetchall():
                by_id[row["id"]] = row
            finished.extend(
                (d.job_id, by_id[d.job_id]["parent_id"], d.status)
                for d in decided
                if not by_id[d.job_id]["deferred"] and d.status.terminal
            )
            upstream.update(d.job_id for d in decided)
        await self._cascade_all(
            conn,
            [f for f in finished if f[1] is not None or f[0] in upstream],
            now,
            without_dependents=frozenset(f[0] for f in finished if f[0] not in upstream),
        )
        return [s.job_id for s in settlements if s.job_id not in by_id]

    async def _decide_from_children(
        self, conn: Connection, settlements: Sequence[Settlement]
    ) -> list[Settlement]:
        """Turn 'the handler returned' into waiting, succeeded or failed, from the children."""
        ids = [s.job_id for s in settlements]
        await conn.execute(_Q["lock_children"], {"ids": ids})
        counts = await self._children_counts(conn, ids)
        decided = []
        for s in settlements:
            children = counts.get(s.job_id, {})
            status = transition(Status.RUNNING, returned_event(children))
            error = children_error(children) if status is Status.FAILED else s.error
            decided.append(dataclasses.replace(s, status=status, error=error))
        return decided

    @staticmethod
    async def _children_counts(
        conn: Connection, ids: Sequence[str]
    ) -> dict[str, dict[Status, int]]:
        counts: dict[str, dict[Status, int]] = {}
        for row in await (await conn.execute(_Q["children_counts"], {"ids": list(ids)})).fetchall():
            counts.setdefault(row["parent_id"], {})[Status(row["status"])] = int(row["n"])
        return counts

    async def _cascade(
        self,
        conn: Connection,
        job_id: str,
        parent_id: str | None,
        status: Status,
        now: datetime | None,
    ) -> None:
        """Carry a job's end to its waiting parent and its pending dependents, transitively."""
        await self._cascade_all(conn, [(job_id, parent_id, status)], now)

    async def _cascade_all(
        self,
        conn: Connection,
        ended: list[tuple[str, str | None, Status]],
        now: datetime | None,
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
                finished = await self._finish_parent(conn, parent_id, now)
                if finished is not None:
                    todo.append(finished)
            for job_id, _, status in round_:
                if job_id in without_dependents:
                    continue
                dependents = await (
                    await conn.execute(_Q["pending_dependents"], {"id": job_id})
                ).fetchall()
                for dependent in dependents:
                    if dependency_event(status) is None:
                        unmet = await (
                            await conn.execute(_Q["unmet_dependencies"], {"id": dependent["id"]})
                        ).fetchone()
                        if unmet is not None and unmet["n"] == 0:
                            await conn.execute(_Q["release_pending"], {"id": dependent["id"]})
                        continue
                    reason = f"dependency {job_id} {status.value}"
                    params = {"id": dependent["id"], "reason": reason, "now": now}
                    row = await (await conn.execute(_Q["cancel_pending"], params)).fetchone()
                    if row is not None:
                        todo.append((row["id"], row["parent_id"], Status.CANCELLED))

    async def _finish_parent(
        self, conn: Connection, parent_id: str, now: datetime | None
    ) -> tuple[str, str | None, Status] | None:
        """End a waiting parent whose children have all ended; return it if it ended."""
        await conn.execute(_Q["lock_children"], {"ids": [parent_id]})
        counts = (await self._children_counts(conn, [parent_id])).get(parent_id, {})
        event = children_event(counts)
        if event is None:
            return None
        status = transition(Status.WAITING, event)
        error = children_error(counts) if status is Status.FAILED else None
        params = {"id": parent_id, "status": status.value, "error": error, "now": now}
        row = await (await conn.execute(_Q["finish_waiting"], params)).fetchone()
        return None if row is None else (row["id"], row["parent_id"], status)

    async def checkpoint(self, lease: Lease, state: JSON) -> bool:
        params = {"id": lease.job_id, "token": lease.token, "state": _dumps(state)}
        return await self._execute("checkpoint", params) == 1

    async def rescue(self, *, limit: int, jitter: float) -> list[Rescued]:
        async def rescue(conn: Connection) -> list[Rescued]:
            params = {"now": self._now(), "limit": limit}
            rows = await (await conn.execute(_Q["rescue"], params)).fetchall()
            if not rows:
                return []
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
            refused = set(await self._settle(conn, decisions))
            owners = {r["id"]: r["lease_owner"] for r in rows}
            return [
                Rescued(job_id=d.job_id, worker_id=owners[d.job_id], status=d.status)
                for d in decisions
                if d.job_id not in refused
            ]

        return await self._transaction(rescue)

    async def cancel(self, job_id: str, *, reason: str) -> Job | None:
        now = self._now()

        async def cancel(conn: Connection) -> Job | None:
            await self._cancel_one(conn, job_id, reason, now)
            row = await (await conn.execute(_Q["get"], {"id": job_id})).fetchone()
            return None if row is None else _job(row)

        return await self._transaction(cancel)

    async def _cancel_one(
        self, conn: Connection, job_id: str, reason: str, now: datetime | None
    ) -> None:
        """Cancel a job now, or ask its worker to; a waiting job takes its subtree along.

        Each statement sees what committed before it: a job claimed between the first
        and the last is still asked to stop.
        """
        params = {"id": job_id, "reason": reason, "now": now}
        row = await (await conn.execute(_Q["cancel_unstarted"], params)).fetchone()
        if row is None:
            row = await (await conn.execute(_Q["cancel_waiting"], params)).fetchone()
            if row is not None:
                below = await (
                    await conn.execute(_Q["unfinished_descendants"], {"id": job_id})
                ).fetchall()
                for child in below:
                    child_params = {
                        "id": child["id"],
                        "reason": f"parent {job_id} cancelled",
                        "now": now,
                    }
                    if child["status"] == Status.RUNNING.value:
                        await conn.execute(_Q["request_cancel"], child_params)
                    else:
                        await conn.execute(_Q["cancel_unstarted"], child_params)
                        await conn.execute(_Q["cancel_waiting"], child_params)
                        await self._cascade(conn, child["id"], None, Status.CANCELLED, now)
        if row is None:
            await conn.execute(_Q["request_cancel"], params)
            return
        await self._cascade(conn, job_id, row["parent_id"], Status.CANCELLED, now)

    async def retry(self, job_id: str, new: NewJob) -> Job | None:
        async def retry(conn: Connection) -> Job | None:
            old = await (await conn.execute(_Q["get"], {"id": job_id})).fetchone()
            if old is None:
                return None
            if old["status"] not in (Status.FAILED.value, Status.CANCELLED.value):
                raise InvalidState(
                    f"job {job_id} is {old['status']}: only failed or cancelled jobs can be retried"
                )
            (submitted,) = await _run_steps(conn, _submit_steps([new], self._now()))
            return submitted.job

        return await self._transaction(retry)

    async def spawn(self, lease: Lease, jobs: Sequence[NewJob]) -> list[Submitted] | None:
        async def spawn(conn: Connection) -> list[Submitted] | None:
            params = {"id": lease.job_id, "token": lease.token}
            holder = await (await conn.execute(_Q["lease_holder"], params)).fetchone()
            if holder is None:
                return None
            children = [
                dataclasses.replace(job, parent_id=lease.job_id, root_id=holder["root_id"])
                for job in jobs
            ]
            return await _run_steps(conn, _submit_steps(children, self._now()))

        return await self._transaction(spawn)

    async def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        return [_job(row) for row in await self._fetch("get_many", {"ids": list(job_ids)})]

    async def finish_parents(self, *, limit: int) -> list[str]:
        now = self._now()

        async def finish(conn: Connection) -> list[str]:
            done = []
            parents = await (await conn.execute(_Q["waiting_parents"], {"limit": limit})).fetchall()
            for parent in parents:
                finished = await self._finish_parent(conn, parent["id"], now)
                if finished is not None:
                    done.append(finished[0])
                    await self._cascade(conn, *finished, now)
            return done

        return await self._transaction(finish)

    # -- schedules ----------------------------------------------------------------------

    async def sync_schedules(self, schedules: Sequence[Schedule]) -> None:
        async def sync(conn: Connection) -> None:
            moment = await self._db_now(conn)
            rows = [
                _schedule_params(s) | {"next_run_at": s.cron.next_after(moment), "now": self._now()}
                for s in schedules
            ]
            if rows:
                async with conn.cursor() as cursor:
                    await cursor.executemany(_Q["upsert_schedule"], rows)

        await self._transaction(sync)

    async def fire_schedules(self, *, limit: int, min_grace: float = 0.0) -> list[str]:
        async def fire(conn: Connection) -> list[str]:
            created: list[str] = []
            for row in await self._rows(conn, "due_schedules", now=self._now(), limit=limit):
                info = _schedule(row)
                now = _utc(row["read_at"])
                if now is None:
                    raise RuntimeError("the database returned no time")
                firing = plan_schedule(
                    info.schedule, next_run_at=info.next_run_at, now=now, min_grace=min_grace
                )
                moved = await conn.execute(
                    _Q["advance_schedule"],
                    {
                        "name": info.schedule.name,
                        "expected": row["next_run_at"],
                        "next_run_at": firing.next_run_at,
                        "last_run_at": firing.ticks[-1] if firing.ticks else row["last_run_at"],
                    },
                )
                if moved.rowcount != 1:
                    continue  # another worker fired these ticks
                jobs = [schedule_job(info.schedule, tick) for tick in firing.ticks]
                if jobs:
                    submitted = await _run_steps(conn, _submit_steps(jobs, self._now()))
                    created.extend(s.job.id for s in submitted if s.created)
            return created

        return await self._transaction(fire)

    async def schedules(self) -> list[ScheduleInfo]:
        return [_schedule(row) for row in await self._fetch("schedules")]

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleInfo | None:
        async def toggle(conn: Connection) -> ScheduleInfo | None:
            rows = await self._rows(conn, "get_schedule", name=name)
            if not rows:
                return None
            cron = Cron(rows[0]["cron"], rows[0]["timezone"])
            upcoming = cron.next_after(await self._db_now(conn))
            params = {"name": name, "enabled": enabled, "next_run_at": upcoming}
            (row,) = await self._rows(conn, "set_schedule_enabled", **params, now=self._now())
            return _schedule(row)

        return await self._transaction(toggle)

    async def run_schedule(self, name: str) -> Job | None:
        async def run(conn: Connection) -> Job | None:
            rows = await self._rows(conn, "get_schedule", name=name)
            if not rows:
                return None
            now = await self._db_now(conn)
            job = schedule_job(_schedule(rows[0]).schedule, now, manual=True)
            (submitted,) = await _run_steps(conn, _submit_steps([job], self._now()))
            return submitted.job

        return await self._transaction(run)

    # -- named leases -------------------------------------------------------------------

    async def acquire_lease(self, name: str, *, owner: str, ttl: float) -> LeaseRecord:
        async def acquire(conn: Connection) -> LeaseRecord:
            before = await self._rows(conn, "get_lease", name=name)
            params = {"name": name, "owner": owner, "ttl": float(ttl), "now": self._now()}
            taken = await self._rows(conn, "take_lease", **params)
            if not taken:
                # Held by someone else; read it again in case it was created meanwhile.
                (current,) = await self._rows(conn, "current_lease", name=name)
                return _lease(current)
            if before and before[0]["owner"] is not None:
                await self._record_lease_end(conn, before[0], before[0]["expires_at"], "expired")
            return _lease(taken[0])

        return await self._transaction(acquire)

    async def _record_lease_end(
        self, conn: Connection, row: Mapping[str, Any], ended_at: datetime, how: str
    ) -> None:
        await conn.execute(
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
        await conn.execute(_Q["trim_lease_history"], {"name": row["name"]})

    async def renew_lease(self, name: str, *, token: int, ttl: float) -> datetime | None:
        params = {"name": name, "token": token, "ttl": float(ttl), "now": self._now()}
        rows = await self._fetch("renew_lease", params)
        return _utc(rows[0]["expires_at"]) if rows else None

    async def release_lease(self, name: str, *, token: int) -> bool:
        async def release(conn: Connection) -> bool:
            before = await self._rows(conn, "get_lease", name=name)
            params = {"name": name, "token": token, "now": self._now()}
            released = await self._rows(conn, "release_lease", **params)
            if not released or not before:
                return False
            held, now = before[0], released[0]["released_at"]
            expired = held["expires_at"] is not None and held["expires_at"] <= now
            ended_at = held["expires_at"] if expired else now
            await self._record_lease_end(conn, held, ended_at, "expired" if expired else "released")
            return not expired

        return await self._transaction(release)

    async def lease_history(self, name: str) -> list[LeaseRecord]:
        async def read(conn: Connection) -> list[LeaseRecord]:
            current = await self._rows(conn, "current_lease", name=name)
            past = [
                LeaseRecord(
                    name=r["name"],
                    owner=r["owner"],
                    token=r["token"],
                    acquired_at=_utc(r["acquired_at"]) or datetime.fromtimestamp(0, UTC),
                    ended_at=_utc(r["ended_at"]),
                    ended=r["ended"],
                )
                for r in await self._rows(conn, "lease_history", name=name)
            ]
            if current and current[0]["owner"] is not None:
                return [_lease(current[0]), *past]
            return past

        return await self._run(read)

    # -- retention ----------------------------------------------------------------------

    async def prune(self, retention: Retention, *, limit: int) -> int:
        async def prune(conn: Connection) -> int:
            roots: list[str] = []
            overridden = sorted(retention.per_type)
            for status in ("succeeded", "failed", "cancelled"):
                for job_type in [None, *overridden]:
                    if len(roots) >= limit:
                        break
                    rows = await self._rows(
                        conn,
                        "prunable_roots",
                        status=status,
                        keep=min(retention.seconds(status, job_type), _FOREVER),
                        type=job_type,
                        excluded_types=overridden if job_type is None else [],
                        limit=limit - len(roots),
                        now=self._now(),
                    )
                    roots.extend(r["id"] for r in rows)
            if not roots:
                return 0
            return (await conn.execute(_Q["prune_trees"], {"roots": roots})).rowcount

        return await self._transaction(prune)

    # -- workers and queues -------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo) -> None:
        params = {
            "id": worker.id,
            "hostname": worker.hostname,
            "pid": worker.pid,
            "queues": list(worker.queues),
            "concurrency": worker.concurrency,
            "now": self._now(),
        }
        await self._execute("register_worker", params)

    async def deregister_worker(self, worker_id: str) -> None:
        await self._execute("deregister_worker", {"worker_id": worker_id, "now": self._now()})

    async def workers(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=row["id"],
                hostname=row["hostname"],
                pid=row["pid"],
                queues=tuple(row["queues"]),
                concurrency=row["concurrency"],
                started_at=_utc(row["started_at"]),
                heartbeat_at=_utc(row["heartbeat_at"]),
                stopped_at=_utc(row["stopped_at"]),
            )
            for row in await self._fetch("workers")
        ]

    async def queues(self) -> list[QueueInfo]:
        counts: dict[str, dict[str, int]] = {}
        paused: dict[str, bool] = {}
        for row in await self._fetch("queues"):
            name = row["name"]
            paused[name] = bool(row["paused"])
            bucket = counts.setdefault(name, {})
            if row["status"] is not None:
                bucket[row["status"]] = int(row["n"])
        return [QueueInfo(name, paused[name], counts[name]) for name in sorted(counts)]

    async def set_paused(self, queue: str, paused: bool) -> None:
        params = {"name": queue, "paused": paused, "now": self._now()}
        await self._execute("set_paused", params)

    # -- wake-ups -----------------------------------------------------------------------

    async def wait_for_jobs(self, timeout: float) -> frozenset[str]:
        """Wait for a notification (new work or a cancel request), or ``timeout`` seconds.

        The first call starts a task that keeps a LISTEN connection open, reconnecting
        with backoff when it drops; polling by the caller covers the gap.
        """
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name="conveyor-postgres-listen"
            )
        if not self._wake.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass
        self._wake.clear()
        cancelled, self._cancelled = frozenset(self._cancelled), set()
        return cancelled

    async def _listen(self) -> None:
        failures = 0
        while True:
            try:
                conn = await self._connect()
                async with conn:
                    await conn.execute(_Q["listen"])
                    if failures:
                        log.warning("listening for notifications again on %s", self._where())
                    failures = 0
                    # Whatever happened while nobody listened is found by claiming now.
                    self._wake.set()
                    async for note in conn.notifies():
                        if note.channel == CANCEL_CHANNEL:
                            self._cancelled.add(note.payload)
                        self._wake.set()
            except (psycopg.Error, DatabaseUnavailable) as exc:
                failures += 1
                if failures == 1:
                    log.warning(
                        "no notification connection to %s (%s); polling until it is back",
                        self._where(),
                        _reason(exc),
                    )
            await asyncio.sleep(min(10.0, 0.2 * 2**failures) * (0.5 + random.random()))

    def _where(self) -> str:
        return _describe(self._params)

    # -- the API's reads and tokens -----------------------------------------------------

    async def page_jobs(self, query: JobPageQuery) -> list[Job]:
        params = {
            "statuses": [s.value for s in query.status] if query.status else None,
            "type": query.type,
            "queue": query.queue,
            "tenant": query.tenant,
            "parent_id": query.parent_id,
            "root_id": query.root_id,
            "top_level": query.top_level,
            "created_after": query.created_after,
            "created_before": query.created_before,
            "after_created": query.after[0] if query.after else None,
            "after_id": query.after[1] if query.after else None,
            "limit": query.limit,
        }
        scope = "page_jobs" if query.tenant is None else "page_tenant_jobs"
        name = f"{scope}_{'newest' if query.newest_first else 'oldest'}_first"
        return [_job(row) for row in await self._fetch(name, params)]

    async def health(self) -> HealthCounts:
        (row,) = await self._fetch("health", {"now": self._now()})
        now = _utc(row["now"])
        if now is None:
            raise RuntimeError("the database returned no time")
        return HealthCounts(
            queued=row["queued"],
            due=row["due"],
            running=row["running"],
            stale_running=row["stale_running"],
            workers=row["workers"],
            live_workers=row["live_workers"],
            last_heartbeat=_utc(row["last_heartbeat"]),
            now=now,
        )

    async def create_token(self, token: Token) -> None:
        params = {
            "id": token.id,
            "tenant": token.tenant,
            "role": token.role.value,
            "secret_hash": token.secret_hash,
            "name": token.name,
            "created_at": token.created_at,
        }
        await self._execute("create_token", params)

    async def find_token(self, token_id: str) -> Token | None:
        rows = await self._fetch("find_token", {"id": token_id})
        return _token(rows[0]) if rows else None

    async def touch_token(self, token_id: str) -> None:
        await self._execute("touch_token", {"id": token_id, "now": self._now()})

    async def revoke_token(self, token_id: str) -> Token | None:
        rows = await self._fetch("revoke_token", {"id": token_id, "now": self._now()})
        return _token(rows[0]) if rows else None

    async def list_tokens(self) -> list[Token]:
        return [_token(row) for row in await self._fetch("list_tokens")]


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def _settle_params(
    settlements: Sequence[Settlement], now: datetime | None, decided: bool
) -> dict[str, Any]:
    return {
        "now": now,
        "decided": decided,
        "ids": [s.job_id for s in settlements],
        "tokens": [s.token for s in settlements],
        "statuses": [s.status.value for s in settlements],
        "outcomes": [s.outcome.value if s.outcome else None for s in settlements],
        "results": [_dumps(s.result) for s in settlements],
        "result_refs": [s.result_ref for s in settlements],
        "errors": [s.error for s in settlements],
        "tracebacks": [s.traceback for s in settlements],
        "retry_delays": [float(s.retry_delay) for s in settlements],
        "done": [float(s.progress.done) if s.progress else None for s in settlements],
        "total": [_float(s.progress.total) if s.progress else None for s in settlements],
        "message": [s.progress.message if s.progress else None for s in settlements],
    }


def _token(row: Mapping[str, Any]) -> Token:
    created_at = _utc(row["created_at"])
    if created_at is None:
        raise RuntimeError(f"token {row['id']!r} has no created_at")
    return Token(
        id=row["id"],
        tenant=row["tenant"],
        role=Role(row["role"]),
        secret_hash=row["secret_hash"],
        name=row["name"],
        created_at=created_at,
        last_used_at=_utc(row["last_used_at"]),
        revoked_at=_utc(row["revoked_at"]),
    )
