"""Transaction scripts shared by both stores, written once and free of any SQL dialect.

A script is a generator: it yields ``(query_name, params)`` steps, receives each step's
rows back, and returns its result. Each backend drives scripts with one runner of its
own, which looks the name up in its ``queries.sql``, encodes the parameters (SQLite:
lists as JSON text, times as epoch seconds; PostgreSQL: native values) and supplies
``now``, the store's clock: so scripts never pass ``now``, and a script that needs the
time in Python asks for it with the ``now`` step. Values read from rows go through the
backend's :class:`Dialect`; values copied from one row into a later step (a compare-and-set
on a stored time) are passed on as read, so no time goes through a float and back.

Scripts run inside one transaction of the runner's choosing: SQLite's store thread
inside ``BEGIN IMMEDIATE``, PostgreSQL's transaction thread (never across an event-loop
hop). Where a dialect needs no statement for a step (SQLite needs no lock: ``BEGIN
IMMEDIATE`` holds the write lock), its ``queries.sql`` names a no-op.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Generator, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from conveyor.core.auth import Role, Token
from conveyor.core.cron import (
    CatchUp,
    Cron,
    Overlap,
    Schedule,
    plan_schedule,
    schedule_job,
    tick_id,
    without_overlap,
)
from conveyor.core.flow import FlowCapacity
from conveyor.core.jsontext import compact
from conveyor.core.lifecycle import (
    Status,
    children_error,
    children_event,
    dependency_event,
    returned_event,
    transition,
)
from conveyor.core.model import (
    JSON,
    Attempt,
    Job,
    NewJob,
    Outcome,
    Settlement,
    TreeCounts,
    after_failure,
)
from conveyor.errors import IdempotencyConflict, InvalidDependency, InvalidState
from conveyor.store import _fairness as fairness
from conveyor.store.protocol import (
    AuditEntry,
    HealthCounts,
    JobEvent,
    Lease,
    LeaseRecord,
    Limits,
    MinuteStats,
    QueueInfo,
    Rescued,
    Retention,
    ScheduleInfo,
    Submitted,
    WorkerInfo,
)

log = logging.getLogger("conveyor.schedules")

T = TypeVar("T")
Row = Mapping[str, Any]
Step = tuple[str, dict[str, Any]]
Script = Generator[Step, list[Any], T]
# A job that ended: its id, its parent's id and its status.
Ended = tuple[str, str | None, Status]

# A retention longer than this (about 95 years) keeps jobs forever; PostgreSQL's
# intervals cannot hold an infinite one.
FOREVER = 3e9
# How many claim_candidates rounds a limited claim makes: each round blocks at least one
# more type or key, so a few rounds fill a claim unless nearly everything is limited.
_CLAIM_ROUNDS = 8


class Dialect(Protocol):
    """What a backend tells the scripts about its values, and how it inserts jobs."""

    def time(self, value: Any) -> datetime | None:
        """Read a stored time (None stays None)."""

    def json(self, value: Any) -> JSON:
        """Read a stored JSON document."""

    def strings(self, value: Any) -> tuple[str, ...]:
        """Read a stored list of strings."""

    def job(self, row: Row) -> Job:
        """Read a row of conveyor_jobs."""

    def submit(self, jobs: Sequence[NewJob]) -> Script[list[Submitted]]:
        """Insert jobs as the backend's submit does, in the script's transaction."""


def drive(script: Script[T], execute: Callable[[str, dict[str, Any]], list[Any]]) -> T:
    """Run a script to its end, running each step with ``execute``; return its result."""
    try:
        step = next(script)
        while True:
            step = script.send(execute(*step))
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(
    script: Script[T], execute: Callable[[str, dict[str, Any]], Awaitable[list[Any]]]
) -> T:
    """Run a script to its end, awaiting ``execute`` for each step; return its result."""
    try:
        step = next(script)
        while True:
            step = script.send(await execute(*step))
    except StopIteration as done:
        result: T = done.value
        return result


def _time(dialect: Dialect, value: Any, what: str) -> datetime:
    moment = dialect.time(value)
    if moment is None:
        raise RuntimeError(f"the database returned no {what}")
    return moment


def now(dialect: Dialect) -> Script[datetime]:
    """Return the store's clock: the pinned time, or the database's."""
    (row,) = yield "now", {}
    return _time(dialect, row["now"], "time")


# -- rows read and parameters written ---------------------------------------------------


def schedule_params(s: Schedule) -> dict[str, Any]:
    """Return a schedule's definition as upsert_schedule's parameters."""
    return {
        "name": s.name,
        "cron": s.cron.expression,
        "timezone": s.cron.timezone,
        "type": s.type,
        "payload": dumps(s.payload),
        "queue": s.queue,
        "priority": s.priority,
        "max_attempts": s.max_attempts,
        "timeout": s.timeout,
        "lease_seconds": s.lease,
        "backoff_base": s.backoff_base,
        "backoff_cap": s.backoff_cap,
        "catch_up": s.catch_up.value,
        "backfill_limit": s.backfill_limit,
        "grace": s.grace,
        "overlap": s.overlap.value,
    }


def schedule_info(dialect: Dialect, row: Row) -> ScheduleInfo:
    """Read a row of conveyor_schedules."""
    return ScheduleInfo(
        schedule=Schedule(
            name=row["name"],
            cron=Cron(row["cron"], row["timezone"]),
            type=row["type"],
            payload=dialect.json(row["payload"]),
            queue=row["queue"],
            priority=row["priority"],
            max_attempts=row["max_attempts"],
            timeout=row["timeout"],
            lease=row["lease_seconds"],
            backoff_base=row["backoff_base"],
            backoff_cap=row["backoff_cap"],
            catch_up=CatchUp(row["catch_up"]),
            backfill_limit=row["backfill_limit"],
            grace=row["grace"],
            overlap=Overlap(row["overlap"]),
        ),
        enabled=bool(row["enabled"]),
        next_run_at=_time(dialect, row["next_run_at"], f"next tick of {row['name']!r}"),
        last_run_at=dialect.time(row["last_run_at"]),
        skipped_ticks=int(row["skipped_ticks"]),
    )


def lease_record(dialect: Dialect, row: Row) -> LeaseRecord:
    """Read a named lease's current row."""
    return LeaseRecord(
        name=row["name"],
        owner=row["owner"] or "",
        token=row["token"],
        acquired_at=dialect.time(row["acquired_at"]) or datetime.fromtimestamp(0, UTC),
        expires_at=dialect.time(row["expires_at"]),
    )


