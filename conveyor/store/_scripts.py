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
from collections.abc import Callable, Collection, Generator, Mapping, Sequence
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
from conveyor.core.lifecycle import (
    Status,
    children_error,
    children_event,
    dependency_event,
    returned_event,
    transition,
)
from conveyor.core.model import JSON, Attempt, Job, NewJob, Outcome, Settlement, after_failure
from conveyor.errors import InvalidDependency, InvalidState
from conveyor.store.protocol import (
    AuditEntry,
    HealthCounts,
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
    }


def dumps(value: JSON) -> str | None:
    """Write a JSON document as compact text (None stays None)."""
    return None if value is None else json.dumps(value, separators=(",", ":"))


# -- trees and dependencies --------------------------------------------------------------


def children_counts(ids: Sequence[str]) -> Script[dict[str, dict[Status, int]]]:
    """Return how many children of each job are in each status."""
    counts: dict[str, dict[Status, int]] = {}
    for row in (yield "children_counts", {"ids": list(ids)}):
        counts.setdefault(row["parent_id"], {})[Status(row["status"])] = int(row["n"])
    return counts


def decide_from_children(settlements: Sequence[Settlement]) -> Script[list[Settlement]]:
    """Turn 'the handler returned' into waiting, succeeded or failed, from the children."""
    ids = [s.job_id for s in settlements]
    yield "lock_children", {"ids": ids}
    counts = yield from children_counts(ids)
    decided = []
    for s in settlements:
        children = counts.get(s.job_id, {})
        status = transition(Status.RUNNING, returned_event(children))
        error = children_error(children) if status is Status.FAILED else s.error
        decided.append(dataclasses.replace(s, status=status, error=error))
    return decided


def finish_parent(parent_id: str) -> Script[Ended | None]:
    """End a waiting parent whose children have all ended; return it if it ended."""
    yield "lock_children", {"ids": [parent_id]}
    counts = (yield from children_counts([parent_id])).get(parent_id, {})
    event = children_event(counts)
    if event is None:
        return None
    status = transition(Status.WAITING, event)
    error = children_error(counts) if status is Status.FAILED else None
    params = {"id": parent_id, "status": status.value, "error": error}
    rows = yield "finish_waiting", params
    return (rows[0]["id"], rows[0]["parent_id"], status) if rows else None


def cascade(
    ended: list[Ended], *, without_dependents: frozenset[str] = frozenset()
) -> Script[None]:
    """Carry jobs' ends to their waiting parents and pending dependents, transitively.

    A round at a time: each parent is decided once per round, however many of its
    children ended (its children are counted whole), and dependents are looked for
    except of ``without_dependents``, known to have none.
    """
    todo = ended
    while todo:
        round_, todo = todo, []
        for parent_id in sorted({p for _, p, _ in round_ if p is not None}):
            finished = yield from finish_parent(parent_id)
            if finished is not None:
                todo.append(finished)
        for job_id, _, status in round_:
            if job_id not in without_dependents:
                todo.extend((yield from _carry_to_dependents(job_id, status)))


def _carry_to_dependents(job_id: str, status: Status) -> Script[list[Ended]]:
    """Queue a job's pending dependents that may now run, or cancel them; return those cancelled."""
    cancelled: list[Ended] = []
    for dependent in (yield "pending_dependents", {"id": job_id}):
        if dependency_event(status) is None:
            (unmet,) = yield "unmet_dependencies", {"id": dependent["id"]}
            if unmet["n"] == 0:
                yield "release_pending", {"id": dependent["id"]}
            continue
        reason = f"dependency {job_id} {status.value}"
        rows = yield "cancel_pending", {"id": dependent["id"], "reason": reason}
        if rows:
            cancelled.append((rows[0]["id"], rows[0]["parent_id"], Status.CANCELLED))
    return cancelled


def finish_parents(limit: int) -> Script[list[str]]:
    """End waiting parents whose children have all ended; return their ids."""
    done = []
    for parent in (yield "waiting_parents", {"limit": limit}):
        finished = yield from finish_parent(parent["id"])
        if finished is not None:
            done.append(finished[0])
            yield from cascade([finished])
    return done


