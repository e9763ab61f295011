"""Scripts of job trees and dependencies: counts kept per parent, parents decided from
their children, settling carried on to parents and dependents, cancelling.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from conveyor.core.lifecycle import (
    Event,
    Status,
    children_error,
    children_event,
    dependency_event,
    returned_event,
    transition,
)
from conveyor.core.model import (
    Job,
    Settlement,
    TreeCounts,
)
from conveyor.store.scripts.base import Dialect, Ended, Row, Script
from conveyor.store.scripts.callbacks import fire_callbacks

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


def decide_from_children(
    dialect: Dialect, settlements: Sequence[Settlement]
) -> Script[list[Settlement]]:
    """Decide what jobs with children become now that their handlers stopped.

    A return waits for the jobs below, or succeeds or fails from them. A cancel ends the
    job cancelled at once only if nothing below it is unfinished; otherwise what is below
    is asked to stop (a cancel the handler raised itself is recorded as asked for), and
    the job waits, to end cancelled, with its callbacks and every job below it counted,
    once the last of them has ended, as a waiting parent asked to stop does.
    """
    for s in settlements:
        if s.status is Status.CANCELLED:
            yield from _stop_below(dialect, s)
    counts = yield from lock_counts([s.job_id for s in settlements])
    decided = []
    for s in settlements:
        below = counts.get(s.job_id, {})
        if s.status is Status.CANCELLED:
            if children_event(below) is None:
                waiting = transition(Status.RUNNING, Event.AWAIT_CHILDREN)
                decided.append(dataclasses.replace(s, status=waiting))
            else:
                decided.append(s)
            continue
        status = transition(Status.RUNNING, returned_event(below))
        error = children_error(below) if status is Status.FAILED else s.error
        decided.append(dataclasses.replace(s, status=status, error=error))
    return decided


def _stop_below(dialect: Dialect, cancelled: Settlement) -> Script[None]:
    """Ask what runs below a job whose handler ended cancelled to stop, and record the
    cancel as asked for, so the job ends cancelled when the last of them has ended."""
    rows = yield "get", {"id": cancelled.job_id}
    if rows and not rows[0]["cancel_requested"]:
        reason = cancelled.error or "cancelled by its handler"
        yield "request_cancel", {"id": cancelled.job_id, "reason": reason}
    yield from _cancel_below(dialect, cancelled.job_id, waiting=False)


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
