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
should any id, active unique key or creation microsecond (the table's key, see
:class:`CreationTimes`) be taken already (or repeat within the batch), the batch is
undone to a savepoint and the caller takes the general steps, which find the job
holding it. So the result is the general steps' exactly.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.core.jsontext import compact
from conveyor.core.lifecycle import Status
from conveyor.core.model import NewJob, SameJobs
from conveyor.store._rows import SUBMITTED, Kind, job_writer, sets_sparse
from conveyor.store.protocol import Inserted, Submitted
from conveyor.store.sqlite._codec import epoch, epoch_micros, micros

# The columns a job binds, from the job row's declaration (a job with dependencies takes
# the general steps): the plain ones always, in the order of its row, then run_at,
# created_us (the table's key) and created_at (the same time in seconds; status is
# 'queued' in the text); the sparse ones only when any job of the batch sets one.
# The payload is bound last of the plain ones, as its text (NewJob.payload_json).
_BOUND = tuple(c for c in SUBMITTED if c.kind is not Kind.IDS)
_PLAIN_COLUMNS = tuple(c for c in _BOUND if not c.sparse and c.name != "payload")
_SPARSE_COLUMNS = tuple(c for c in _BOUND if c.sparse)
_PLAIN = (*(c.name for c in _PLAIN_COLUMNS), "payload", "run_at", "created_us", "created_at")
_FULL = (*_PLAIN, *(c.name for c in _SPARSE_COLUMNS))
_WRITES = {kind: "{}" for kind in Kind} | {Kind.JSON: "compact({})"}
_plain_values = job_writer(
    _WRITES,
    {"compact": compact},
    columns=_PLAIN_COLUMNS,
    after=("payload", "run_at", "created_us", "created_at"),
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
_CREATED = _PLAIN.index("created_us")


class CreationTimes:
    """The creation times a store gives its jobs, in microseconds: the table's key, so
    each job's own. A job takes the microsecond it was submitted in, or, when a job before
    it holds that one (a batch takes one per job), the one after the last given.

    Kept here, not read from the table at each submit: another process's jobs may hold
    the microsecond (its batch took the ones after its own submit), and then the insert
    creates nothing and the general steps, which read the table's last one
    (``next_created_us``), insert the jobs instead; :meth:`saw` then starts after them.
    """

    def __init__(self) -> None:
        self._last = 0

    def take(self, now: float, count: int) -> int:
        """The first of ``count`` microseconds for jobs submitted at ``now``."""
        first = max(epoch_micros(now), self._last + 1)
        self._last = first + count - 1
        return first

    def saw(self, submitted: Sequence[Submitted]) -> None:
        """Give the next jobs microseconds after those of ``submitted`` (jobs the general
        steps wrote, or found)."""
        if submitted:
            self._last = max(self._last, max(micros(s.job.created_at) for s in submitted))


def created_at(created_us: int) -> datetime:
    """The creation time of a job of key ``created_us``, as conveyor_jobs.created_at
    (written as ``created_us / 1_000_000``) reads back."""
    return datetime.fromtimestamp(created_us / 1_000_000, UTC)


def insert_plain(
    conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float, first_us: int
) -> list[Submitted] | None:
    """Insert ``jobs`` (none with dependencies) submitted at ``now``, created at the
    microseconds from ``first_us`` on, in the caller's transaction; None, with nothing
    written, unless every one of them was created."""
    if any(job.depends_on for job in jobs):
        raise ValueError("insert_plain takes jobs without dependencies")
    run_ats = [_run_at(job, now) for job in jobs]
    full = _sets_sparse(jobs)
    values: list[Any] = []
    for i, (job, run_at) in enumerate(zip(jobs, run_ats, strict=True)):
        values += _row(job, run_at, first_us + i, full)
    if not _insert_rows(conn, _FULL if full else _PLAIN, values, len(jobs)):
        return None
    dues = _times(run_ats)
    return [
        Submitted(job.stored(Status.QUEUED, due, created_at(first_us + i)), created=True)
        for i, (job, due) in enumerate(zip(jobs, dues, strict=True))
    ]


def insert_chunks(
    conn: sqlite3.Connection, chunks: Sequence[Sequence[NewJob]], now: float, first_us: int
) -> Inserted | None:
    """Insert a large batch's prepared chunks (``app/_stream.py``: plain jobs without
    dependencies, ids or unique keys) submitted at ``now``, in the caller's transaction,
    as :func:`insert_plain` inserts jobs; None, with nothing written, unless every one of
    them was created. Returns them as one :class:`Inserted`, whose handles make their
    jobs' records when read.

    A chunk of one type's jobs (:class:`SameJobs`) binds its template's values, read
    once, around each job's id and payload text: no job is made for it. The jobs are
    created at the microseconds from ``first_us`` on, one each, in order.
    """
    full = any(_sets_sparse((c.template,) if isinstance(c, SameJobs) else c) for c in chunks)
    columns = _FULL if full else _PLAIN
    values: list[Any] = []
    run_ats: list[float] = []
    for chunk in chunks:
        if isinstance(chunk, SameJobs):
            template = chunk.template
            run_at = _run_at(template, now)
            row = _row(template, run_at, 0, full)
            # The values between the payload and the creation time, and those after it.
            before, between = row[1:_PAYLOAD], row[_PAYLOAD + 1 : _CREATED]
            after = row[_CREATED + 2 :]
            created_us = first_us + len(run_ats)
            for job_id, text in zip(chunk.ids, chunk.texts, strict=True):
                values.append(job_id)
                values += before
                values.append(text)
                values += between
                values.append(created_us)
                values.append(created_us / 1_000_000)
                values += after
                created_us += 1
            run_ats += [run_at] * len(chunk)
        else:
            for job in chunk:
                run_at = _run_at(job, now)
                values += _row(job, run_at, first_us + len(run_ats), full)
                run_ats.append(run_at)
    if not _insert_rows(conn, columns, values, len(run_ats)):
        return None
    return Inserted(list(chunks), _times(run_ats), created_at(first_us), _ONE_US)


# Jobs of one batch are created a microsecond apart.
_ONE_US = timedelta(microseconds=1)


def _times(run_ats: list[float]) -> list[datetime]:
    """Each job's run time as a datetime: jobs submitted together mostly share it, so one
    datetime is made for each distinct one."""
    times: dict[float, datetime] = {}
    dues = []
    for run_at in run_ats:
        due = times.get(run_at)
        if due is None:
            due = times[run_at] = datetime.fromtimestamp(run_at, UTC)
        dues.append(due)
    return dues


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


def insert_new(
    conn: sqlite3.Connection, job: NewJob, now: float, created_us: int
) -> Inserted | None:
    """Insert one job without dependencies submitted at ``now``, created at microsecond
    ``created_us``, in one statement (the caller's transaction, or its own), as
    :func:`insert_plain` inserts a batch of one (binding only the columns it sets); None,
    with nothing written, when its id, an active unique key or its microsecond is taken.
    Returns it as an :class:`Inserted`, whose handle makes the job's record when read."""
    if job.depends_on:
        raise ValueError("insert_new takes a job without dependencies")
    run_at = _run_at(job, now)
    full = _sets_sparse((job,))
    statement = _statement(_FULL if full else _PLAIN, 1)
    if conn.execute(statement, _row(job, run_at, created_us, full)).rowcount != 1:
        return None
    return Inserted([(job,)], [datetime.fromtimestamp(run_at, UTC)], created_at(created_us))


def _run_at(job: NewJob, now: float) -> float:
    """When a job submitted at ``now`` is due (epoch seconds)."""
    return now + job.delay if job.run_at is None else epoch(job.run_at)


def _row(job: NewJob, run_at: float, created_us: int, full: bool) -> tuple[Any, ...]:
    """A job's bound values: the plain columns (its payload as its JSON text), and the
    sparse ones too when the statement names them (``full``)."""
    values: tuple[Any, ...] = _plain_values(
        job, job.payload_json(), run_at, created_us, created_us / 1_000_000
    )
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
