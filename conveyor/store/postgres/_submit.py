"""PostgreSQL's submits: the steps that insert jobs, COPY for large batches, and submits
on an application's own connection.

Every submit but COPY's is a script (:func:`submit_steps`): the same steps run on
conveyor's pool and on an application's async or blocking connection, in whatever
transaction it is in. One job alone takes a shortcut of its own (``_lane.py``).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row, tuple_row

from conveyor.core.jsontext import compact
from conveyor.core.lifecycle import ACTIVE, Status, dependency_event
from conveyor.core.model import NewJob, SameJobs
from conveyor.errors import ConfigurationError
from conveyor.store._rows import STATUS, SUBMITTED, Kind, job_writer
from conveyor.store.postgres._codec import (
    Q,
    job_of_row,
    our_loaders,
    run_script,
    run_script_async,
    utc,
)
from conveyor.store.protocol import Inserted, Submitted
from conveyor.store.scripts import Script, check_dependencies, check_same_tenant

T = TypeVar("T")

# A unique key whose holder ends between our insert and our read-back is retried; more
# than a few rounds would mean a bug, not a race.
_SUBMIT_ROUNDS = 5


# A submitted job's columns as PostgreSQL's submits take them (conveyor/store/_rows.py):
# documents as JSON text, inside the batch's JSON or as a parameter; lists of ids as lists.
_written: Callable[[NewJob], dict[str, Any]] = job_writer(
    {kind: "{}" for kind in Kind} | {Kind.JSON: "compact({})", Kind.IDS: "list({})"},
    {"compact": compact},
)


def _submit_params(
    jobs: Sequence[NewJob], now: datetime | None, status: Status = Status.QUEUED
) -> dict[str, Any]:
    rows = []
    for j in jobs:
        row = _written(j)
        row["run_at"] = None if j.run_at is None else utc(j.run_at).isoformat()
        row["delay"] = j.delay
        rows.append(row)
    return {
        "now": now,
        "status": status.value,
        "jobs": json.dumps(rows, separators=(",", ":"), allow_nan=False),
    }


def _one_params(job: NewJob, now: datetime | None) -> dict[str, Any]:
    """submit_one's parameters (``depends_on``, always empty there, is not used)."""
    params = _written(job)
    params["now"] = now
    params["run_at"] = None if job.run_at is None else utc(job.run_at)
    params["delay"] = float(job.delay)
    return params


async def submit_one(
    conn: psycopg.AsyncConnection[Any], job: NewJob, now: datetime | None
) -> Submitted | None:
    """Insert one job without dependencies with one statement, in autocommit: the common
    submit, in one round trip. None: its id or unique key is taken, and nothing was
    written; :func:`submit_steps` then finds the job that holds it."""
    if job.depends_on:
        raise ValueError("submit_one takes a job without dependencies")
    cursor = await conn.execute(Q["submit_one"], _one_params(job, now))
    return _one_submitted(job, await cursor.fetchall())


def submit_one_now(
    conn: psycopg.Connection[Any] | psycopg.Cursor[Any], job: NewJob, now: datetime | None
) -> Submitted | None:
    """:func:`submit_one` on a blocking connection (a blocking caller's), or a cursor of
    one that reads rows as dicts: in autocommit, or in the connection's transaction."""
    if job.depends_on:
        raise ValueError("submit_one takes a job without dependencies")
    return _one_submitted(job, conn.execute(Q["submit_one"], _one_params(job, now)).fetchall())


def _one_submitted(job: NewJob, rows: list[Any]) -> Submitted | None:
    """The job submit_one inserted, from the row it returned (none: nothing inserted)."""
    if not rows:
        return None
    (row,) = rows
    stored = job.stored(Status.QUEUED, utc(row["run_at"]), utc(row["created_at"]))
    return Submitted(stored, created=True)


def submit_steps(jobs: Sequence[NewJob], now: datetime | None) -> Script[list[Submitted]]:
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