def past_lease(dialect: Dialect, row: Row) -> LeaseRecord:
    """Read a row of a named lease's history."""
    return LeaseRecord(
        name=row["name"],
        owner=row["owner"],
        token=row["token"],
        acquired_at=dialect.time(row["acquired_at"]) or datetime.fromtimestamp(0, UTC),
        ended_at=dialect.time(row["ended_at"]),
        ended=row["ended"],
    )


def token(dialect: Dialect, row: Row) -> Token:
    """Read a row of conveyor_tokens."""
    return Token(
        id=row["id"],
        tenant=row["tenant"],
        role=Role(row["role"]),
        secret_hash=row["secret_hash"],
        name=row["name"],
        created_at=_time(dialect, row["created_at"], f"creation time of token {row['id']!r}"),
        last_used_at=dialect.time(row["last_used_at"]),
        revoked_at=dialect.time(row["revoked_at"]),
        expires_at=dialect.time(row["expires_at"]),
        previous_hash=row["previous_hash"],
        previous_expires_at=dialect.time(row["previous_expires_at"]),
    )


def health_counts(dialect: Dialect, row: Row) -> HealthCounts:
    """Read the row of the ``health`` query."""
    return HealthCounts(
        queued=row["queued"],
        due=row["due"],
        running=row["running"],
        stale_running=row["stale_running"],
        workers=row["workers"],
        live_workers=row["live_workers"],
        last_heartbeat=dialect.time(row["last_heartbeat"]),
        now=_time(dialect, row["now"], "time"),
        dead_workers=row["dead_workers"],
    )


def attempt(dialect: Dialect, row: Row) -> Attempt:
    """Read a row of conveyor_attempts."""
    return Attempt(
        job_id=row["job_id"],
        number=row["number"],
        worker_id=row["worker_id"],
        started_at=dialect.time(row["started_at"]),
        finished_at=dialect.time(row["finished_at"]),
        outcome=Outcome(row["outcome"]),
        error=row["error"],
        traceback=row["traceback"],
    )


def worker_info(dialect: Dialect, row: Row) -> WorkerInfo:
    """Read a row of conveyor_workers."""
    return WorkerInfo(
        id=row["id"],
        hostname=row["hostname"],
        pid=row["pid"],
        queues=dialect.strings(row["queues"]),
        concurrency=row["concurrency"],
        started_at=dialect.time(row["started_at"]),
        heartbeat_at=dialect.time(row["heartbeat_at"]),
        stopped_at=dialect.time(row["stopped_at"]),
        lease=row["lease_seconds"],
        heartbeat_interval=row["heartbeat_seconds"],
        types=None if row["types"] is None else dialect.strings(row["types"]),
        forget_after=row["forget_seconds"],
    )


def queue_infos(rows: Sequence[Row]) -> list[QueueInfo]:
    """Read the rows of the queues query: one per queue and status, or per idle queue."""
    counts: dict[str, dict[str, int]] = {}
    paused: dict[str, bool] = {}
    for row in rows:
        name = row["name"]
        paused[name] = bool(row["paused"])
        bucket = counts.setdefault(name, {})
        if row["status"] is not None:
            bucket[row["status"]] = int(row["n"])
    return [QueueInfo(name, paused[name], counts[name]) for name in sorted(counts)]


def worker_params(worker: WorkerInfo) -> dict[str, Any]:
    """Return register_worker's parameters (the queues as a list)."""
    return {
        "id": worker.id,
        "hostname": worker.hostname,
        "pid": worker.pid,
        "queues": list(worker.queues),
        "concurrency": worker.concurrency,
        "lease_seconds": worker.lease,
        "heartbeat_seconds": worker.heartbeat_interval,
        "types": None if worker.types is None else list(worker.types),
        "forget_seconds": worker.forget_after,
    }


def token_params(token: Token) -> dict[str, Any]:
    """Return create_token's parameters (the creation time as a datetime)."""
    return {
        "id": token.id,
        "tenant": token.tenant,
        "role": token.role.value,
        "secret_hash": token.secret_hash,
        "name": token.name,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
    }


def dumps(value: JSON) -> str | None:
    """Write a JSON document as compact text (None stays None)."""
    return None if value is None else compact(value)


# -- trees and dependencies --------------------------------------------------------------
#
# Every parent has a row of conveyor_job_counts: the jobs below it (every level) by the
# counter their status is kept in. Each statement that moves a job with a parent reports
# the move (parent, status before, status after), and count_moves carries a batch of moves
# up to every ancestor in one statement; a job without a parent reports none, so it pays
# no statement. A parent is decided from its row, which its children's moves lock first:
# the decision sees every move committed before it.

