"""PostgreSQL implementation of the store protocol.

The domain's transaction scripts live in :mod:`conveyor.store.scripts`; this module
holds the pools, the one runner that drives a script, and the tuned hot path: submit,
claim, heartbeat and the settle UPDATE.

Every transaction of more than one statement runs to its end on a thread of the store
(:meth:`PostgresStore._transaction`), on a blocking connection, and commits there. A
transaction sent from the event loop would hold its row locks until the loop came back
to send COMMIT: a handler that blocks the loop for a few seconds would then hold the
rows a heartbeat must renew, and the leases would expire under live runs. The claim runs
there too, even a plain one (one statement in autocommit): the worker's ``on_claimed``
hands the leases to its heartbeat on that thread, however long the loop is blocked.
Other statements that are a transaction on their own (a heartbeat, a read) run on the
event loop in autocommit, where nothing is held between them.

Connections per store: at most ``pool_size`` (default 10) on the event loop's pool,
at most ``_TX_POOL_MAX`` (4) on the transaction threads' pool, which opens them only
when needed, one LISTEN connection once :meth:`PostgresStore.wait_for_jobs` is called,
and one for one-job submits once a job is submitted alone (``_lane.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from conveyor.core.auth import Token
from conveyor.core.model import JSON, Attempt, Job, NewJob, Progress, Settlement
from conveyor.errors import ConfigurationError, DatabaseUnavailable
from conveyor.store import scripts
from conveyor.store._fairness import TenantMix
from conveyor.store._pooling import Pooling
from conveyor.store._queries import load_migrations
from conveyor.store._reads import SharedReads
from conveyor.store._scripted import ScriptedOps
from conveyor.store.postgres._codec import (
    Q as _Q,
)
from conveyor.store.postgres._codec import (
    fetch_jobs,
    heartbeat_params,
    job_of_row,
    our_loaders,
    run_script,
    run_script_async,
    utc,
)
from conveyor.store.postgres._connection import (
    ACQUIRE_TIMEOUT,
    ATTEMPTS,
    OUR_CONNECTIONS,
    QUIET_POOLS,
    advice,
    describe,
    may_run_again,
    parse_postgres_url,
    reason,
    redact,
    retrying,
)
from conveyor.store.postgres._dialect import DIALECT
from conveyor.store.postgres._errors import translated
from conveyor.store.postgres._lane import OneJobSubmits
from conveyor.store.postgres._migrations import apply_migrations, schema_version
from conveyor.store.postgres._pooler import Route, Wakeups
from conveyor.store.postgres._settle import Settles
from conveyor.store.postgres._submit import ApplicationSubmits
from conveyor.store.postgres._submitter import Submitter
from conveyor.store.protocol import (
    AuditEntry,
    Beat,
    Inserted,
    JobPageQuery,
    Lease,
    Limits,
    Rescued,
    Submitted,
    WorkerInfo,
)

T = TypeVar("T")
Connection = psycopg.AsyncConnection[DictRow]
SyncConnection = psycopg.Connection[DictRow]

log = logging.getLogger("conveyor.store.postgres")

_MIGRATIONS = load_migrations("conveyor.store.postgres")


_POOL_MIN = 1
_POOL_MAX = 10
# Transactions run on this many threads, each with a connection of the transaction pool
# while it runs: a worker settles, claims and rescues one batch at a time, so a few
# suffice; more would only hold more connections of a shared server.
_TX_POOL_MAX = 4
# A heartbeat is useless once it cannot finish well within the lease: give it half of the
# margin the worker keeps before it stops a run whose lease it could not renew, so that a
# hung database makes the heartbeat fail (and the worker self-fence) in time.
_HEARTBEAT_MARGIN_FRACTION = 1 / 6
_HEARTBEAT_MARGIN_CAP = 2.0
# A heartbeat of more leases than this is planned each time rather than prepared.
_PREPARED_BEAT_MAX = 50

__all__ = ["PostgresStore", "parse_postgres_url"]


class PostgresStore(ScriptedOps, SharedReads):
    """A store on one PostgreSQL database, shared by any number of workers and clients.

    Single statements run on a pool of autocommit connections on the event loop;
    transactions on a pool of their own, driven to their end on the store's threads;
    ``wait_for_jobs`` keeps one more connection that LISTENs for wake-ups and cancel
    requests.
    """

    dialect = DIALECT

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] | None = None,
        migrate: bool = True,
        pool_size: int = _POOL_MAX,
        pooling: Pooling | None = None,
    ) -> None:
        self.url = url
        self._params = parse_postgres_url(url)
        self._route = Route(url, pooling or Pooling())
        self._clock = clock
        self._auto_migrate = migrate
        self._tenant_mix = TenantMix()
        if pool_size < 1:
            raise ConfigurationError("pool_size must be at least 1")
        self._pool_size = pool_size
        self._kwargs = self._route.connect_kwargs(self._params)
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._tx_pool: ConnectionPool[SyncConnection] | None = None
        self._tx_threads: ThreadPoolExecutor | None = None
        self._checking: asyncio.Task[None] | None = None
        self._wakeups = Wakeups(self._route, self._connect, self._where)
        self._pool_name = f"conveyor-{id(self):x}"
        self._reconnecting = False
        # The lane prepares its INSERT once per session: not through a transaction pooler.
        self._one_job = OneJobSubmits(
            self._connect, self._run, self._where, lane=not self._route.pooled
        )
        self._submitter = Submitter(
            lane=self._one_job,
            on_application=ApplicationSubmits(self._database),
            read=self._read,
            script=self._script,
            transaction=self._transaction,
            tx_pool=lambda: self._tx_pool,
            now=self._now,
            where=self._where,
        )
        self._settles = Settles(self._transaction, self._now)

    def __repr__(self) -> str:
        return f"<PostgresStore {redact(self.url)}>"

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
            raise self._unavailable(exc) from None

    def _unavailable(self, exc: psycopg.OperationalError) -> DatabaseUnavailable:
        why = reason(exc)
        return DatabaseUnavailable(f"cannot connect to {self._where()}: {why}. {advice(why)}")

    async def _run(
        self, work: Callable[[Connection], Awaitable[T]], *, timeout: float = ACQUIRE_TIMEOUT
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
            for attempt in range(1, ATTEMPTS + 1):
                async with pool.connection(timeout=timeout) as conn:
                    try:
                        return await work(conn)
                    except psycopg.Error as exc:
                        if not may_run_again(exc, conn, attempt):
                            raise
                if conn.broken:
                    self._check_pool(pool)
        raise AssertionError("not reached")

    async def _transaction(
        self,
        work: Callable[[SyncConnection], T],
        *,
        atomic: bool = True,
        then: Callable[[T], None] | None = None,
    ) -> T:
        """Run ``work`` in one transaction on a thread of the store, and commit it there.

        The event loop only waits for the result: however long the loop is blocked, the
        transaction ends (and lets go of its row locks) without it. The retries are those
        of :meth:`_run`. ``atomic=False``: autocommit (one statement, one round trip).
        ``then`` gets the result on that thread once committed, before the event loop.
        """
        threads, pool = self._tx_threads, self._tx_pool
        if threads is None or pool is None:
            raise RuntimeError("the store is not open: call open() first")

        def attempt_once(conn: SyncConnection) -> T:
            if not atomic:
                return work(conn)
            with conn.transaction():
                return work(conn)

        def run() -> T:
            result = retrying(pool, attempt_once)
            if then is not None:
                then(result)
            return result

        with translated(self._where):
            return await asyncio.get_running_loop().run_in_executor(threads, run)

    def _drive(self, conn: SyncConnection, script: scripts.Script[T]) -> T:
        """Run a transaction script on a transaction thread's connection."""
        with conn.cursor() as cursor:
            return run_script(cursor, script, self._now())

    async def _script(self, make: Callable[[], scripts.Script[T]]) -> T:
        """Run the script ``make`` returns in one transaction, off the event loop."""
        return await self._transaction(lambda conn: self._drive(conn, make()))

    async def _read(self, make: Callable[[], scripts.Script[T]]) -> T:
        """Run a script of reads (or of one write) in autocommit, on the event loop."""

        async def read(conn: Connection) -> T:
            async with conn.cursor() as cursor:
                return await run_script_async(cursor, make(), self._now())

        return await self._run(read)

    async def _statement(self, make: Callable[[], scripts.Script[T]]) -> T:
        """Run a script of one write in autocommit, on the event loop: one round trip."""
        return await self._read(make)

    def _connected_sync(self, conn: SyncConnection) -> None:
        """Set up a new connection of the transaction pool."""
        if not self._route.pooled:
            conn.execute(_Q["session_settings"])
        self._set_up(conn)

    async def _connected(self, conn: Connection) -> None:
        """Set up a new pooled connection (and do not log its routine discarding).

        Through a transaction pooler a session ``SET`` would stay on whichever server
        connection ran it, for other clients, and be missing from the next: the
        settings are then the role's or the database's (docs/postgres.md).
        """
        if not self._route.pooled:
            await conn.execute(_Q["session_settings"])
        self._set_up(conn)

    def _set_up(self, conn: SyncConnection | Connection) -> None:
        our_loaders(conn.adapters)
        OUR_CONNECTIONS.add(conn)
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

    def _time_param(self, value: datetime | None) -> Any:
        return self._now() if value is None else value

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
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self.url,
            connection_class=psycopg.AsyncConnection[DictRow],
            kwargs={"autocommit": True, "row_factory": dict_row, **self._kwargs},
            min_size=_POOL_MIN,
            max_size=self._pool_size,
            timeout=ACQUIRE_TIMEOUT,
            name=self._pool_name,
            configure=self._connected,
            open=False,
        )
        QUIET_POOLS[self._pool_name] = self
        # The schema's check and the pool's first connection at once: each is a connection
        # set up (a round trip or two and a server process), and a worker's start waits
        # for both. The pool is closed again if the check refuses the database.
        opening = asyncio.ensure_future(
            pool.open(wait=True, timeout=float(self._kwargs.get("connect_timeout", 10)))
        )
        try:
            await self._check_schema()
            await opening
        except BaseException as exc:
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            await pool.close()
            if isinstance(exc, psycopg.OperationalError):
                raise DatabaseUnavailable(
                    f"cannot open a connection pool to {describe(self._params)}: {reason(exc)}"
                ) from None
            raise
        self._pool = pool
        self._open_transactions()

    async def _check_schema(self) -> None:
        """Refuse a database that is not conveyor's or that a newer conveyor migrated;
        migrate one that needs it (when allowed)."""
        version = await asyncio.to_thread(self._schema_version)
        if version < len(_MIGRATIONS):
            if not self._auto_migrate:
                raise ConfigurationError(
                    f"database {describe(self._params)} needs migrations: run `conveyor migrate`"
                )
            await self.migrate()
        elif version > len(_MIGRATIONS):
            raise ConfigurationError(
                f"database {describe(self._params)} was migrated by a newer conveyor (schema "
                f"version {version}, this one knows {len(_MIGRATIONS)}): upgrade conveyor"
            )

    def _open_transactions(self) -> None:
        """Create the transaction threads and their pool, which connects when needed."""
        self._tx_pool = ConnectionPool(
            self.url,
            connection_class=psycopg.Connection[DictRow],
            kwargs={"autocommit": True, "row_factory": dict_row, **self._kwargs},
            min_size=0,
            max_size=_TX_POOL_MAX,
            timeout=ACQUIRE_TIMEOUT,
            name=f"{self._pool_name}-tx",
            configure=self._connected_sync,
            open=True,
        )
        QUIET_POOLS[f"{self._pool_name}-tx"] = self
        self._tx_threads = ThreadPoolExecutor(
            max_workers=_TX_POOL_MAX, thread_name_prefix="conveyor-postgres-tx"
        )

    def _connect_sync(self) -> SyncConnection:
        """Open a blocking connection of our own, or raise DatabaseUnavailable."""
        try:
            return psycopg.connect(self.url, autocommit=True, row_factory=dict_row, **self._kwargs)
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None

    def _schema_version(self) -> int:
        with self._connect_sync() as conn:
            self._route.check(conn, self._connect_sync)
            return schema_version(conn, self._where())

    async def migrate(self) -> list[str]:
        """Apply pending migrations on a connection of its own, under an advisory lock.

        Through a transaction pooler this still is one transaction, which the pooler keeps
        on one server connection; should it fail there, the message says to migrate on
        the direct URL.
        """

        def run() -> list[str]:
            with self._connect_sync() as conn:
                schema_version(conn, self._where())  # refuses a database not conveyor's
                return apply_migrations(conn, _MIGRATIONS, self._now())

        applied = await self._route.migrating(asyncio.to_thread(run), self._where())
        if applied:
            log.info("applied migrations to %s: %s", self._where(), ", ".join(applied))
        return applied

    async def close(self) -> None:
        tasks = [t for t in (self._checking,) if t is not None]
        self._checking = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, self._wakeups.close(), return_exceptions=True)
        await self._one_job.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        threads, tx_pool = self._tx_threads, self._tx_pool
        self._tx_threads = self._tx_pool = None
        if threads is not None:
            # Transactions under way end first: their callers may be gone, not their work.
            await asyncio.to_thread(threads.shutdown, wait=True)
        if tx_pool is not None:
            await asyncio.to_thread(tx_pool.close)

    async def now(self) -> datetime:
        pinned = self._now()
        if pinned is not None:
            return pinned
        (row,) = await self._fetch("now", {"now": None})
        return utc(row["now"])

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
        return await self._submitter.submit(jobs, connection)

    def submit_now(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> list[Submitted] | None:
        """:meth:`submit` on the calling thread, one without an event loop
        (``app.sync.submit``), sparing it the trips to the store's loop and back: in the
        transaction of an application's blocking ``connection`` that an earlier submit
        found on this database; without one, a job without dependencies as one statement
        in autocommit on a connection of the store's transaction pool. None, with nothing
        written, for anything else (several jobs, a taken id or unique key, a store not
        open): then ask :meth:`submit`."""
        return self._submitter.submit_now(jobs, connection)

    async def copy_prepared(self, chunks: Iterable[Sequence[NewJob]]) -> Inserted | None:
        """Insert the queued jobs of ``chunks`` with one COPY (``_submit.copy_chunks``),
        the chunks taken one after the other on the store's thread, each sent before the
        next is asked for: prepared as they are asked for, a batch is checked while the
        server inserts its first rows. Jobs without unique keys or dependencies only.
        Returns what was inserted as one record, its :class:`Job` per job made only if
        asked for (:meth:`Inserted.submitted`).

        None: an id was taken, and nothing was stored (submit the batch the usual way).
        Should ``chunks`` raise, nothing is stored and the error is raised. After a lost
        connection the COPY runs again: ``chunks`` must then give the same jobs again.
        """
        return await self._submitter.copy_prepared(chunks)

    async def _database(self) -> tuple[str, datetime]:
        """This store's database: its name and its server's start time (read each time: a
        restart changes the start time)."""
        (row,) = await self._fetch("database_identity")
        return (row["database"], row["started"])

    async def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        return [job_of_row(row) for row in await self._fetch("get_many", {"ids": list(job_ids)})]

    async def attempts(self, job_id: str) -> list[Attempt]:
        rows = await self._fetch("attempts", {"job_id": job_id})
        return [scripts.attempt(DIALECT, row) for row in rows]

    async def note_retry_limit(self, job_id: str, error: str) -> Job | None:
        rows = await self._fetch("note_retry_limit", {"id": job_id, "error": error})
        return job_of_row(rows[0]) if rows else None

    # -- the worker's hot path ----------------------------------------------------------

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
        # On a transaction thread, not on the event loop: the claimed jobs reach
        # ``on_claimed`` (a worker's heartbeat) there, however long the loop is blocked.
        if types is None:  # tests and tools: the types with jobs queued
            types = [r["type"] for r in await self._fetch("queued_types", {"queues": list(queues)})]
        params = {
            "worker_id": worker_id,
            "queues": list(queues),
            "types": list(types),
            "limit": limit,
            "lease": float(lease),
            "now": self._now(),
        }
        # Fairness across tenants: a look, at most once a second, at whether two or more
        # tenants have jobs queued (store/_fairness.py).
        if self._tenant_mix.stale():
            self._tenant_mix.saw(await self._fetch("queued_tenants", {"limit": 2}))
        fair = self._tenant_mix.mixed
        flow = limits or Limits()
        scripted = bool(limits) or fair

        def claim(conn: SyncConnection) -> list[Job]:
            if scripted:
                rows = self._drive(conn, scripts.claim_limited(params, flow, fair=fair))
                jobs = [job_of_row(r) for r in rows]
            else:
                jobs = fetch_jobs(conn, _Q["claim"], params)
            # RETURNING does not keep the claim order; the worker starts jobs in this order.
            return sorted(jobs, key=lambda j: (j.priority, j.run_at, j.id))

        # A plain claim is one statement: autocommit, one round trip.
        return await self._transaction(claim, atomic=scripted, then=on_claimed)

    async def heartbeat(
        self,
        *,
        worker_id: str,
        leases: Sequence[Lease],
        lease: float,
        progress: Mapping[Lease, Progress],
    ) -> Beat:
        params = heartbeat_params(worker_id, leases, lease, progress, self._now())
        budget = max(0.05, min(lease * _HEARTBEAT_MARGIN_FRACTION, _HEARTBEAT_MARGIN_CAP) / 2)

        # Many leases: planned for its own arrays (not prepared). A prepared statement's
        # generic plan guesses 10 leases, and joined 1,000 leases with 1,000 x 1,000
        # comparisons (0.4 s against 23 ms); a few leases cost no more either way.
        prepare = False if len(params["ids"]) > _PREPARED_BEAT_MAX else None

        async def beat(conn: Connection) -> list[DictRow]:
            cursor = await conn.execute(_Q["heartbeat"], params, prepare=prepare)
            return await cursor.fetchall()

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
        return await self._settles.settle(settlements)  # postgres/_settle.py

    async def checkpoint(self, lease: Lease, state: JSON) -> bool:
        params = {"id": lease.job_id, "token": lease.token, "state": scripts.dumps(state)}
        return await self._execute("checkpoint", params) == 1

    # -- maintenance --------------------------------------------------------------------

    async def rescue(self, *, limit: int, jitter: float) -> list[Rescued]:
        def rescue(conn: SyncConnection) -> list[Rescued]:
            rows = conn.execute(_Q["rescue"], {"now": self._now(), "limit": limit}).fetchall()
            if not rows:
                return []
            decisions = scripts.rescue_decisions(rows, jitter)
            return scripts.rescued(rows, decisions, self._settles.settle_in(conn, decisions))

        return await self._transaction(rescue)

    # -- workers and queues -------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo) -> None:
        params = scripts.worker_params(worker) | {"now": self._now()}
        await self._execute("register_worker", params)

    async def deregister_worker(self, worker_id: str) -> None:
        await self._execute("deregister_worker", {"worker_id": worker_id, "now": self._now()})

    async def forget_workers(self, *, limit: int) -> list[str]:
        rows = await self._fetch("forget_workers", {"limit": limit, "now": self._now()})
        return [r["id"] for r in rows]

    async def set_paused(self, queue: str, paused: bool) -> None:
        params = {"name": queue, "paused": paused, "now": self._now()}
        await self._execute("set_paused", params)

    # -- wake-ups -----------------------------------------------------------------------

    async def wait_for_jobs(self, timeout: float) -> frozenset[str]:
        """Wait for a notification (new work or a cancel request), or ``timeout`` seconds.

        The first call starts a task that keeps a LISTEN connection open, reconnecting
        with backoff when it drops; polling by the caller covers the gap.
        """
        return await self._wakeups.wait(timeout)

    def _where(self) -> str:
        return describe(self._params)

    # -- the API's reads and tokens -----------------------------------------------------

    async def page_jobs(self, query: JobPageQuery) -> list[Job]:
        f = query.filter
        params = {
            "statuses": [s.value for s in f.status] if f.status else None,
            "type": f.type,
            "queue": f.queue,
            "tenant": f.tenant,
            "parent_id": f.parent_id,
            "root_id": f.root_id,
            "top_level": f.top_level,
            "created_after": f.created_after,
            "created_before": f.created_before,
            "after_created": query.after[0] if query.after else None,
            "after_id": query.after[1] if query.after else None,
            "limit": query.limit,
        }
        scope = "page_jobs" if f.tenant is None else "page_tenant_jobs"
        name = f"{scope}_{'newest' if query.newest_first else 'oldest'}_first"
        return [job_of_row(row) for row in await self._fetch(name, params)]

    async def create_token(self, token: Token) -> None:
        await self._execute("create_token", scripts.token_params(token))

    async def touch_token(self, token_id: str) -> None:
        await self._execute("touch_token", {"id": token_id, "now": self._now()})

    async def rotate_token(
        self, token_id: str, *, secret_hash: str, grace_until: datetime | None
    ) -> Token | None:
        params = {"id": token_id, "secret_hash": secret_hash, "grace_until": grace_until}
        rows = await self._fetch("rotate_token", params)
        return scripts.token(DIALECT, rows[0]) if rows else None

    async def revoke_token(self, token_id: str) -> Token | None:
        rows = await self._fetch("revoke_token", {"id": token_id, "now": self._now()})
        return scripts.token(DIALECT, rows[0]) if rows else None

    async def record_audit(self, entry: AuditEntry) -> None:
        await self._execute("record_audit", scripts.audit_params(entry))
