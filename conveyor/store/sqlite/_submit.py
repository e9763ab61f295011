"""The SQLite store's bulk submit: many jobs without dependencies in one prepared
``INSERT`` run by ``executemany``.

The general steps (:func:`._codec.submit_steps`) turn every job into a dict, the batch
into one JSON array, and have SQLite take it apart again with ``json_extract`` and hand
back a row per job: about three quarters of a bulk submit's time. Here each job is one
tuple bound to one prepared statement, and nothing is read back: for a job it created,
the store knows every value it wrote. Whether it created them all it learns from the
count of rows inserted; should any id or active unique key be taken already (or repeat
within the batch), the batch is undone to a savepoint and the caller takes the general
steps, which find the job holding it. So the result is the general steps' exactly.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime

from conveyor.core.jsontext import compact
from conveyor.core.lifecycle import Status
from conveyor.core.model import NewJob
from conveyor.store._queries import load_queries
from conveyor.store.protocol import Submitted
from conveyor.store.sqlite._codec import epoch

INSERT_PLAIN = load_queries("conveyor.store.sqlite")["insert_plain"]


def insert_plain(
    conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float
) -> list[Submitted] | None:
    """Insert ``jobs`` (none with dependencies) submitted at ``now``, in the caller's
    transaction; None, with nothing written, unless every one of them was created."""
    rows = []
    run_ats: list[float] = []
    for job in jobs:
        if job.depends_on:
            raise ValueError("insert_plain takes jobs without dependencies")
        run_at = now + job.delay if job.run_at is None else epoch(job.run_at)
        run_ats.append(run_at)
        rows.append(
            (
                job.id, job.type, job.queue, job.tenant, compact(job.payload), job.priority,
                job.max_attempts, run_at, job.timeout, job.lease, job.backoff_base,
                job.backoff_cap, None if job.state is None else compact(job.state),
                job.parent_id, job.root_id, job.unique_key, job.concurrency_key, job.retry_of,
                job.trace_context, job.retry_count, job.submitted_by, now,
            )
        )  # fmt: skip
    conn.execute("SAVEPOINT conveyor_insert_plain")
    try:
        inserted = conn.executemany(INSERT_PLAIN, rows).rowcount
    except BaseException:
        _undo(conn)
        raise
    if inserted != len(rows):
        _undo(conn)
        return None
    conn.execute("RELEASE conveyor_insert_plain")
    # Jobs submitted together share their times: one datetime for each distinct one.
    times: dict[float, datetime] = {}
    created_at = times[now] = datetime.fromtimestamp(now, UTC)
    results = []
    for job, run_at in zip(jobs, run_ats, strict=True):
        due = times.get(run_at)
        if due is None:
            due = times[run_at] = datetime.fromtimestamp(run_at, UTC)
        results.append(Submitted(job.stored(Status.QUEUED, due, created_at), created=True))
    return results


def _undo(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # else SQLite rolled the whole transaction back itself
        conn.execute("ROLLBACK TO conveyor_insert_plain")
        conn.execute("RELEASE conveyor_insert_plain")