# The counter each status is kept in: queued and running share one (a claim moves no
# counter; the running jobs of a tree are counted on read, see get_with_counts).
BUCKET = {
    Status.PENDING: "pending",
    Status.QUEUED: "active",
    Status.RUNNING: "active",
    Status.WAITING: "waiting",
    Status.SUCCEEDED: "succeeded",
    Status.FAILED: "failed",
    Status.CANCELLED: "cancelled",
}
COUNTERS = ("pending", "active", "waiting", "succeeded", "failed", "cancelled")
# A move: n jobs below `parent` went from one status to another (None: new, or gone).
Change = tuple[str | None, Status | None, Status | None]


def moves_of(changes: Iterable[Change]) -> list[dict[str, Any]]:
    """Group changes into count_moves' moves, leaving out those that move no counter."""
    grouped: Counter[tuple[str, str | None, str | None]] = Counter()
    for parent, before, after in changes:
        src = None if before is None else BUCKET[before]
        dst = None if after is None else BUCKET[after]
        if parent is not None and src != dst:
            grouped[(parent, src, dst)] += 1
    return [
        {"parent": parent, "src": src, "dst": dst, "n": n}
        for (parent, src, dst), n in sorted(grouped.items(), key=str)
    ]


# The counts of parents as a transaction last wrote them: its own writes hold their rows'
# locks until it ends, so these need not be read (and locked) again.
Known = dict[str, dict[Status, int]]


def count_moves(moves: Sequence[Mapping[str, Any]]) -> Script[Known]:
    """Carry moves to the counts of every ancestor (no statement when there are none);
    return the ancestors' counts as they are now."""
    if not moves:
        return {}
    rows = yield "count_moves", {"moves": json.dumps(list(moves), separators=(",", ":"))}
    return {row["job_id"]: counts_by_status(row) for row in rows}


def counts_by_status(row: Row | None) -> dict[Status, int]:
    """A conveyor_job_counts row as counts by status (queued standing for active)."""
    if row is None:
        return {}
    return {
        Status.PENDING: int(row["pending"]),
        Status.QUEUED: int(row["active"]),
        Status.WAITING: int(row["waiting"]),
        Status.SUCCEEDED: int(row["succeeded"]),
        Status.FAILED: int(row["failed"]),
        Status.CANCELLED: int(row["cancelled"]),
    }


def tree_counts(row: Row) -> TreeCounts | None:
    """Read the counts get_with_counts adds to a job's row (None: nothing below it)."""
    if row["below_active"] is None:
        return None
    active = int(row["below_active"])
    running = min(active, int(row["below_running"] or 0))
    return TreeCounts(
        pending=int(row["below_pending"]),
        queued=active - running,
        running=running,
        waiting=int(row["below_waiting"]),
        succeeded=int(row["below_succeeded"]),
        failed=int(row["below_failed"]),
        cancelled=int(row["below_cancelled"]),
    )


def get_with_counts(dialect: Dialect, job_id: str) -> Script[Job | None]:
    """Read one job with the counts of the jobs below it."""
    rows = yield "get_with_counts", {"id": job_id}
    if not rows:
        return None
    job = dialect.job(rows[0])
    job.below = tree_counts(rows[0])
    return job


def lock_counts(ids: Sequence[str]) -> Script[dict[str, dict[Status, int]]]:
    """Lock and return the counts below these parents."""
    rows = yield "lock_counts", {"ids": list(ids)}
    return {row["job_id"]: counts_by_status(row) for row in rows}


def decide_from_children(settlements: Sequence[Settlement]) -> Script[list[Settlement]]:
    """Turn 'the handler returned' into waiting, succeeded or failed, from the jobs below."""
    counts = yield from lock_counts([s.job_id for s in settlements])
    decided = []
    for s in settlements:
        below = counts.get(s.job_id, {})
        status = transition(Status.RUNNING, returned_event(below))
        error = children_error(below) if status is Status.FAILED else s.error
        decided.append(dataclasses.replace(s, status=status, error=error))
    return decided


def finish_parent(
    dialect: Dialect, parent_id: str, known: Known | None = None
) -> Script[Ended | None]:
    """End a waiting parent with nothing unfinished below it; return it if it ended.

    ``known``: counts this transaction wrote last, read here instead of locking again.
    """
    if known is not None and parent_id in known:
        counts = known[parent_id]
    else:
        counts = (yield from lock_counts([parent_id])).get(parent_id, {})
    event = children_event(counts)
    if event is None:
        return None
    status = transition(Status.WAITING, event)
    error = children_error(counts) if status is Status.FAILED else None
    params = {"id": parent_id, "status": status.value, "error": error}
    rows = yield "finish_waiting", params
    if not rows:
        return None
    status = Status(rows[0]["status"])  # cancelled, whatever its children did, if asked
    yield from fire_callbacks(dialect, parent_id, status, counts)
    return (rows[0]["id"], rows[0]["parent_id"], status)


def cascade(
    dialect: Dialect,
    ended: list[Ended],
    *,
    moves: Sequence[Mapping[str, Any]] = (),
    without_dependents: frozenset[str] = frozenset(),
    parents: Collection[str] = (),
) -> Script[None]:
    """Count ``moves``, then carry jobs' ends to their parents and dependents, transitively.

    ``parents``: jobs of ``ended`` that have jobs below them (their callbacks fire). A
    round at a time: each parent is decided once per round, however many of its children
    ended, after the round's moves are counted; dependents are looked for except of
    ``without_dependents``, known to have none.
    """
    known = yield from count_moves(moves)
    for job_id, _, status in ended:
        if job_id in parents:
            counts = (yield from lock_counts([job_id])).get(job_id, {})
            yield from fire_callbacks(dialect, job_id, status, counts)
    todo = ended
    while todo:
        round_, todo = todo, []
        changes: list[Change] = []
        for parent_id in sorted({p for _, p, _ in round_ if p is not None}):
            finished = yield from finish_parent(dialect, parent_id, known)
            if finished is not None:
                todo.append(finished)
                changes.append((finished[1], Status.WAITING, finished[2]))
        for job_id, _, status in round_:
            if job_id not in without_dependents:
                cancelled, released = yield from _carry_to_dependents(job_id, status)
                todo.extend(cancelled)
                changes.extend((p, Status.PENDING, Status.CANCELLED) for _, p, _ in cancelled)
                changes.extend((p, Status.PENDING, Status.QUEUED) for p in released)
        known.update((yield from count_moves(moves_of(changes))))


