"""SQLite's values: epoch seconds for times, JSON text for documents and lists.

The one parameter codec of the SQLite store (:func:`encode`), its :class:`Dialect` for the
shared transaction scripts, its job reader, and its submit steps.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from conveyor.core.jsontext import compact, loads
from conveyor.core.lifecycle import Status, dependency_event
from conveyor.core.model import JSON, Job, NewJob
from conveyor.store._rows import STATUS, SUBMITTED, Kind, job_picker, job_reader, job_writer
from conveyor.store.protocol import Submitted
from conveyor.store.scripts import Row, Script, check_dependencies, check_same_tenant


def ts(value: float | None) -> datetime | None:
    """Read a stored time."""
    return None if value is None else datetime.fromtimestamp(value, UTC)


def epoch(value: datetime) -> float:
    """Write a time as seconds since the epoch (a naive time is taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def epoch_micros(seconds: float) -> int:
    """A clock reading (seconds since the epoch) as whole microseconds, rounded as a time
    written as seconds reads back (``datetime.fromtimestamp``: the fraction of the second
    rounded half to even). So a job's creation microsecond and the other times written
    from the same reading (its run time; in the same write, another job's end) read back
    the same. ``round(seconds * 1e6)`` differs by one for about one reading in eight: the
    product of a present-day time and a million is a float a quarter microsecond coarse.

    >>> epoch_micros(1795851969.7887235), round(1795851969.7887235 * 1e6)
    (1795851969788723, 1795851969788724)
    >>> datetime.fromtimestamp(1795851969.7887235, UTC).microsecond
    788723
    """
    whole = math.floor(seconds)
    return whole * 1_000_000 + round((seconds - whole) * 1_000_000)


def micros(value: datetime) -> int:
    """A time as whole microseconds since the epoch, exactly (as conveyor_jobs.created_us).

    >>> micros(datetime(1970, 1, 1, 0, 0, 1, 5, tzinfo=UTC))
    1000005
    """
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - _EPOCH) // _ONE_US


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


def encode(params: dict[str, Any], now: float) -> dict[str, Any]:
    """Turn a script step's parameters into SQLite's: times as epoch seconds, lists as JSON."""
    out = dict(params)
    for key, value in params.items():
        if isinstance(value, datetime):
            out[key] = epoch(value)
        elif isinstance(value, list | tuple):
            out[key] = json.dumps(value)
    out["now"] = now
    return out


class SQLiteDialect:
    """How the shared scripts read SQLite's values and insert jobs."""

    def time(self, value: Any) -> datetime | None:
        return ts(value)

    def json(self, value: Any) -> JSON:
        return None if value is None else json.loads(value)

    def strings(self, value: Any) -> tuple[str, ...]:
        return tuple(json.loads(value))

    def job(self, row: Row) -> Job:
        return job_of_row(row)

    def submit(self, jobs: Sequence[NewJob]) -> Script[list[Submitted]]:
        return submit_steps(jobs)


DIALECT = SQLiteDialect()


def jobs_of(cursor: sqlite3.Cursor) -> list[Job]:
    """Read every row of a query of conveyor_jobs as a Job.

    The rows of one claim share their start and lease expiry, and jobs submitted together
    their creation and due times: each distinct time is turned into a datetime once (a
    datetime is immutable, so the jobs can share it).
    """
    rows = cursor.fetchall()
    if not rows:
        return []
    pick = job_picker(tuple(d[0] for d in cursor.description))
    times: dict[float, datetime] = {}

    def at(value: float) -> datetime:
        found = times.get(value)
        if found is None:
            found = times[value] = datetime.fromtimestamp(value, UTC)
        return found

    return [_job_of(*pick(row), at=at) for row in rows]


def job_of_row(row: Any) -> Job:
    """Read one row of conveyor_jobs."""
    return _job_of(*job_picker(tuple(row.keys()))(row))