# A batch at least this large, of jobs without unique keys or dependencies, is written with
# COPY: no JSON to build and parse, no conflict arbitration per row. Below it, one INSERT.
COPY_MIN = 50
# COPY writes the submitted columns but those a copyable batch leaves empty (unique keys,
# dependencies), and the status and times the store decides. Each job's own values come
# first, then the ones a batch's jobs usually share (written once per distinct set: see
# copy_chunks).
_COPIED = tuple(c for c in SUBMITTED if c.name not in ("unique_key", "depends_on"))
# A row starts with the job's id and its payload, written from its text (NewJob.payload_text,
# or encoded here): the rows of a SameJobs chunk differ only there (see copy_chunks).
_OWN = tuple(c for c in _COPIED if c.name == "state")
_SHARED = tuple(c for c in _COPIED if c.name not in ("id", "payload", "state"))
_COPY_COLUMNS = (
    "id",
    "payload",
    *(c.name for c in _OWN),
    "run_at",
    *(c.name for c in _SHARED),
    "status",
    "created_at",
)
# The NewJob fields behind the shared columns (status and created_at are the batch's).
_shared_fields = attrgetter(*(c.attribute for c in _SHARED))
_COPY_CHUNK = 100  # rows sent to the server at a time
_COPY = f"COPY conveyor_jobs ({', '.join(_COPY_COLUMNS)}) FROM STDIN"


def copyable(jobs: Sequence[NewJob]) -> bool:
    """Whether ``jobs`` may be written with :func:`copy_chunks`: a large batch with nothing
    that needs ON CONFLICT but their ids (a taken id makes the COPY fail; see there)."""
    return len(jobs) >= COPY_MIN and not any(j.unique_key or j.depends_on for j in jobs)