def after_settle(
    dialect: Dialect,
    ends: Sequence[Ended],
    *,
    awaited: Collection[str] | None = None,
    parents: Collection[str] = frozenset(),
) -> Script[None]:
    """Carry a settled batch on: count the moves of jobs with a parent, and carry the
    ends that reach another job to their parents and dependents.

    ``ends``: every job the settle moved, with its parent and its status now (ended or
    queued again). ``awaited``: those of the ended jobs that pending jobs depend on, when
    the backend looked them up with the settle (None: looked up here). ``parents``: jobs
    with children that were decided from them (their callbacks fire). An ended job that
    has no parent, no pending dependent and no children is carried nowhere; one that
    nothing waits for skips the look-up of its dependents.
    """
    finished = [e for e in ends if e[2].terminal]
    if awaited is None:
        awaited = set()
        if finished:
            rows = yield "awaited", {"ids": [job_id for job_id, _, _ in finished]}
            awaited = {r["id"] for r in rows}
    changes: list[Change] = [(p, Status.RUNNING, st) for _, p, st in ends if p is not None]
    carried = [f for f in finished if f[1] is not None or f[0] in awaited or f[0] in parents]
    if carried or changes:
        yield from cascade(
            dialect,
            carried,
            moves=moves_of(changes),
            without_dependents=frozenset(f[0] for f in finished if f[0] not in awaited),
            parents=parents,
        )


def _carry_to_dependents(
    job_id: str, status: Status
) -> Script[tuple[list[Ended], list[str | None]]]:
    """Queue a job's pending dependents that may now run, or cancel them; return those
    cancelled, and the parents of those queued."""
    cancelled: list[Ended] = []
    released: list[str | None] = []
    for dependent in (yield "pending_dependents", {"id": job_id}):
        if dependency_event(status) is None:
            (unmet,) = yield "unmet_dependencies", {"id": dependent["id"]}
            if unmet["n"] == 0:
                rows = yield "release_pending", {"id": dependent["id"]}
                released.extend(r["parent_id"] for r in rows)
            continue
        reason = f"dependency {job_id} {status.value}"
        rows = yield "cancel_pending", {"id": dependent["id"], "reason": reason}
        if rows:
            cancelled.append((rows[0]["id"], rows[0]["parent_id"], Status.CANCELLED))
    return cancelled, released


def finish_parents(dialect: Dialect, limit: int) -> Script[list[str]]:
    """End waiting parents whose children have all ended; return their ids."""
    parents = yield "waiting_parents", {"limit": limit}
    return (yield from finish_listed(dialect, [parent["id"] for parent in parents]))


def finish_listed(dialect: Dialect, parent_ids: Sequence[str]) -> Script[list[str]]:
    """End those of these parents that wait with nothing unfinished below them (each
    decided from its locked counts), and carry their ends on; return the ids ended."""
    done = []
    for parent_id in parent_ids:
        finished = yield from finish_parent(dialect, parent_id)
        if finished is not None:
            done.append(finished[0])
            moves = moves_of([(finished[1], Status.WAITING, finished[2])])
            yield from cascade(dialect, [finished], moves=moves)
    return done


def cancel(dialect: Dialect, job_id: str, reason: str) -> Script[Job | None]:
    """Cancel a job now, or ask its worker to; a waiting job takes its subtree along.

    The job is locked first, so the status it is cancelled from is the one counted. A
    waiting parent is asked to stop like a running job: what has not started below it is
    cancelled at once, running jobs below it are asked to stop, and it ends ``cancelled``
    (firing its callbacks, with the counts of every job below it) once the last of them
    has ended, as any parent ends: from ``waiting``, decided from its counts.
    """
    locked = yield "lock_job", {"id": job_id}
    if not locked:
        return None
    before, parent_id = Status(locked[0]["status"]), locked[0]["parent_id"]
    params = {"id": job_id, "reason": reason}
    rows = yield "cancel_unstarted", params
    if rows:
        moves = moves_of([(parent_id, before, Status.CANCELLED)])
        yield from cascade(dialect, [(job_id, parent_id, Status.CANCELLED)], moves=moves)
    else:
        rows = yield "request_cancel", params
        if rows:
            yield from _cancel_below(dialect, job_id, waiting=before is Status.WAITING)
    found = yield "get", {"id": job_id}
    return dialect.job(found[0]) if found else None