def cancel(dialect: Dialect, job_id: str, reason: str) -> Script[Job | None]:
    """Cancel a job now, or ask its worker to; a waiting job takes its subtree along.

    Each statement sees what committed before it: a job claimed between the first and
    the last is still asked to stop.
    """
    params = {"id": job_id, "reason": reason}
    rows = yield "cancel_unstarted", params
    if not rows:
        rows = yield "cancel_waiting", params
        if rows:
            for child in (yield "unfinished_descendants", {"id": job_id}):
                yield from _cancel_below(job_id, child)
    if rows:
        yield from cascade([(job_id, rows[0]["parent_id"], Status.CANCELLED)])
    else:
        yield "request_cancel", params
    found = yield "get", {"id": job_id}
    return dialect.job(found[0]) if found else None


def _cancel_below(job_id: str, child: Row) -> Script[None]:
    """Cancel a descendant of a cancelled parent, or ask its worker to stop it."""
    params = {"id": child["id"], "reason": f"parent {job_id} cancelled"}
    if child["status"] == Status.RUNNING.value:
        yield "request_cancel", params
        return
    yield "cancel_unstarted", params
    yield "cancel_waiting", params
    yield from cascade([(child["id"], None, Status.CANCELLED)])


# -- rescue ------------------------------------------------------------------------------


def rescue_decisions(rows: Sequence[Row], jitter: float) -> list[Settlement]:
    """Decide what becomes of jobs whose lease expired: each attempt ends as ``lost``."""
    return [
        after_failure(
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


def retry(dialect: Dialect, job_id: str, new: NewJob) -> Script[Job | None]:
    """Submit ``new`` as the retry of a failed or cancelled job."""
    rows = yield "get", {"id": job_id}
    if not rows:
        return None
    status = rows[0]["status"]
    if status not in (Status.FAILED.value, Status.CANCELLED.value):
        raise InvalidState(
            f"job {job_id} is {status}: only failed or cancelled jobs can be retried"
        )
    (submitted,) = yield from dialect.submit([new])
    return submitted.job


def spawn(dialect: Dialect, lease: Lease, jobs: Sequence[NewJob]) -> Script[list[Submitted] | None]:
    """Insert children of a leased job, fenced by its lease (None: the lease was lost)."""
    holder = yield "lease_holder", {"id": lease.job_id, "token": lease.token}
    if not holder:
        return None
    root_id = holder[0]["root_id"]
    children = [dataclasses.replace(j, parent_id=lease.job_id, root_id=root_id) for j in jobs]
    if not children:
        return []
    return (yield from dialect.submit(children))


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
    yield "prune_attempts", {"roots": roots}
    yield "prune_dependencies", {"roots": roots}
    return len((yield "prune_trees", {"roots": roots}))


# -- limited claims ----------------------------------------------------------------------


def claim_limited(params: dict[str, Any], limits: Limits) -> Script[list[Any]]:
    """Claim within concurrency and rate limits; return the rows claimed.

    The counts read here are exact because no other claim of a limited type runs
    meanwhile: SQLite's write lock serialises every claim; PostgreSQL takes an advisory
    lock per type without waiting, and leaves a type another worker holds to that worker.
    """
    capacity = FlowCapacity.start(limits)
    shared = sorted(set(limits.cluster) | set(limits.per_key) | set(limits.rate))
    if shared:
        locked = {r["type"] for r in (yield "lock_limited_types", {"types": shared})}
        capacity.blocked_types.update(t for t in shared if t not in locked)
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
    taken, taken_types = yield from _admit(params, capacity)
    if not taken:
        return []
    claimed = yield "claim_ids", params | {"ids": taken}
    rated = [t for t in taken_types if t in limits.rate]
    if rated:
        yield "record_rate_starts", {"types": rated}
    return claimed


def _admit(params: dict[str, Any], capacity: FlowCapacity) -> Script[tuple[list[str], list[str]]]:
    """Choose due jobs in claim order that fit the capacity; return their ids and types."""
    taken: list[str] = []
    taken_types: list[str] = []
    for _ in range(_CLAIM_ROUNDS):
        want = params["limit"] - len(taken)
        rows = yield (
            "claim_candidates",
            params
            | {
                "limit": want,
                "blocked_types": sorted(capacity.blocked_types),
                "blocked_keys": sorted(f"{t}\x1f{k}" for t, k in capacity.blocked_keys),
                "taken": list(taken),
            },
        )
        for r in rows:
            if capacity.take(r["type"], r["concurrency_key"]):
                taken.append(r["id"])
                taken_types.append(r["type"])
        if len(rows) < want or len(taken) >= params["limit"]:
            break
    return taken, taken_types


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