def _copy_text(value: str | None) -> str:
    """A text value as COPY's text format writes it: NULL is \\N; backslash, tab, newline
    and carriage return are escaped."""
    if value is None:
        return "\\N"
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = (
            value.replace("\\", "\\\\")
            .replace("\t", "\\t")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
    return value


# A row's parts in COPY's text format after its id and payload, written from the job row's
# declaration (conveyor/store/_rows.py): its own values and run time, then the shared part.
_COPY_WRITES = {
    Kind.TEXT: "text({})",
    Kind.INT: "int({})",
    Kind.BIGINT: "int({})",
    Kind.FLOAT: "repr(float({}))",
    Kind.JSON: "text(compact({}))",
}
_COPY_NAMES = {"text": _copy_text, "compact": compact, "NULL": "\\N"}
_own_text = job_writer(
    _COPY_WRITES, _COPY_NAMES, columns=_OWN, after=("run_at", "rest"), form="copy", null="NULL",
    end="",
)  # fmt: skip
_shared_text = job_writer(
    _COPY_WRITES, _COPY_NAMES, columns=_SHARED, after=("status", "created_at"), form="copy",
    null="NULL",
)  # fmt: skip


def copy_slices(jobs: Sequence[NewJob]) -> list[Sequence[NewJob]]:
    """A prepared batch as :func:`copy_chunks` takes it: a hundred jobs at a time."""
    return [jobs[i : i + _COPY_CHUNK] for i in range(0, len(jobs), _COPY_CHUNK)]


def copy_chunks(
    conn: psycopg.Connection[Any], chunks: Iterable[Sequence[NewJob]], now: datetime | None
) -> Inserted | None:
    """Insert the queued jobs of ``chunks`` with COPY, as the submit INSERT would.

    On a connection in autocommit (the store's), the COPY is a transaction of its own:
    three round trips in all (``now()``, the COPY's start and its end), where BEGIN and
    COMMIT would add two. The times are the server's ``now()``, read first: as if the
    transaction had begun then, as the INSERT's does.
    COPY has no ON CONFLICT: an id already taken (a resubmitted client id, or this very
    batch committed once before a lost connection) fails the COPY, nothing is stored and
    None is returned; the caller submits the batch again the usual way, which returns the
    existing jobs.

    The rows are written as COPY text here (per-value adaptation by ``write_row`` cost
    more than everything else on the client). Each chunk is sent to the server as soon as
    it is written, before the next is asked for: the server inserts it while the next is
    written, and a caller that prepares the jobs as they are asked for has them checked
    meanwhile. A row is its job's own values (id, state, payload, run time) and the rest,
    which the jobs of a batch usually share (type, queue, options, submitter...): that
    part is formatted once for each distinct set of values. The payload is the text the
    submit's check wrote (``payload_text``) where it kept it, rather than encoded again.
    A chunk of jobs that differ only in id and payload (:class:`SameJobs`) has the rest of
    its rows written once, and no :class:`NewJob` made per job.

    Should ``chunks`` raise (a bad payload further on), the COPY is abandoned and nothing
    is stored: it is one statement in one transaction. What was inserted is returned as
    one record (:class:`Inserted`), with no :class:`Job` made per job.
    """
    try:
        return _copy_chunks(conn, chunks, now)
    except psycopg.errors.UniqueViolation:
        return None


def _copy_chunks(
    conn: psycopg.Connection[Any], chunks: Iterable[Sequence[NewJob]], now: datetime | None
) -> Inserted:
    copied: list[Sequence[NewJob]] = []
    run_ats: list[datetime] = []
    shared: dict[tuple[Any, ...], str] = {}
    text = _copy_text

    def rest_of(job: NewJob, run_at_text: str) -> str:
        """A row after its id and payload."""
        key = _shared_fields(job)
        rest = shared.get(key)
        if rest is None:
            rest = shared[key] = _shared_text(job, "queued", created_text)
        row: str = _own_text(job, run_at_text, rest)
        return row

    with conn.cursor(row_factory=tuple_row) as cursor:
        if now is None:
            ((now,),) = cursor.execute("SELECT now()").fetchall()
        created = utc(now)
        created_text = created.isoformat()
        with cursor.copy(_COPY) as copy:
            for chunk in chunks:
                lines: list[str] = []
                if isinstance(chunk, SameJobs):
                    run_at, run_at_text = _run_at(chunk.template, created, created_text)
                    tail = rest_of(chunk.template, run_at_text)
                    # New ids are base32 digits, with nothing COPY's text format escapes.
                    lines = [
                        f"{i}\t{text(p)}\t{tail}"
                        for i, p in zip(chunk.ids, chunk.texts, strict=True)
                    ]
                    run_ats.extend([run_at] * len(chunk))
                else:
                    for j in chunk:
                        run_at, run_at_text = _run_at(j, created, created_text)
                        payload = text(j.payload_json())
                        lines.append(f"{text(j.id)}\t{payload}\t{rest_of(j, run_at_text)}")
                        run_ats.append(run_at)
                copied.append(chunk)
                if lines:
                    copy.write("".join(lines))
    return Inserted(copied, run_ats, created)


def _run_at(job: NewJob, created: datetime, created_text: str) -> tuple[datetime, str]:
    """A copied job's run time, and as COPY text: its batch's creation time unless the
    job sets one or a delay."""
    if job.run_at is None and not job.delay:
        return created, created_text
    run_at = utc(job.run_at) if job.run_at is not None else created + timedelta(seconds=job.delay)
    return run_at, run_at.isoformat()


def _insert_batch(
    jobs: Sequence[NewJob], now: datetime | None, status: Status
) -> Script[list[Submitted]]:
    """Insert jobs with one statement; an existing id or active unique key returns its job."""
    results: dict[int, Submitted] = {}
    pending = list(range(len(jobs)))
    for _ in range(_SUBMIT_ROUNDS):
        inserted = yield "submit", _submit_params([jobs[i] for i in pending], now, status)
        created = {row["id"]: row for row in inserted}
        missing = []
        for i in pending:
            # pop: when an id repeats within the batch, only its first job is created.
            row = created.pop(jobs[i].id, None)
            if row is not None:
                stored = jobs[i].stored(
                    STATUS[row["status"]], utc(row["run_at"]), utc(row["created_at"])
                )
                results[i] = Submitted(stored, created=True)
            else:
                missing.append(i)
        if not missing:
            break
        existing = yield (
            "existing_jobs",
            {
                "ids": [jobs[i].id for i in missing],
                "unique_keys": [jobs[i].unique_key for i in missing if jobs[i].unique_key],
            },
        )
        by_id = {row["id"]: row for row in existing}
        by_key = {  # keys are held per tenant
            (row["tenant"], row["unique_key"]): row
            for row in existing
            if row["unique_key"] is not None and Status(row["status"]) in ACTIVE
        }
        pending = []
        for i in missing:
            new = jobs[i]
            found = by_id.get(new.id)
            if found is None and new.unique_key is not None:
                found = by_key.get((new.tenant, new.unique_key))
            if found is None:
                pending.append(i)  # its key's holder ended meanwhile: insert it again
            else:
                held = job_of_row(found)
                check_same_tenant(new, held)
                results[i] = Submitted(held, created=False)
        if not pending:
            break
    else:
        raise RuntimeError(f"jobs {[jobs[i].id for i in pending]} were neither inserted nor found")
    return [results[i] for i in range(len(jobs))]


def _insert_dependent(job: NewJob, now: datetime | None) -> Script[Submitted]:
    """Insert a job with dependencies: pending, queued when all succeeded, or cancelled."""
    rows = yield "lock_dependencies", {"ids": list(job.depends_on)}
    found = {row["id"]: Status(row["status"]) for row in rows}
    check_dependencies(job, found)
    done = all(status is Status.SUCCEEDED for status in found.values())
    (submitted,) = yield from _insert_batch([job], now, Status.QUEUED if done else Status.PENDING)
    if not submitted.created:
        return submitted
    yield "insert_dependencies", {"job_id": job.id, "ids": list(dict.fromkeys(job.depends_on))}
    blocked_by = next((d for d in job.depends_on if dependency_event(found[d]) is not None), None)
    if blocked_by is None:
        return submitted
    reason = f"dependency {blocked_by} {found[blocked_by].value}"
    yield "cancel_pending", {"id": job.id, "reason": reason, "now": now}
    (row,) = yield "get", {"id": job.id}
    return Submitted(job_of_row(row), created=True)


class ApplicationSubmits:
    """Submits on applications' own connections, each checked once to be on the store's
    database (``database``: its name and its server's start time, read each time)."""

    def __init__(self, database: Callable[[], Awaitable[tuple[str, datetime]]]) -> None:
        self._database = database
        self._checked: weakref.WeakSet[object] = weakref.WeakSet()

    async def submit(
        self, connection: object, jobs: Sequence[NewJob], now: datetime | None
    ) -> list[Submitted]:
        """Insert jobs in ``connection``'s transaction: they exist only if it commits."""
        steps = submit_steps(jobs, now)
        known = (psycopg.AsyncConnection, psycopg.Connection)
        if isinstance(connection, known) and connection not in self._checked:
            checked = self._checked
            steps = on_database(await self._database(), steps, lambda: checked.add(connection))
        if isinstance(connection, psycopg.AsyncConnection):
            return await run_on_application(connection, steps, now)
        if isinstance(connection, psycopg.Connection):
            # A blocking connection blocks: run it on a thread, its owner is waiting for us.
            return await asyncio.to_thread(run_on_application_sync, connection, steps, now)
        raise ConfigurationError(
            "connection= takes a psycopg 3 connection (psycopg.AsyncConnection or "
            f"psycopg.Connection), not {type(connection).__name__}: with SQLAlchemy pass "
            "its driver_connection, with Django django.db.connection.connection"
        )

    def submit_now(
        self, connection: object, jobs: Sequence[NewJob], now: datetime | None
    ) -> list[Submitted] | None:
        """:meth:`submit` on the calling thread, the blocking ``connection``'s owner (a
        Django view's), with no trip to an event loop and a thread and back; None, with
        nothing done, unless ``connection`` is a blocking one that an earlier submit found
        on the store's database (only :meth:`submit` can check that)."""
        if not isinstance(connection, psycopg.Connection) or connection not in self._checked:
            return None
        if len(jobs) == 1 and not jobs[0].depends_on and not connection.autocommit:
            # One job in the application's transaction: the one-statement insert, which
            # writes nothing if its id or unique key is taken (the steps then find why).
            with connection.cursor(row_factory=dict_row) as cursor:
                our_loaders(cursor.adapters)
                one = submit_one_now(cursor, jobs[0], now)
            if one is not None:
                return [one]
        return run_on_application_sync(connection, submit_steps(jobs, now), now)


async def run_on_application(
    conn: psycopg.AsyncConnection[Any], script: Script[T], now: datetime | None
) -> T:
    """Run a script on an application's async connection, in its transaction (or in one
    of the script's own when it is in autocommit), reading rows conveyor's way."""
    async with conn.cursor(row_factory=dict_row) as cursor:
        our_loaders(cursor.adapters)
        if conn.autocommit:
            async with conn.transaction():
                return await run_script_async(cursor, script, now)
        return await run_script_async(cursor, script, now)


def run_on_application_sync(
    conn: psycopg.Connection[Any], script: Script[T], now: datetime | None
) -> T:
    """Run a script on an application's blocking connection, as
    :func:`run_on_application` does on an async one."""
    with conn.cursor(row_factory=dict_row) as cursor:
        our_loaders(cursor.adapters)
        if conn.autocommit:
            with conn.transaction():
                return run_script(cursor, script, now)
        return run_script(cursor, script, now)


def on_database(
    expected: tuple[str, datetime], steps: Script[T], checked: Callable[[], None]
) -> Script[T]:
    """Run ``steps`` only if the application's connection is on this store's database.

    A connection to another database would fail on a missing table, or worse, write the
    jobs into another conveyor's tables; nothing is written before this check.
    """
    (row,) = yield "database_identity", {}
    if (row["database"], row["started"]) != expected:
        where = row["database"]
        if row["database"] == expected[0]:
            where = f"{where} on another server"
        raise ConfigurationError(
            f"connection= is to database {where!r}, but this application uses "
            f"{expected[0]!r}: pass a connection to the application's database, or submit "
            "without connection="
        )
    checked()
    return (yield from steps)