def _cancel_below(dialect: Dialect, job_id: str, *, waiting: bool) -> Script[None]:
    """Cancel what has not started below a parent asked to stop, and ask the jobs running
    or waiting below it to stop; the parents end as their last child does.

    Every waiting and running job below is asked first, so that a parent whose last
    unstarted child is cancelled here ends ``cancelled``, not ``failed``. A running job
    may have spawned children already (its handler may even have returned, its settle
    not yet written): they are stopped too, and it waits for them if it returns.
    """
    below = yield "unfinished_descendants", {"id": job_id}
    if not below and not waiting:
        return
    reason = f"parent {job_id} cancelled"
    for child in below:
        if child["status"] in ("running", "waiting"):
            yield "request_cancel", {"id": child["id"], "reason": reason}
    for child in below:
        if child["status"] not in ("pending", "queued"):
            continue
        locked = yield "lock_job", {"id": child["id"]}
        rows = yield "cancel_unstarted", {"id": child["id"], "reason": reason}
        if rows:
            parent_id = locked[0]["parent_id"]
            before = Status(locked[0]["status"])
            moves = moves_of([(parent_id, before, Status.CANCELLED)])
            yield from cascade(dialect, [(child["id"], parent_id, Status.CANCELLED)], moves=moves)
    if waiting:  # with nothing left unfinished below it, it ends now (no child's end will)
        yield from finish_listed(dialect, [job_id])


# -- completion callbacks ----------------------------------------------------------------


def callback_definition(job: NewJob) -> str:
    """A callback's definition as stored until its batch ends (JSON text)."""
    return json.dumps(
        {
            "type": job.type,
            "payload": job.payload,
            "queue": job.queue,
            "priority": job.priority,
            "max_attempts": job.max_attempts,
            "timeout": job.timeout,
            "lease": job.lease,
            "backoff_base": job.backoff_base,
            "backoff_cap": job.backoff_cap,
            "tenant": job.tenant,
            "concurrency_key": job.concurrency_key,
            "submitted_by": job.submitted_by,
            "trace_context": job.trace_context,
        },
        separators=(",", ":"),
    )


def callback_job(
    parent_id: str, kind: str, fired: int, definition: Mapping[str, Any], batch: JSON
) -> NewJob:
    """The job a callback submits, with the batch's outcome as ``batch`` in its payload.

    Its id comes from the parent's, so that it is submitted once per end of the batch: a
    re-opened parent that ends again fires it again, as ``<id>.on_<kind>.<n>``.
    """
    suffix = "" if fired <= 1 else f".{fired}"
    return NewJob(
        id=f"{parent_id}.on_{kind}{suffix}",
        type=definition["type"],
        payload={**definition["payload"], "batch": batch},
        queue=definition["queue"],
        priority=definition["priority"],
        max_attempts=definition["max_attempts"],
        timeout=definition["timeout"],
        lease=definition["lease"],
        backoff_base=definition["backoff_base"],
        backoff_cap=definition["backoff_cap"],
        tenant=definition["tenant"],
        concurrency_key=definition["concurrency_key"],
        submitted_by=definition["submitted_by"],
        trace_context=definition["trace_context"],
    )


def fire_callbacks(
    dialect: Dialect, job_id: str, status: Status, counts: Mapping[Status, int]
) -> Script[None]:
    """Submit a parent's callbacks now that its batch ended: ``complete`` whatever the
    outcome, ``success`` only if it succeeded. They are top-level jobs, not children."""
    kinds = ["complete", "success"] if status is Status.SUCCEEDED else ["complete"]
    rows = yield "fire_callbacks", {"job_id": job_id, "kinds": kinds}
    if not rows:
        return
    finished = TreeCounts(
        succeeded=counts.get(Status.SUCCEEDED, 0),
        failed=counts.get(Status.FAILED, 0),
        cancelled=counts.get(Status.CANCELLED, 0),
    )
    batch = {"job_id": job_id, "status": status.value, **finished.to_dict()}
    jobs = [
        callback_job(job_id, r["kind"], int(r["fired"]), json.loads(r["job"]), batch)
        for r in sorted(rows, key=lambda r: str(r["kind"]))
    ]
    yield from dialect.submit(jobs)


# -- rescue ------------------------------------------------------------------------------


def rescue_decisions(rows: Sequence[Row], jitter: float) -> list[Settlement]:
    """Decide what becomes of jobs whose lease expired: each attempt ends as ``lost``.

    A job whose cancel was asked for ends cancelled (its cancel reason kept), never runs
    again: the request outlives the worker that was to act on it.
    """
    return [
        Settlement(
            job_id=r["id"],
            token=r["lease_token"],
            status=Status.CANCELLED,
            outcome=Outcome.LOST,
            error=f"lease expired: worker {r['lease_owner']} stopped heartbeating",
        )
        if r["cancel_requested"]
        else after_failure(
            job_id=r["id"],
            token=r["lease_token"],
            attempt=r["attempt"],
            max_attempts=r["max_attempts"],
            outcome=Outcome.LOST,
            error=f"lease expired: worker {r['lease_owner']} stopped heartbeating",
            backoff_base=r["backoff_base"],
            backoff_cap=r["backoff_cap"],
            jitter=jitter,
        )
        for r in rows
    ]


def rescued(
    rows: Sequence[Row], decisions: Sequence[Settlement], refused: Sequence[str]
) -> list[Rescued]:
    """Report the rescues the settle accepted."""
    owners = {r["id"]: r["lease_owner"] for r in rows}
    skip = set(refused)
    return [
        Rescued(job_id=d.job_id, worker_id=owners[d.job_id], status=d.status)
        for d in decisions
        if d.job_id not in skip
    ]


# -- submitting on behalf of others ----------------------------------------------------


def check_dependencies(job: NewJob, found: Collection[str]) -> None:
    """Refuse a job that depends on jobs that do not exist."""
    missing = [d for d in job.depends_on if d not in found]
    if missing:
        raise InvalidDependency(
            f"job {job.id!r} depends on jobs that do not exist: {', '.join(missing)}; "
            "submit those first (or in the same batch, before it)"
        )


