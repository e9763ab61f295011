"""SQLite implementation of the store protocol.

The domain's transaction scripts live in :mod:`conveyor.store.scripts`; this module
holds the connection, the one runner that drives a script on the store's thread inside
``BEGIN IMMEDIATE`` (:meth:`SQLiteStore._drive`), and the tuned hot path: submit,
claim, heartbeat and the batched settle.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from conveyor.core.auth import Token
from conveyor.core.lifecycle import Status
from conveyor.core.model import JSON, Attempt, Job, NewJob, Progress, Settlement
from conveyor.errors import ConfigurationError, NotAConveyorDatabase
from conveyor.store import scripts
from conveyor.store._fairness import TenantMix
from conveyor.store._queries import load_migrations, load_queries, statements
from conveyor.store._reads import SharedReads
from conveyor.store._rows import STATUS
from conveyor.store._scripted import ScriptedOps
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
from conveyor.store.sqlite._codec import (
    DIALECT,
    encode,
    epoch,
    job_of_row,
    jobs_of,
    micros,
    submit_steps,
)
from conveyor.store.sqlite._connection import connect, parse_sqlite_url
from conveyor.store.sqlite._errors import translated
from conveyor.store.sqlite._submit import (
    CreationTimes,
    insert_chunks,
    insert_new,
    insert_plain,
)
from conveyor.store.sqlite._watcher import Watcher
from conveyor.store.sqlite._writer import GroupWriter, StoreThread

T = TypeVar("T")

# A job with children whose handler ended so is decided from the jobs below it.
_DECIDED_BELOW = frozenset({Status.SUCCEEDED, Status.CANCELLED})
_Q = load_queries("conveyor.store.sqlite")
_MIGRATIONS = load_migrations("conveyor.store.sqlite")

__all__ = ["SQLiteStore", "parse_sqlite_url"]

# Submits of up to this many jobs may skip the hand-off to the store's thread (_writer.py):
# a transaction this small blocks the event loop for little more than its fsync.
_SUBMIT_HERE = 8


def _one(cursor: sqlite3.Cursor) -> Any:
    """Return the first row and step the statement to its end, so no statement stays open."""
    rows = cursor.fetchall()
    return rows[0] if rows else None


def _end_attempts(conn: sqlite3.Connection, decided: Iterable[Settlement], now: float) -> list[Any]:
    """Run the settle statements for a batch; return the rows of the attempts ended.

    Plain successes (the bulk of most batches) go through ``settle_succeeded``, the
    others through the general ``settle``; each statement is run only if it has jobs.
    """
    plain: list[tuple[str, int, str | None]] = []
    rows = []
    for d in decided:
        if (
            d.status is Status.SUCCEEDED
            and d.outcome is not None
            and d.error is None
            and d.result_ref is None
            and d.progress is None
        ):
            plain.append((d.job_id, d.token, scripts.dumps(d.result)))
            continue
        rows.append(
            (
                d.job_id,
                d.token,
                d.status.value,
                scripts.dumps(d.result),
                d.result_ref,
                d.error,
                d.retry_delay,
                1 if d.outcome is None else 0,
                None if d.progress is None else d.progress.done,
                None if d.progress is None else d.progress.total,
                None if d.progress is None else d.progress.message,
            )
        )
    settled = []
    if plain:
        params = {"batch": json.dumps(plain), "now": now}
        settled = conn.execute(_Q["settle_succeeded"], params).fetchall()
    if rows:
        params = {"batch": json.dumps(rows), "now": now}
        settled += conn.execute(_Q["settle"], params).fetchall()
    return settled


class SQLiteStore(ScriptedOps, SharedReads):
    """A store on one SQLite file."""

    dialect = DIALECT

    def __init__(
        self, path: str, *, clock: Callable[[], float] = time.time, migrate: bool = True
    ) -> None:
        self.path = path
        self._clock = clock
        self._auto_migrate = migrate
        self._executor: StoreThread | None = None
        self._conn: sqlite3.Connection | None = None
        self._watcher: Watcher | None = None
        self._tenant_mix = TenantMix()
        self._writer: GroupWriter | None = None
        self._creation = CreationTimes()

    # -- plumbing -----------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None or self._conn is None:
            raise RuntimeError("the store is not open: call open() first")
        conn = self._conn
        with translated(self.path):
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, conn)

    async def _write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        then: Callable[[T], None] | None = None,
        *,
        here: bool = False,
        alone: bool = False,
    ) -> T:
        """Run ``fn`` inside a ``BEGIN IMMEDIATE`` transaction; ``then`` once committed.

        Writes asked during one turn of the event loop share the transaction, each in a
        savepoint of its own (see :mod:`._writer`). ``then`` gets the result on the
        thread that ran it, before the event loop does. ``here``: a small write the
        loop's thread may run itself when the store's thread is idle; ``alone``: ``fn``
        sends one statement, which then runs outside any transaction and commits by
        itself (:meth:`GroupWriter.write_now`).
        """
        writer = self._writer
        if writer is None:
            raise RuntimeError("the store is not open: call open() first")
        with translated(self.path):
            return await writer.write(fn, then, here=here, alone=alone)

    def _committed(self, conn: sqlite3.Connection) -> None:
        watcher = self._watcher
        if watcher is not None:
            watcher.check(conn)  # did another connection commit since the last look?

    def _drive(
        self, conn: sqlite3.Connection, script: scripts.Script[T], now: float | None = None
    ) -> T:
        """Run a transaction script on this thread's connection, with one clock reading.

        Called inside ``BEGIN IMMEDIATE``, the clock is read once the write lock is held,
        so a script never decides with a time taken before it waited for the lock.
        """
        at = self._clock() if now is None else now

        def execute(name: str, params: dict[str, Any]) -> list[Any]:
            return conn.execute(_Q[name], encode(params, at)).fetchall()

        return scripts.drive(script, execute)

    async def _script(self, make: Callable[[], scripts.Script[T]]) -> T:
        """Run a writing script in one ``BEGIN IMMEDIATE`` transaction."""
        return await self._write(lambda conn: self._drive(conn, make()))

    async def _read(self, make: Callable[[], scripts.Script[T]]) -> T:
        """Run a reading script outside any transaction."""
        return await self._run(lambda conn: self._drive(conn, make()))

    async def _statement(self, make: Callable[[], scripts.Script[T]]) -> T:
        """Run a script of one write: under the write lock, as every write."""
        return await self._script(make)

    def _time_param(self, value: datetime | None) -> Any:
        return self._clock() if value is None else epoch(value)

    async def _fetch(self, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Run one named read outside any transaction and return its rows."""
        return await self._run(lambda conn: conn.execute(_Q[name], params or {}).fetchall())

    # -- opening and migrating ----------------------------------------------------------

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
            self._executor = StoreThread()
            self._conn = await asyncio.get_running_loop().run_in_executor(
                self._executor, connect, self.path
            )
            self._writer = GroupWriter(
                self._executor,
                self._conn,
                on_commit=self._committed,
            )

    async def close(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.stop()
        self._writer = None
        if self._executor is not None:
            conn, self._conn = self._conn, None
            if conn is not None:
                self._executor.submit(conn.close).result()
            self._executor.shutdown(wait=True)
            self._executor = None

    def _schema_version(self, conn: sqlite3.Connection) -> int:
        tables = {r["name"] for r in conn.execute(_Q["schema_tables"])}
        if "conveyor_migrations" in tables:
            row = conn.execute(_Q["schema_version"]).fetchone()
            return int(row["version"] or 0)
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
            conn.execute(_Q["create_migrations_table"])
            done = {r["version"] for r in conn.execute(_Q["applied_migrations"])}
            applied = []
            for version, name, sql in _MIGRATIONS:
                if version in done:
                    continue
                for statement in statements(sql):
                    conn.execute(statement)
                params = {"version": version, "name": name, "now": self._clock()}
                conn.execute(_Q["record_migration"], params)
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
        if not jobs:
            return []
        if len(jobs) == 1 and not jobs[0].depends_on:
            inserted = await self.submit_new(jobs[0])
            if inserted is not None:
                return inserted.submitted()
        # A few jobs: written by the loop's thread when the store's is idle (no hand-off).
        return await self._write(self._submitter(jobs), here=len(jobs) <= _SUBMIT_HERE)

    def submit_new(self, job: NewJob) -> Coroutine[Any, Any, Inserted | None]:
        """Insert one job without dependencies as it was submitted, as one
        :class:`Inserted` (the handle makes the job's record when it is read); None, with
        nothing written, when its id, an active unique key or its creation microsecond is
        taken (then :meth:`submit` finds the job holding it).

        One ``INSERT``: when a task submits one job after another, it runs on the spot
        outside any transaction, and SQLite commits it by itself
        (:meth:`GroupWriter.write_now`); the clock is then read before the statement takes
        the write lock, which it never waits for (another connection's lock sends it to
        the store's thread, nothing written). A plain function returning the write to
        await: the common submit's path has one coroutine less.
        """
        return self._write(self._inserter(job), here=True, alone=True)

    def submit_now(
        self, jobs: Sequence[NewJob], *, connection: object | None = None
    ) -> list[Submitted] | None:
        """:meth:`submit` of a few jobs on the calling thread, one without an event loop
        (``app.sync.submit``), sparing it the trips to the loop's thread and the store's;
        None, with nothing written, when that cannot be done at once (the store is
        closed or its thread busy, another connection writes, or ``connection`` is given,
        which only :meth:`submit` answers): then ask :meth:`submit`."""
        writer = self._writer
        if writer is None or connection is not None or not jobs or len(jobs) > _SUBMIT_HERE:
            return None
        with translated(self.path):
            if len(jobs) == 1 and not jobs[0].depends_on:
                done, inserted = writer.write_now(self._inserter(jobs[0]), alone=True)
                if not done:
                    return None
                if inserted is not None:
                    return inserted.submitted()
            done, submitted = writer.write_now(self._submitter(jobs))
        return submitted if done else None

    async def copy_prepared(self, chunks: Iterable[Sequence[NewJob]]) -> Inserted | None:
        """Insert a large batch of plain jobs prepared a chunk at a time
        (``app/_stream.py``) in one transaction, as one :class:`Inserted`; None, with
        nothing written, if an id was taken (then :meth:`submit` finds its job).

        The chunks are prepared here, on the caller's thread, before the write: SQLite
        has one writer, and preparing them inside the transaction would hold every other
        process's writes back for the time the payloads' checks take.
        """
        prepared = list(chunks)

        def insert(conn: sqlite3.Connection) -> Inserted | None:
            now = self._clock()
            count = sum(len(chunk) for chunk in prepared)
            return insert_chunks(conn, prepared, now, self._creation.take(now, count))

        return await self._write(insert)

    def _inserter(self, job: NewJob) -> Callable[[sqlite3.Connection], Inserted | None]:
        def insert(conn: sqlite3.Connection) -> Inserted | None:
            now = self._clock()
            return insert_new(conn, job, now, self._creation.take(now, 1))

        return insert

    def _submitter(self, jobs: Sequence[NewJob]) -> Callable[[sqlite3.Connection], list[Submitted]]:
        def submit(conn: sqlite3.Connection) -> list[Submitted]:
            now = self._clock()  # one reading, under the write lock, for the whole batch
            if len(jobs) > 1 and not any(job.depends_on for job in jobs):
                # The common batch: one prepared statement, and the jobs as written (the
                # store knows every value); a taken id or unique key takes the general
                # steps, which find the job holding it, and so does a creation
                # microsecond another process's jobs took (CreationTimes). A job alone
                # came here after submit_new found something taken.
                first_us = self._creation.take(now, len(jobs))
                created = insert_plain(conn, jobs, now, first_us)
                if created is not None:
                    return created
            # The general steps take the microseconds after the table's last.
            general = self._drive(conn, submit_steps(jobs, now), now)
            self._creation.saw(general)
            return general

        return submit

    async def get_many(self, job_ids: Sequence[str]) -> list[Job]:
        params = {"ids": json.dumps(list(job_ids))}
        return await self._run(lambda conn: jobs_of(conn.execute(_Q["get_many"], params)))

    async def attempts(self, job_id: str) -> list[Attempt]:
        rows = await self._fetch("attempts", {"job_id": job_id})
        return [scripts.attempt(DIALECT, r) for r in rows]

    async def note_retry_limit(self, job_id: str, error: str) -> Job | None:
        params = {"id": job_id, "error": error}

        def note(conn: sqlite3.Connection) -> Job | None:
            row = _one(conn.execute(_Q["note_retry_limit"], params))
            return None if row is None else job_of_row(row)

        return await self._write(note)

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
        names = list(dict.fromkeys(queues))
        params = {
            "worker_id": worker_id,
            "queues": json.dumps(names),
            "limit": limit,
            "lease": lease,
        }

        def claim(conn: sqlite3.Connection) -> list[Job]:
            wanted = types
            if wanted is None:
                rows = conn.execute(_Q["queued_types"], {"queues": params["queues"]})
                wanted = [r[0] for r in rows.fetchall()]
            # Fairness across tenants: a look, at most once a second, at whether two or
            # more tenants have jobs queued (store/_fairness.py).
            if self._tenant_mix.stale():
                self._tenant_mix.saw(conn.execute(_Q["queued_tenants"], {"limit": 2}).fetchall())
            if limits or self._tenant_mix.mixed:
                script = scripts.claim_limited(
                    params | {"types": list(wanted)},
                    limits or Limits(),
                    fair=self._tenant_mix.mixed,
                )
                return [job_of_row(r) for r in self._drive(conn, script)]
            # The lease starts now that this transaction holds the write lock: a time read
            # before waiting for it would store a lease that may already have expired.
            now = self._clock()
            each = {"types": json.dumps(list(wanted)), "now": now}
            return jobs_of(conn.execute(_Q["claim"], params | each))

        return await self._write(claim, on_claimed)

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
        """End the attempts of a batch in one UPDATE (two when plain successes come with
        other ends), then record them and carry the ends on.

        Per-job statements are left only for what needs them: a job reported succeeded
        that has children, and a job that ended with a parent or with dependents. The
        moves of jobs with a parent are counted in one more statement; a batch without
        any pays none.
        """
        decided, parents = self._decide(conn, settlements, now)
        settled = _end_attempts(conn, decided.values(), now)
        reported = {s.job_id: s for s in settlements}
        attempts = []
        ends: list[scripts.Ended] = []
        for job_id, attempt, lease_owner, started_at, parent_id, stored in settled:
            s = reported[job_id]
            del decided[job_id]
            if s.outcome is not None:
                attempts.append(
                    (job_id, attempt, lease_owner, started_at, now, s.outcome.value, s.error,
                     s.traceback)
                )  # fmt: skip
            ends.append((job_id, parent_id, STATUS[stored]))
        if attempts:
            conn.executemany(_Q["insert_attempt"], attempts)
        if ends:
            self._drive(conn, scripts.after_settle(DIALECT, ends, parents=parents), now)
        return list(decided)  # the ones the UPDATE did not take: refused

    def _decide(
        self, conn: sqlite3.Connection, settlements: Sequence[Settlement], now: float
    ) -> tuple[dict[str, Settlement], frozenset[str]]:
        """Decide from the jobs below them what jobs with children that returned or were
        cancelled become; return the decisions and the ids of those jobs."""
        decided = {s.job_id: s for s in settlements}
        if not any(s.status in _DECIDED_BELOW for s in settlements):
            return decided, frozenset()
        ids = json.dumps([s.job_id for s in settlements])
        parents = {r[0] for r in conn.execute(_Q["parents_among"], {"ids": ids})}
        returned = [s for s in settlements if s.status in _DECIDED_BELOW and s.job_id in parents]
        if returned:
            for d in self._drive(conn, scripts.decide_from_children(DIALECT, returned), now):
                decided[d.job_id] = d
        return decided, frozenset(s.job_id for s in returned)

    async def checkpoint(self, lease: Lease, state: JSON) -> bool:
        params = {"id": lease.job_id, "token": lease.token, "state": scripts.dumps(state)}

        def write(conn: sqlite3.Connection) -> bool:
            return conn.execute(_Q["checkpoint"], params).rowcount == 1

        return await self._write(write)

    # -- maintenance --------------------------------------------------------------------

    async def rescue(self, *, limit: int, jitter: float) -> list[Rescued]:
        def rescue(conn: sqlite3.Connection) -> list[Rescued]:
            now = self._clock()
            rows = conn.execute(_Q["rescue"], {"now": now, "limit": limit}).fetchall()
            decisions = scripts.rescue_decisions(rows, jitter)
            return scripts.rescued(rows, decisions, self._settle(conn, decisions, now))

        return await self._write(rescue)

    # -- workers and queues -------------------------------------------------------------

    async def register_worker(self, worker: WorkerInfo) -> None:
        params = encode(scripts.worker_params(worker), self._clock())
        await self._write(lambda conn: conn.execute(_Q["register_worker"], params))

    async def deregister_worker(self, worker_id: str) -> None:
        params = {"worker_id": worker_id, "now": self._clock()}
        await self._write(lambda conn: conn.execute(_Q["deregister_worker"], params))

    async def forget_workers(self, *, limit: int) -> list[str]:
        def forget(conn: sqlite3.Connection) -> list[str]:
            params = {"limit": limit, "now": self._clock()}
            return [r[0] for r in conn.execute(_Q["forget_workers"], params).fetchall()]

        return await self._write(forget)

    async def set_paused(self, queue: str, paused: bool) -> None:
        params = {"name": queue, "paused": int(paused), "now": self._clock()}
        await self._write(lambda conn: conn.execute(_Q["set_paused"], params))

    # -- wake-ups -----------------------------------------------------------------------

    async def wait_for_jobs(self, timeout: float) -> frozenset[str]:
        watcher = self._watcher
        if watcher is None:
            executor, conn, writer = self._executor, self._conn, self._writer
            if executor is None or conn is None or writer is None:  # not open
                await asyncio.sleep(timeout)
                return frozenset()
            watcher = self._watcher = Watcher(self.path, executor, conn, writer)
        await watcher.wait(timeout)
        return frozenset()

    # -- the API's reads and tokens -----------------------------------------------------

    async def page_jobs(self, query: JobPageQuery) -> list[Job]:
        f = query.filter
        params = {
            "statuses": json.dumps([s.value for s in f.status]) if f.status else None,
            "type": f.type,
            "queue": f.queue,
            "tenant": f.tenant,
            "parent_id": f.parent_id,
            "root_id": f.root_id,
            "top_level": int(f.top_level),
            # In microseconds: the table's key (a job's creation microsecond).
            "created_after": micros(f.created_after) if f.created_after else None,
            "created_before": micros(f.created_before) if f.created_before else None,
            "after_created": micros(query.after[0]) if query.after else None,
            "after_id": query.after[1] if query.after else None,
            "limit": query.limit,
        }
        scope = "page_jobs" if f.tenant is None else "page_tenant_jobs"
        name = f"{scope}_{'newest' if query.newest_first else 'oldest'}_first"
        return await self._run(lambda conn: jobs_of(conn.execute(_Q[name], params)))

    async def create_token(self, token: Token) -> None:
        params = encode(scripts.token_params(token), self._clock())
        await self._write(lambda conn: conn.execute(_Q["create_token"], params))

    async def touch_token(self, token_id: str) -> None:
        params = {"id": token_id, "now": self._clock()}
        await self._write(lambda conn: conn.execute(_Q["touch_token"], params))

    async def rotate_token(
        self, token_id: str, *, secret_hash: str, grace_until: datetime | None
    ) -> Token | None:
        params = encode(
            {"id": token_id, "secret_hash": secret_hash, "grace_until": grace_until},
            self._clock(),
        )

        def rotate(conn: sqlite3.Connection) -> Token | None:
            row = _one(conn.execute(_Q["rotate_token"], params))
            return None if row is None else scripts.token(DIALECT, row)

        return await self._write(rotate)

    async def revoke_token(self, token_id: str) -> Token | None:
        params = {"id": token_id, "now": self._clock()}

        def revoke(conn: sqlite3.Connection) -> Token | None:
            row = _one(conn.execute(_Q["revoke_token"], params))
            return None if row is None else scripts.token(DIALECT, row)

        return await self._write(revoke)

    # -- the dashboard: audit log, per-minute figures, named leases, counts --------------

    async def record_audit(self, entry: AuditEntry) -> None:
        params = encode(scripts.audit_params(entry), self._clock())
        await self._write(lambda conn: conn.execute(_Q["record_audit"], params))
