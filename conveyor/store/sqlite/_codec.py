"""SQLite's values: epoch seconds for times, JSON text for documents and lists.

The one parameter codec of the SQLite store (:func:`encode`), its :class:`Dialect` for the
shared transaction scripts, its job reader, and its submit steps.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from conveyor.core.jsontext import compact, loads
from conveyor.core.lifecycle import Status, dependency_event
from conveyor.core.model import JSON, Job, NewJob, Progress
from conveyor.store._queries import load_queries
from conveyor.store._rows import STATUS, job_picker
from conveyor.store.protocol import Submitted
from conveyor.store.scripts import Row, Script, check_dependencies, check_same_tenant, dumps

SUBMIT_ONE = load_queries("conveyor.store.sqlite")["submit_one"]


def ts(value: float | None) -> datetime | None:
    """Read a stored time."""
    return None if value is None else datetime.fromtimestamp(value, UTC)


def epoch(value: datetime) -> float:
    """Write a time as seconds since the epoch (a naive time is taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


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


def _job_of(
    id: str, type: str, queue: str, tenant: str | None, payload: str, status: str,
    priority: int, attempt: int, max_attempts: int, run_at: float, created_at: float,
    timeout: float | None, lease_seconds: float | None, backoff_base: float,
    backoff_cap: float, progress_done: float | None, progress_total: float | None,
    progress_message: str | None, state: str | None, result: str | None,
    result_ref: str | None, error: str | None, parent_id: str | None, root_id: str | None,
    depends_on: str | None, unique_key: str | None, concurrency_key: str | None,
    retry_of: str | None, started_at: float | None, finished_at: float | None,
    lease_owner: str | None, lease_expires_at: float | None, lease_token: int,
    cancel_requested: int,
    trace_context: str | None, retry_count: int, retried_by: str | None, submitted_by: str,
    *, at: Callable[[float], datetime] = _at,
) -> Job:  # fmt: skip
    return Job(
        id=id,
        type=type,
        queue=queue,
        tenant=tenant,
        payload=loads(payload),
        status=STATUS[status],
        priority=priority,
        attempt=attempt,
        max_attempts=max_attempts,
        run_at=at(run_at),
        created_at=at(created_at),
        timeout=timeout,
        lease=lease_seconds,
        backoff_base=backoff_base,
        backoff_cap=backoff_cap,
        progress=None
        if progress_done is None
        else Progress(done=progress_done, total=progress_total, message=progress_message),
        state=None if state is None else loads(state),
        result=None if result is None else loads(result),
        result_ref=result_ref,
        error=error,
        parent_id=parent_id,
        root_id=root_id,
        depends_on=tuple(json.loads(depends_on)) if depends_on else (),
        unique_key=unique_key,
        concurrency_key=concurrency_key,
        retry_of=retry_of,
        started_at=None if started_at is None else at(started_at),
        finished_at=None if finished_at is None else at(finished_at),
        lease_owner=lease_owner,
        lease_expires_at=None if lease_expires_at is None else at(lease_expires_at),
        lease_token=lease_token,
        cancel_requested=bool(cancel_requested),
        trace_context=trace_context,
        retry_count=retry_count,
        retried_by=retried_by,
        submitted_by=submitted_by,
    )


def new_job_params(job: NewJob, now: float) -> dict[str, Any]:
    """Return insert_job's parameters for a job submitted at ``now``."""
    run_at = epoch(job.run_at) if job.run_at is not None else now + job.delay
    return {
        "id": job.id,
        "type": job.type,
        "queue": job.queue,
        "tenant": job.tenant,
        "payload": compact(job.payload),
        "status": (Status.PENDING if job.depends_on else Status.QUEUED).value,
        "priority": job.priority,
        "max_attempts": job.max_attempts,
        "run_at": run_at,
        "timeout": job.timeout,
        "lease_seconds": job.lease,
        "backoff_base": job.backoff_base,
        "backoff_cap": job.backoff_cap,
        "state": dumps(job.state),
        "parent_id": job.parent_id,
        "root_id": job.root_id,
        "depends_on": json.dumps(list(job.depends_on)) if job.depends_on else None,
        "unique_key": job.unique_key,
        "concurrency_key": job.concurrency_key,
        "retry_of": job.retry_of,
        "trace_context": job.trace_context,
        "retry_count": job.retry_count,
        "submitted_by": job.submitted_by,
        "now": now,
    }


def submit_one(conn: sqlite3.Connection, job: NewJob, now: float) -> Submitted | None:
    """Insert one job without dependencies, in the caller's transaction; None when its id
    or an active unique key is taken (nothing is written then)."""
    if job.depends_on:
        raise ValueError("submit_one takes a job without dependencies")
    params = new_job_params(job, now)
    if not conn.execute(SUBMIT_ONE, params).fetchall():
        return None
    run_at = datetime.fromtimestamp(params["run_at"], UTC)
    created_at = datetime.fromtimestamp(now, UTC)
    return Submitted(job.stored(Status.QUEUED, run_at, created_at), created=True)


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
    rows = [new_job_params(job, now) for job in jobs]
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