def check_same_tenant(new: NewJob, existing: Job) -> None:
    """Refuse, inside the submit's transaction, to return another tenant's job for ``new``.

    Ids and unique keys are per tenant (core/ids.py), so this holds by construction; the
    check keeps it so should a row predate the namespaces, and rolls the whole batch back.
    """
    if existing.tenant != new.tenant:
        raise IdempotencyConflict(
            f"job {new.id!r} is taken by a job of another tenant: choose another id or key"
        )


def retry(dialect: Dialect, job_id: str, new: NewJob) -> Script[Job | None]:
    """Submit ``new`` as the manual retry of a failed or cancelled job, in its place.

    The old job is marked as retried (so it is retried once, and no longer counts below
    its parents); the new one counts instead, and every ancestor that failed goes back to
    ``waiting``, with a ``reopened`` event, to be decided again.
    """
    return (yield from _retry(dialect, job_id, new, strict=True))


def retry_many(dialect: Dialect, retries: Sequence[tuple[str, NewJob]]) -> Script[list[Job]]:
    """Retry many jobs in one transaction (their parents re-open once, not between two
    retries); those no longer failed or cancelled, or retried already, are left out."""
    done = []
    for job_id, new in retries:
        job = yield from _retry(dialect, job_id, new, strict=False)
        if job is not None:
            done.append(job)
    return done


def _retry(dialect: Dialect, job_id: str, new: NewJob, *, strict: bool) -> Script[Job | None]:
    rows = yield "lock_job", {"id": job_id}
    if not rows:
        return None
    old = dialect.job(rows[0])
    refused = None
    if old.status not in (Status.FAILED, Status.CANCELLED):
        refused = (
            f"job {job_id} is {old.status.value}: only failed or cancelled jobs can be retried"
        )
    elif old.retried_by is not None:
        refused = f"job {job_id} was already retried as {old.retried_by}: retry that job instead"
    if refused is not None:
        if strict:
            raise InvalidState(refused)
        return None
    yield "mark_retried", {"id": job_id, "by": new.id}
    (submitted,) = yield from dialect.submit([new])
    if old.parent_id is None:
        return submitted.job
    # The old job leaves its parents' counts with everything below it; the new one enters.
    below = (yield from lock_counts([job_id])).get(job_id, {})
    changes: list[Change] = [(old.parent_id, old.status, None)]
    changes.append((old.parent_id, None, submitted.job.status))
    changes.extend((yield from _reopen(old.parent_id, f"job {job_id} retried as {new.id}")))
    gone = [
        {"parent": old.parent_id, "src": BUCKET[st], "dst": None, "n": n}
        for st, n in below.items()
        if n
    ]
    yield from count_moves([*moves_of(changes), *gone])
    return submitted.job


def _reopen(parent_id: str, why: str) -> Script[list[Change]]:
    """Move the failed ancestors of a retried job back to waiting; return the moves."""
    changes: list[Change] = []
    current: str | None = parent_id
    while current is not None:
        rows = yield "reopen", {"id": current}
        if not rows:
            break
        yield "record_event", {"job_id": current, "event": "reopened", "detail": why}
        current = rows[0]["parent_id"]
        changes.append((current, Status.FAILED, Status.WAITING))
    return changes


def spawn(
    dialect: Dialect,
    lease: Lease,
    jobs: Sequence[NewJob],
    callbacks: Mapping[str, NewJob] | None = None,
) -> Script[list[Submitted] | None]:
    """Insert children of a leased job, fenced by its lease (None: the lease was lost).

    ``callbacks`` by kind (``complete``, ``success``): jobs to submit when this job's
    batch (everything below it) has ended.
    """
    holder = yield "lease_holder", {"id": lease.job_id, "token": lease.token}
    if not holder:
        return None
    root_id = holder[0]["root_id"]
    children = [dataclasses.replace(j, parent_id=lease.job_id, root_id=root_id) for j in jobs]
    if not children:
        return []
    submitted = yield from dialect.submit(children)
    new = [(lease.job_id, None, s.job.status) for s in submitted if s.created]
    yield from count_moves(moves_of(new))
    for kind, job in (callbacks or {}).items():
        params = {"job_id": lease.job_id, "kind": kind, "job": callback_definition(job)}
        yield "upsert_callback", params
    return submitted


def job_event(dialect: Dialect, row: Row) -> JobEvent:
    """Read a row of conveyor_job_events."""
    return JobEvent(
        job_id=row["job_id"],
        at=_time(dialect, row["at"], f"time of event {row['id']}"),
        event=row["event"],
        detail=row["detail"],
    )


# -- schedules -------------------------------------------------------------------------


def sync_schedules(dialect: Dialect, schedules: Sequence[Schedule]) -> Script[None]:
    """Create or update schedules declared in code (a changed cron restarts its ticks)."""
    if not schedules:
        return
    moment = yield from now(dialect)
    for s in schedules:
        yield "upsert_schedule", schedule_params(s) | {"next_run_at": s.cron.next_after(moment)}