def _at(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


# How SQLite stores each kind of column (conveyor/store/_rows.py): documents and lists
# of ids as JSON text, times as epoch seconds, booleans as 0 or 1.
_READS = {
    Kind.TEXT: "{}", Kind.INT: "{}", Kind.BIGINT: "{}", Kind.FLOAT: "{}",
    Kind.BOOL: "bool({})", Kind.JSON: "loads({})", Kind.TIME: "at({})",
    Kind.IDS: "tuple(json_loads({})) if {} else ()", Kind.STATUS: "STATUS[{}]",
}  # fmt: skip
_WRITES = {kind: "{}" for kind in Kind} | {
    Kind.JSON: "compact({})",
    Kind.IDS: "json_dumps(list({}))",
}
_job_of = job_reader(_READS, {"loads": loads, "json_loads": json.loads}, at=_at)
# The payload comes last, as its text: the one the submit's check wrote, when it kept it.
_written: Callable[[NewJob, str], dict[str, Any]] = job_writer(
    _WRITES,
    {"compact": compact, "json_dumps": json.dumps},
    columns=tuple(c for c in SUBMITTED if c.name != "payload"),
    after=("payload",),
)


def new_job_params(job: NewJob, now: float) -> dict[str, Any]:
    """Return insert_job's parameters for a job submitted at ``now`` but its creation
    microsecond, ``created_us``, which the caller gives it."""
    params = _written(job, job.payload_json())
    params["status"] = (Status.PENDING if job.depends_on else Status.QUEUED).value
    params["run_at"] = epoch(job.run_at) if job.run_at is not None else now + job.delay
    params["now"] = now
    return params


def submit_steps(jobs: Sequence[NewJob], now: float | None = None) -> Script[list[Submitted]]:
    """Insert jobs submitted at ``now`` (None: ask the runner's clock); an existing id or
    active unique key returns its job.

    Without dependencies (which must find the jobs before them), many jobs go in one
    statement; those it did not create (an id or unique key taken) take the one-by-one
    path, which finds the job holding it.
    """
    if now is None:
        (clock,) = yield "now", {}
        now = float(clock["now"])
    # Each job its own microsecond (the table's key), after every job the table holds.
    (first,) = yield "next_created_us", {"now_us": epoch_micros(now)}
    rows = [new_job_params(job, now) for job in jobs]
    for created_us, params in enumerate(rows, start=first["first_us"]):
        params["created_us"] = created_us
    created: dict[str, Any] = {}
    if len(jobs) > 1 and not any(job.depends_on for job in jobs):
        created = {r["id"]: r for r in (yield "insert_jobs", {"jobs": json.dumps(rows)})}
    results = []
    for job, params in zip(jobs, rows, strict=True):
        # pop: when an id repeats within the batch, only its first job is created.
        row = created.pop(job.id, None)
        if row is None:
            results.append((yield from _insert(job, params)))
            continue
        stored = job.stored(
            STATUS[row["status"]],
            datetime.fromtimestamp(row["run_at"], UTC),
            datetime.fromtimestamp(row["created_at"], UTC),
        )
        results.append(Submitted(stored, created=True))
    return results


def _insert(job: NewJob, params: dict[str, Any]) -> Script[Submitted]:
    """Insert one job (and its dependency edges), or return the job that holds its id."""
    blocked_by: tuple[str, Status] | None = None
    if job.depends_on:
        rows = yield "get_many", {"ids": list(job.depends_on)}
        found = {r["id"]: Status(r["status"]) for r in rows}
        check_dependencies(job, found)
        if all(st is Status.SUCCEEDED for st in found.values()):
            params = params | {"status": Status.QUEUED.value}
        blocked_by = next(
            ((d, st) for d, st in found.items() if dependency_event(st) is not None), None
        )
    inserted = yield "insert_job", params
    if inserted:
        row = inserted[0]
        if job.depends_on:
            ids = list(dict.fromkeys(job.depends_on))
            yield "insert_dependencies", {"job_id": job.id, "ids": ids}
        if blocked_by is not None:
            upstream, status = blocked_by
            reason = f"dependency {upstream} {status.value}"
            yield "cancel_pending", {"id": job.id, "reason": reason}
            (row,) = yield "get", {"id": job.id}
        return Submitted(job_of_row(row), created=True)
    existing = yield "get", {"id": params["id"]}
    if not existing and params["unique_key"] is not None:
        key = {"unique_key": params["unique_key"], "tenant": params["tenant"]}
        existing = yield "get_active_by_unique_key", key
    if not existing:
        raise RuntimeError(f"job {params['id']!r} was neither inserted nor found")
    holder = job_of_row(existing[0])
    check_same_tenant(job, holder)
    return Submitted(holder, created=False)
