"""The SQLite store's bulk submit: many jobs without dependencies in a few multi-row
``INSERT`` statements, nothing read back.

The general steps (:func:`._codec.submit_steps`) turn every job into a dict, the batch
into one JSON array, and have SQLite take it apart again with ``json_extract`` and hand
back a row per job: about three quarters of a bulk submit's time. Here the jobs go in as
``INSERT ... VALUES (...), (...), ...`` of up to 512 rows each (a statement per power of
two, so that each text is prepared once and then found in the connection's cache), and
bind only the columns a job sets: a batch in which every job leaves the optional columns
empty (the common case) binds 11 values a row instead of 22, and each bound value costs
about as much as SQLite's own work for it. For a job it created, the store knows every
value it wrote. Whether it created them all it learns from the count of rows inserted;
should any id or active unique key be taken already (or repeat within the batch), the
batch is undone to a savepoint and the caller takes the general steps, which find the job
holding it. So the result is the general steps' exactly.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from conveyor.core.jsontext import compact
from conveyor.core.lifecycle import Status
from conveyor.core.model import NewJob, SameJobs
from conveyor.store._rows import SUBMITTED, Kind, job_writer, sets_sparse
from conveyor.store.protocol import Inserted, Submitted
from conveyor.store.sqlite._codec import epoch

# The columns a job binds, from the job row's declaration (a job with dependencies takes
# the general steps): the plain ones always, in the order of its row, then run_at and
# created_at (status is 'queued' in the text); the sparse ones only when any job of the
# batch sets one.
# The payload is bound last of the plain ones, as its text (NewJob.payload_json).
_BOUND = tuple(c for c in SUBMITTED if c.kind is not Kind.IDS)
_PLAIN_COLUMNS = tuple(c for c in _BOUND if not c.sparse and c.name != "payload")
_SPARSE_COLUMNS = tuple(c for c in _BOUND if c.sparse)
_PLAIN = (*(c.name for c in _PLAIN_COLUMNS), "payload", "run_at", "created_at")
_FULL = (*_PLAIN, *(c.name for c in _SPARSE_COLUMNS))
_WRITES = {kind: "{}" for kind in Kind} | {Kind.JSON: "compact({})"}
_plain_values = job_writer(
    _WRITES,
    {"compact": compact},
    columns=_PLAIN_COLUMNS,
    after=("payload", "run_at", "now"),
    form="tuple",
)
_sparse_values = job_writer(_WRITES, {"compact": compact}, columns=_SPARSE_COLUMNS, form="tuple")
_sets_sparse = sets_sparse(_BOUND)
# A row's id comes first and its payload after the other plain columns (insert_chunks
# puts each job's own there, around its chunk's template's values).
_PAYLOAD = _PLAIN.index("payload")
if _PLAIN[0] != "id":
    raise RuntimeError("insert_chunks binds a row's id first")
_MOST_ROWS = 512  # per statement; the statements take 512, 256, ... 1 rows


def insert_plain(
    conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float
) -> list[Submitted] | None:
    """Insert ``jobs`` (none with dependencies) submitted at ``now``, in the caller's
    transaction; None, with nothing written, unless every one of them was created."""
    if any(job.depends_on for job in jobs):
        raise ValueError("insert_plain takes jobs without dependencies")
    run_ats = [_run_at(job, now) for job in jobs]
    full = _sets_sparse(jobs)
    values: list[Any] = []
    for job, run_at in zip(jobs, run_ats, strict=True):
        values += _row(job, run_at, now, full)
    if not _insert_rows(conn, _FULL if full else _PLAIN, values, len(jobs)):
        return None
    created_at, dues = _times(now, run_ats)
    return [
        Submitted(job.stored(Status.QUEUED, due, created_at), created=True)
        for job, due in zip(jobs, dues, strict=True)
    ]


def insert_chunks(
    conn: sqlite3.Connection, chunks: Sequence[Sequence[NewJob]], now: float
) -> Inserted | None:
    """Insert a large batch's prepared chunks (``app/_stream.py``: plain jobs without
    dependencies, ids or unique keys) submitted at ``now``, in the caller's transaction,
    as :func:`insert_plain` inserts jobs; None, with nothing written, unless every one of
    them was created. Returns them as one :class:`Inserted`, whose handles make their
    jobs' records when read.

    A chunk of one type's jobs (:class:`SameJobs`) binds its template's values, read
    once, around each job's id and payload text: no job is made for it.
    """
    full = any(_sets_sparse((c.template,) if isinstance(c, SameJobs) else c) for c in chunks)
    columns = _FULL if full else _PLAIN
    values: list[Any] = []
    run_ats: list[float] = []
    for chunk in chunks:
        if isinstance(chunk, SameJobs):
            template = chunk.template
            run_at = _run_at(template, now)
            row = _row(template, run_at, now, full)
            before, after = row[1:_PAYLOAD], row[_PAYLOAD + 1 :]
            for job_id, text in zip(chunk.ids, chunk.texts, strict=True):
                values.append(job_id)
                values += before
                values.append(text)
                values += after
            run_ats += [run_at] * len(chunk)
        else:
            for job in chunk:
                run_at = _run_at(job, now)
                values += _row(job, run_at, now, full)
                run_ats.append(run_at)
    if not _insert_rows(conn, columns, values, len(run_ats)):
        return None
    created_at, dues = _times(now, run_ats)
    return Inserted(list(chunks), dues, created_at)


def _times(now: float, run_ats: list[float]) -> tuple[datetime, list[datetime]]:
    """A batch's creation time and each job's run time as datetimes: jobs submitted
    together share their times, so one datetime is made for each distinct one."""
    times: dict[float, datetime] = {}
    created_at = times[now] = datetime.fromtimestamp(now, UTC)
    dues = []
    for run_at in run_ats:
        due = times.get(run_at)
        if due is None:
            due = times[run_at] = datetime.fromtimestamp(run_at, UTC)
        dues.append(due)
    return created_at, dues


def _insert_rows(
    conn: sqlite3.Connection, columns: tuple[str, ...], values: list[Any], count: int
) -> bool:
    """Insert ``count`` rows of ``columns`` (``values``, row after row) in statements of
    512, 256, ... rows; False, with nothing written, unless every row was inserted (an id
    or active unique key was taken, or repeated)."""
    width = len(columns)
    most = min(_MOST_ROWS, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)
    conn.execute("SAVEPOINT conveyor_insert_plain")
    try:
        inserted, start = 0, 0
        while start < count:
            rows = _rows(count - start, most)
            params = values[start * width : (start + rows) * width]
            inserted += conn.execute(_statement(columns, rows), params).rowcount
            start += rows
    except BaseException:
        _undo(conn)
        raise
    if inserted != count:
        _undo(conn)
        return False
    conn.execute("RELEASE conveyor_insert_plain")
    return True


def insert_one(conn: sqlite3.Connection, job: NewJob, now: float) -> Submitted | None:
    """Insert one job without dependencies submitted at ``now``, in the caller's
    transaction, as :func:`insert_plain` inserts a batch of one (binding only the columns
    it sets); None, with nothing written, when its id or an active unique key is taken."""
    if job.depends_on:
        raise ValueError("insert_one takes a job without dependencies")
    run_at = _run_at(job, now)
    full = _sets_sparse((job,))
    statement = _statement(_FULL if full else _PLAIN, 1)
    if conn.execute(statement, _row(job, run_at, now, full)).rowcount != 1:
        return None
    created_at = datetime.fromtimestamp(now, UTC)
    due = created_at if run_at == now else datetime.fromtimestamp(run_at, UTC)
    return Submitted(job.stored(Status.QUEUED, due, created_at), created=True)


def _run_at(job: NewJob, now: float) -> float:
    """When a job submitted at ``now`` is due (epoch seconds)."""
    return now + job.delay if job.run_at is None else epoch(job.run_at)


def _row(job: NewJob, run_at: float, now: float, full: bool) -> tuple[Any, ...]:
    """A job's bound values: the plain columns (its payload as its JSON text), and the
    sparse ones too when the statement names them (``full``)."""
    values: tuple[Any, ...] = _plain_values(job, job.payload_json(), run_at, now)
    return values + _sparse_values(job) if full else values


def _rows(left: int, most: int) -> int:
    """How many rows the next statement takes: the largest power of two up to both."""
    rows = 1
    while rows * 2 <= min(left, most):
        rows *= 2
    return rows


@functools.lru_cache(maxsize=64)
def _statement(columns: tuple[str, ...], rows: int) -> str:
    marks = ", ".join(["?"] * len(columns))
    row = f"({marks}, 'queued')"
    return (
        f"INSERT INTO conveyor_jobs ({', '.join(columns)}, status) "
        f"VALUES {', '.join([row] * rows)} ON CONFLICT DO NOTHING"
    )


def _undo(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # else SQLite rolled the whole transaction back itself
        conn.execute("ROLLBACK TO conveyor_insert_plain")
        conn.execute("RELEASE conveyor_insert_plain")