def fire_schedules(dialect: Dialect, limit: int, min_grace: float = 0.0) -> Script[list[str]]:
    """Fire due ticks: advance each schedule by compare-and-set, then insert its jobs.

    A tick at most ``min_grace`` seconds late is on time whatever the schedule's grace.
    Under ``overlap="skip"`` a tick is skipped (the schedule still advances past it) while
    the run of the last fired tick is unfinished; that run's id comes from the schedule's
    name and ``last_run_at``, so finding it is one primary-key lookup.
    """
    created: list[str] = []
    for row in (yield "due_schedules", {"limit": limit}):
        info = schedule_info(dialect, row)
        moment = _time(dialect, row["read_at"], "time")
        firing = plan_schedule(
            info.schedule, next_run_at=info.next_run_at, now=moment, min_grace=min_grace
        )
        ticks, skipped = firing.ticks, 0
        if info.schedule.overlap is not Overlap.ALLOW and ticks:
            previous = yield from _last_run_status(info)
            ticks, skipped = without_overlap(ticks, info.schedule.overlap, previous)
        moved = yield (
            "advance_schedule",
            {
                "name": info.schedule.name,
                "expected": row["next_run_at"],
                "next_run_at": firing.next_run_at,
                "last_run_at": ticks[-1] if ticks else row["last_run_at"],
                "skipped": skipped,
            },
        )
        if not moved:
            continue  # another worker fired these ticks
        if skipped:
            log.debug(
                "schedule %r skipped %d tick(s): its last run is unfinished (overlap=skip)",
                info.schedule.name,
                skipped,
            )
        jobs = [schedule_job(info.schedule, tick) for tick in ticks]
        if jobs:
            submitted = yield from dialect.submit(jobs)
            created.extend(s.job.id for s in submitted if s.created)
    return created


def _last_run_status(info: ScheduleInfo) -> Script[Status | None]:
    """The status of the job fired for a schedule's last tick (None: none, or pruned)."""
    if info.last_run_at is None:
        return None
    job_id = tick_id(info.schedule.name, info.last_run_at)
    rows = yield "schedule_run_status", {"id": job_id}
    return Status(rows[0]["status"]) if rows else None


def set_schedule_enabled(dialect: Dialect, name: str, enabled: bool) -> Script[ScheduleInfo | None]:
    """Enable or disable a schedule; re-enabling restarts its ticks from now."""
    rows = yield "get_schedule", {"name": name}
    if not rows:
        return None
    upcoming = Cron(rows[0]["cron"], rows[0]["timezone"]).next_after((yield from now(dialect)))
    params = {"name": name, "enabled": enabled, "next_run_at": upcoming}
    (row,) = yield "set_schedule_enabled", params
    return schedule_info(dialect, row)


def run_schedule(dialect: Dialect, name: str) -> Script[Job | None]:
    """Submit a schedule's job now, outside its ticks."""
    rows = yield "get_schedule", {"name": name}
    if not rows:
        return None
    moment = yield from now(dialect)
    job = schedule_job(schedule_info(dialect, rows[0]).schedule, moment, manual=True)
    (submitted,) = yield from dialect.submit([job])
    return submitted.job


def schedules(dialect: Dialect) -> Script[list[ScheduleInfo]]:
    """Return every schedule."""
    return [schedule_info(dialect, row) for row in (yield "schedules", {})]


# -- named leases ------------------------------------------------------------------------


def acquire_lease(dialect: Dialect, name: str, owner: str, ttl: float) -> Script[LeaseRecord]:
    """Take a named lease with a new token, or return its current holder unchanged."""
    before = yield "get_lease", {"name": name}
    taken = yield "take_lease", {"name": name, "owner": owner, "ttl": float(ttl)}
    if not taken:
        # Held by someone else; read it again in case it was created meanwhile.
        (current,) = yield "current_lease", {"name": name}
        return lease_record(dialect, current)
    if before and before[0]["owner"] is not None:
        yield from _record_lease_end(before[0], before[0]["expires_at"], "expired")
    return lease_record(dialect, taken[0])


def renew_lease(dialect: Dialect, name: str, token: int, ttl: float) -> Script[datetime | None]:
    """Extend a held lease; None when the token no longer holds it."""
    rows = yield "renew_lease", {"name": name, "token": token, "ttl": float(ttl)}
    return dialect.time(rows[0]["expires_at"]) if rows else None


def release_lease(name: str, token: int) -> Script[bool]:
    """Give a lease up, keeping its holder in the history; False if the token lost it."""
    before = yield "get_lease", {"name": name}
    released = yield "release_lease", {"name": name, "token": token}
    if not released or not before:
        return False
    held, moment = before[0], released[0]["released_at"]
    expired = held["expires_at"] is not None and held["expires_at"] <= moment
    ended_at = held["expires_at"] if expired else moment
    yield from _record_lease_end(held, ended_at, "expired" if expired else "released")
    return not expired


def _record_lease_end(row: Row, ended_at: Any, how: str) -> Script[None]:
    """Keep a past holder of a named lease, and only the last few."""
    yield (
        "record_lease_end",
        {
            "name": row["name"],
            "token": row["token"],
            "owner": row["owner"],
            "acquired_at": row["acquired_at"],
            "ended_at": ended_at,
            "ended": how,
        },
    )
    yield "trim_lease_history", {"name": row["name"]}


def lease_history(dialect: Dialect, name: str) -> Script[list[LeaseRecord]]:
    """Return the last holders of a lease, newest first."""
    current = yield "current_lease", {"name": name}
    past = [past_lease(dialect, r) for r in (yield "lease_history", {"name": name})]
    if current and current[0]["owner"] is not None:
        return [lease_record(dialect, current[0]), *past]
    return past


# -- retention ---------------------------------------------------------------------------


def prune(retention: Retention, limit: int) -> Script[int]:
    """Delete up to ``limit`` finished trees older than their retention; return jobs deleted."""
    roots: list[str] = []
    overridden = sorted(retention.per_type)
    for status in ("succeeded", "failed", "cancelled"):
        for job_type in [None, *overridden]:
            if len(roots) >= limit:
                break
            rows = yield (
                "prunable_roots",
                {
                    "status": status,
                    "keep": min(retention.seconds(status, job_type), FOREVER),
                    "type": job_type,
                    "excluded_types": overridden if job_type is None else [],
                    "limit": limit - len(roots),
                },
            )
            roots.extend(r["id"] for r in rows)
    if not roots:
        return 0
    for name in ("prune_attempts", "prune_dependencies", "prune_counts", "prune_callbacks"):
        yield name, {"roots": roots}
    yield "prune_events", {"roots": roots}
    return len((yield "prune_trees", {"roots": roots}))


