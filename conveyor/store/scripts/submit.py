"""Scripts that submit on behalf of others: retries, spawned children, and the checks a
submission passes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence

from conveyor.core.lifecycle import (
    Status,
)
from conveyor.core.model import (
    Job,
    NewJob,
)
from conveyor.errors import IdempotencyConflict, InvalidDependency, InvalidState
from conveyor.store.protocol import (
    JobEvent,
    Lease,
    Submitted,
)
from conveyor.store.scripts.base import Dialect, Row, Script, _time
from conveyor.store.scripts.callbacks import callback_definition
from conveyor.store.scripts.trees import BUCKET, Change, count_moves, lock_counts, moves_of

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
