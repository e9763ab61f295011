"""Helpers for tests that run a worker in this process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from conveyor import Conveyor, JobHandle, Status, Worker, WorkerOptions
from conveyor.core.model import NewJob


@dataclass
class FakeClock:
    """A store clock that moves only when a test says so."""

    now: float = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def new(job_id: str, **kw: object) -> NewJob:
    """A job to submit straight to a store: type ``t``, payload ``{"n": 1}`` unless given."""
    base: dict[str, object] = {"id": job_id, "type": "t", "payload": {"n": 1}}
    base.update(kw)
    return NewJob(**base)  # type: ignore[arg-type]


def fast_options(**kw: object) -> WorkerOptions:
    """Worker options with short intervals, so tests wait on events, not on long sleeps."""
    base: dict[str, object] = {
        "concurrency": 4,
        "lease": 2.0,
        "poll_interval": 0.05,
        "rescue_interval": 0.2,
        "grace": 2.0,
        "cancel_grace": 0.5,
    }
    base.update(kw)
    return WorkerOptions(**base)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_worker(app: Conveyor, **kw: object) -> AsyncIterator[Worker]:
    """Run a worker on this loop for the body of the ``async with``, then stop it."""
    worker = app.worker(fast_options(**kw))
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def eventually(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 20.0, interval: float = 0.02
) -> None:
    """Wait until ``check()`` is true; fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(interval)


async def settled(job: JobHandle, status: Status | None = None, timeout: float = 20.0) -> JobHandle:
    """Wait for a job to be terminal (and, if given, to have ``status``)."""
    await job.wait(timeout=timeout, poll=0.02)
    if status is not None:
        assert job.status is status, f"{job!r}: {job.error}"
    return job


_POSTGRES_SCHEMA = [
    "SELECT table_name, column_name, data_type, is_nullable, column_default "
    "FROM information_schema.columns "
    "WHERE table_schema = current_schema() AND table_name LIKE 'conveyor%' ORDER BY 1, 2",
    "SELECT indexname, indexdef FROM pg_indexes "
    "WHERE schemaname = current_schema() AND tablename LIKE 'conveyor%' ORDER BY 1",
    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
    "WHERE conrelid::regclass::text LIKE 'conveyor%' ORDER BY 1",
    "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1",
    "SELECT proname, pg_get_functiondef(oid) FROM pg_proc "
    "WHERE proname LIKE 'conveyor%' ORDER BY 1",
]


async def schema(url: str) -> list[list[tuple[object, ...]]]:
    """The schema of conveyor's tables in a database, to compare two databases by."""
    if url.startswith("sqlite:"):
        import sqlite3

        from conveyor.store.sqlite.backend import parse_sqlite_url

        conn = sqlite3.connect(parse_sqlite_url(url))
        try:
            objects = conn.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master "
                "WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name"
            ).fetchall()
            columns = [
                conn.execute(f"SELECT * FROM pragma_table_xinfo('{name}')").fetchall()
                for kind, name, _, _ in objects
                if kind == "table"
            ]
            return [objects, *columns]
        finally:
            conn.close()
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as pg:
        return [await (await pg.execute(query)).fetchall() for query in _POSTGRES_SCHEMA]


def key_by_creation(url: str) -> None:
    """Give an older SQLite database's job table the key today's store writes (the
    creation microsecond), keeping the indexes it had: the table part of the migration
    that does so, applied early, so that today's store can write a database of an older
    release's schema (a test of a later migration's upgrade). A no-op on PostgreSQL."""
    if not url.startswith("sqlite:"):
        return
    import sqlite3

    from conveyor.store._queries import load_migrations, statements
    from conveyor.store.sqlite.backend import parse_sqlite_url

    migrations = load_migrations("conveyor.store.sqlite")
    (migration,) = [sql for _, name, sql in migrations if name.endswith("_creation_key.sql")]
    table_part = [s for s in statements(migration) if "INDEX" not in s]
    conn = sqlite3.connect(parse_sqlite_url(url), isolation_level=None)
    try:
        indexes = [
            sql
            for (sql,) in conn.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'index' "
                "AND tbl_name = 'conveyor_jobs' AND sql IS NOT NULL"
            )
        ]
        conn.execute("BEGIN IMMEDIATE")
        for statement in table_part + indexes:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()