# -- limited claims ----------------------------------------------------------------------


def claim_limited(
    params: dict[str, Any], limits: Limits, *, fair: bool = False
) -> Script[list[Any]]:
    """Claim within concurrency and rate limits, tenant by tenant in turn when ``fair``
    (store/_fairness.py); return the rows claimed.

    The counts read here are exact because no other claim of a limited type (or tenant)
    runs meanwhile: SQLite's write lock serialises every claim; PostgreSQL takes an
    advisory lock per type without waiting, and leaves a type another worker holds to
    that worker.
    """
    capacity = FlowCapacity.start(limits)
    # -- fairness: which tenants have queued jobs, and the limits of those that have one
    tenants: list[str] = []
    if fair or limits.tenants:
        rows = yield "queued_tenants", {"limit": fairness.MOST_TENANTS}
        tenants = [r["tenant"] for r in rows]
    per_tenant = fairness.limits_of(tenants, limits.tenants)
    tenant_keys = {fairness.tenant_key(t) for t in per_tenant}
    # -- end of fairness
    shared = sorted(set(limits.cluster) | set(limits.per_key) | set(limits.rate) | tenant_keys)
    locked: set[str] = set(shared)
    if shared:
        locked = {r["type"] for r in (yield "lock_limited_types", {"types": shared})}
        capacity.blocked_types.update(t for t in shared if t not in locked)
    tenant_caps = None
    if per_tenant:
        tenant_caps = yield from fairness.tenant_capacity(per_tenant)
        tenant_caps.blocked_types.update(k for k in tenant_keys if k not in locked)
    if limits.cluster:
        rows = yield "running_per_type", {"types": list(limits.cluster)}
        capacity.count_running({r["type"]: int(r["n"]) for r in rows})
    if limits.per_key:
        rows = yield "running_per_key", {"types": list(limits.per_key)}
        capacity.count_keys({(r["type"], r["concurrency_key"]): int(r["n"]) for r in rows})
    for job_type, (_count, window) in limits.rate.items():
        window_params = {"type": job_type, "window": float(window)}
        yield "forget_rate_window", window_params
        (used,) = yield "rate_window_count", window_params
        capacity.count_rate(job_type, int(used["n"]))
    if fair:
        chosen = yield from fairness.admit_fair(params, tenants, capacity, tenant_caps)
    else:
        chosen = yield from _admit(params, capacity, tenant_caps)
    if not chosen:
        return []
    claimed = yield "claim_ids", params | {"ids": [r["id"] for r in chosen]}
    rated = [r["type"] for r in chosen if r["type"] in limits.rate]
    rated += [
        fairness.tenant_key(r["tenant"])
        for r in chosen
        if r["tenant"] in per_tenant and per_tenant[r["tenant"]].rate
    ]
    if rated:
        yield "record_rate_starts", {"types": rated}
    return claimed


def _admit(
    params: dict[str, Any], capacity: FlowCapacity, tenant_caps: FlowCapacity | None
) -> Script[list[Any]]:
    """Choose due jobs in claim order that fit the capacity; return their rows."""
    taken: list[str] = []
    chosen: list[Any] = []
    for _ in range(_CLAIM_ROUNDS):
        want = params["limit"] - len(taken)
        # A type at its limit is left out of the claim's ranges, not filtered from them.
        types = [t for t in params["types"] if t not in capacity.blocked_types]
        if not types:
            break
        rows = yield (
            "claim_candidates",
            params
            | {
                "limit": want,
                "types": types,
                "blocked_keys": sorted(f"{t}\x1f{k}" for t, k in capacity.blocked_keys),
                "taken": list(taken),
            },
        )
        blocked = len(capacity.blocked_types) + len(capacity.blocked_keys)
        before = len(taken)
        for r in rows:
            if fairness.fits(r, capacity, tenant_caps):
                taken.append(r["id"])
                chosen.append(r)
        if len(rows) < want or len(taken) >= params["limit"]:
            break
        if len(taken) == before and blocked == len(capacity.blocked_types) + len(
            capacity.blocked_keys
        ):
            break  # nothing fitted and nothing new is left out: another round finds the same
    return chosen


# -- the dashboard's rows ---------------------------------------------------------------------


def audit_params(entry: AuditEntry) -> dict[str, Any]:
    """Return record_audit's parameters (the time as a datetime)."""
    return {
        "at": entry.at,
        "tenant": entry.tenant,
        "token_id": entry.token_id,
        "action": entry.action,
        "target": entry.target,
        "detail": entry.detail,
    }


def audit_entry(dialect: Dialect, row: Row) -> AuditEntry:
    """Read a row of conveyor_audit."""
    return AuditEntry(
        at=_time(dialect, row["at"], f"time of audit entry {row['id']}"),
        tenant=row["tenant"],
        token_id=row["token_id"],
        action=row["action"],
        target=row["target"],
        detail=row["detail"],
        id=int(row["id"]),
    )


def minute_stats(dialect: Dialect, row: Row) -> MinuteStats:
    """Read a row of the minute_stats query."""
    wait = row["wait"]
    return MinuteStats(
        minute=_time(dialect, row["minute"], "minute of minute_stats"),
        succeeded=int(row["succeeded"]),
        failed=int(row["failed"]),
        wait_seconds=None if wait is None else float(wait),
    )
