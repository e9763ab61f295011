"""The transaction scripts written once (conveyor/store/scripts/) and their runners.

Every query a script names exists in both dialects' queries.sql; on PostgreSQL, a
transaction runs to its end off the event loop, so a blocked loop holds no row lock.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import pkgutil
import re
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from conveyor.core.lifecycle import Status
from conveyor.core.model import NewJob, Outcome, Settlement
from conveyor.store import scripts
from conveyor.store._queries import load_queries
from conveyor.store.protocol import Lease
from conveyor.store.sqlite import SQLiteStore
from conveyor.store.sqlite import _codec as sqlite_codec

if TYPE_CHECKING:
    from conveyor.store.postgres import PostgresStore

_NAMED = re.compile(r'yield \(?\s*"(\w+)"')


def test_every_query_a_script_names_exists_in_both_dialects() -> None:
    names = {
        name
        for part in pkgutil.iter_modules(scripts.__path__)
        for name in _NAMED.findall(
            inspect.getsource(importlib.import_module(f"{scripts.__name__}.{part.name}"))
        )
    }
    assert "now" in names and "finish_waiting" in names  # the pattern finds the steps
    for package in ("conveyor.store.sqlite", "conveyor.store.postgres"):
        missing = names - set(load_queries(package))
        assert not missing, f"{package} lacks {sorted(missing)}"


def test_sqlite_submit_steps_name_only_sqlite_queries() -> None:
    names = set(_NAMED.findall(inspect.getsource(sqlite_codec)))
    assert names and not names - set(load_queries("conveyor.store.sqlite"))


# -- no transaction held across an event-loop hop ---------------------------------------


@pytest.fixture
async def store(postgres_database: str) -> AsyncIterator[PostgresStore]:
    pytest.importorskip("psycopg")
    from conveyor.store.postgres import PostgresStore

    s = PostgresStore(postgres_database)
    await s.open()
    yield s
    await s.close()


def _new(job_id: str, **kw: object) -> NewJob:
    return NewJob(id=job_id, type="t", payload={}, **kw)  # type: ignore[arg-type]


async def _waiting_parent_with_running_child(store: PostgresStore) -> Lease:
    """Make a waiting parent 'p' whose one child 'c' is running; return the child's lease."""
    await store.submit([_new("p")])
    (parent,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
    held = Lease(parent.id, parent.lease_token)
    await store.spawn(held, [_new("c")])
    done = Settlement(
        job_id="p", token=parent.lease_token, status=Status.SUCCEEDED, outcome=Outcome.SUCCEEDED
    )
    assert await store.settle([done]) == []
    assert (await store.get("p")).status is Status.WAITING  # type: ignore[union-attr]
    (child,) = await store.claim(worker_id="w", queues=["default"], limit=1, lease=30)
    return Lease(child.id, child.lease_token)


async def test_a_blocked_event_loop_holds_no_postgres_transaction_open(
    store: PostgresStore, postgres_database: str
) -> None:
    """A settle whose transaction is under way when the loop blocks still commits.

    The child's settle locks its row, then waits in the cascade for the parent's row of
    counts, which another connection holds locked. The loop then blocks for 3 s; meanwhile the
    holder lets go, and a heartbeat-like UPDATE of the child's row must get its lock
    within 1 s: a transaction driven from the loop would sit 'idle in transaction' with
    the row locked until the loop came back.
    """
    import psycopg

    child = await _waiting_parent_with_running_child(store)
    holder = await psycopg.AsyncConnection.connect(postgres_database)
    observer = await psycopg.AsyncConnection.connect(postgres_database, autocommit=True)
    try:
        await holder.execute("SELECT * FROM conveyor_job_counts WHERE job_id = 'p' FOR UPDATE")
        ending = Settlement(
            job_id=child.job_id,
            token=child.token,
            status=Status.SUCCEEDED,
            outcome=Outcome.SUCCEEDED,
        )
        settling = asyncio.ensure_future(store.settle([ending]))
        waiting = (
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND application_name = 'conveyor'"
        )
        deadline = time.monotonic() + 10
        while not await (await observer.execute(waiting)).fetchall():
            assert time.monotonic() < deadline, "the settle never reached the parent's counts"
            await asyncio.sleep(0.01)
        seen: dict[str, object] = {}
        probe = threading.Thread(target=_probe, args=(postgres_database, holder, seen))
        probe.start()
        time.sleep(3)  # a handler blocking the event loop
        probe.join()
        assert await settling == []
    finally:
        await holder.close()
        await observer.close()
    assert seen == {"renewed": True, "idle_in_transaction": 0}, seen
    assert (await store.get("p")).status is Status.SUCCEEDED  # type: ignore[union-attr]


def _probe(url: str, holder: Any, seen: dict[str, object]) -> None:
    """From another thread: release the parent's counts, then renew the child's row."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        # The holder is an async connection owned by the (blocked) loop: end its
        # transaction from here by terminating its backend.
        conn.execute("SELECT pg_terminate_backend(%s)", [holder.info.backend_pid])
        time.sleep(0.5)
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND state = 'idle in transaction'"
        ).fetchone()
        seen["idle_in_transaction"] = row[0] if row else None
        conn.execute("SET lock_timeout = '1s'")
        try:
            conn.execute(
                "UPDATE conveyor_jobs SET lease_expires_at = lease_expires_at WHERE id = 'c'"
            )
            seen["renewed"] = True
        except psycopg.errors.LockNotAvailable:
            seen["renewed"] = False


async def test_a_blocked_event_loop_holds_no_sqlite_transaction_open(tmp_path: Path) -> None:
    """SQLite's transactions run to their commit on the store's thread, loop or no loop.

    Another connection holds the write lock, so the store's cancel waits on its thread;
    the loop then blocks for 2 s, during which the holder lets go and, a moment later,
    must see the job cancelled and take the write lock again at once.
    """
    path = tmp_path / "conveyor.db"
    store = SQLiteStore(str(path))
    await store.open()
    try:
        await store.submit([_new("j")])
        holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        cancelling = asyncio.ensure_future(store.cancel("j", reason="stop"))
        await asyncio.sleep(0)  # the cancel reaches the store's thread, which waits
        seen: dict[str, object] = {}
        probe = threading.Thread(target=_probe_sqlite, args=(path, holder, seen))
        probe.start()
        time.sleep(2)  # a handler blocking the event loop
        probe.join()
        job = await cancelling
    finally:
        await store.close()
    assert job is not None and job.status is Status.CANCELLED
    assert seen == {"status": "cancelled", "locked": True}, seen


def _probe_sqlite(path: Path, holder: sqlite3.Connection, seen: dict[str, object]) -> None:
    """From another thread: let the write lock go, then read the job and take the lock."""
    holder.execute("ROLLBACK")
    holder.close()
    time.sleep(0.5)
    conn = sqlite3.connect(path, isolation_level=None, timeout=0.5)
    try:
        (seen["status"],) = conn.execute(
            "SELECT status FROM conveyor_jobs WHERE id = 'j'"
        ).fetchone()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        seen["locked"] = True
    except sqlite3.OperationalError:
        seen["locked"] = False
    finally:
        conn.close()
