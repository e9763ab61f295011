"""How healthy a cluster is, decided from counts the store reports (no I/O here).

Each worker is judged by its own lease: it is *live* while its newest heartbeat is
younger than its lease, and *dead* once it has been silent for longer (killed, frozen,
cut off from the database), since by then every lease it held has expired. A worker that
stopped cleanly is neither.

``unhealthy`` when workers have run on this database but none is live now; ``degraded``
when no worker has ever run, when some workers are dead, or when running jobs hold
expired leases not yet rescued; ``healthy`` otherwise. :func:`explain` says why, and what
to do, wherever the verdict is shown.

>>> assess(workers=0, live_workers=0, dead_workers=0, stale_running=0)
'degraded'
>>> assess(workers=2, live_workers=0, dead_workers=2, stale_running=0)
'unhealthy'
>>> assess(workers=3, live_workers=2, dead_workers=1, stale_running=0)
'degraded'
>>> assess(workers=2, live_workers=2, dead_workers=0, stale_running=0)
'healthy'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

HEALTHY = "healthy"
DEGRADED = "degraded"
UNHEALTHY = "unhealthy"

NO_WORKER_EVER = "no worker has heartbeated on this database"


def assess(*, workers: int, live_workers: int, dead_workers: int, stale_running: int) -> str:
    """Return ``healthy``, ``degraded`` or ``unhealthy``.

    ``workers`` counts workers ever registered, ``live_workers`` those heartbeating within
    their lease, ``dead_workers`` those not stopped but silent for longer than their lease.
    """
    if workers and not live_workers:
        return UNHEALTHY
    if not workers or dead_workers or stale_running:
        return DEGRADED
    return HEALTHY


def explain(
    *,
    workers: int,
    live_workers: int,
    dead_workers: int,
    stale_running: int,
    heartbeat_age: float | None,
    app: str | None = None,
) -> str | None:
    """Say why the verdict is not ``healthy``, and what to do (None when it is).

    >>> explain(workers=1, live_workers=0, dead_workers=0, stale_running=0, heartbeat_age=95.0)
    'no live worker: the last heartbeat was 95s ago — start one with `conveyor worker APP`'
    >>> print(explain(workers=3, live_workers=2, dead_workers=1, stale_running=0,
    ...               heartbeat_age=1.0))  # doctest: +NORMALIZE_WHITESPACE
    1 worker stopped heartbeating without stopping cleanly (killed, frozen or cut off from
    the database): its jobs are rescued when their leases expire; look at its host (the
    Workers page) and restart it
    >>> explain(workers=2, live_workers=2, dead_workers=0, stale_running=0, heartbeat_age=1.0)
    """
    verdict = assess(
        workers=workers,
        live_workers=live_workers,
        dead_workers=dead_workers,
        stale_running=stale_running,
    )
    if verdict == HEALTHY:
        return None
    if not live_workers:
        return no_live_worker(workers=workers, heartbeat_age=heartbeat_age, app=app)
    reasons = []
    if dead_workers:
        one = dead_workers == 1
        reasons.append(
            f"{dead_workers} worker{'' if one else 's'} stopped heartbeating without stopping "
            "cleanly (killed, frozen or cut off from the database): "
            f"{'its' if one else 'their'} jobs are rescued when their leases expire; look at "
            f"{'its host' if one else 'their hosts'} (the Workers page) and restart "
            f"{'it' if one else 'them'}"
        )
    if stale_running:
        # No count: a tenant's token reads this too, and the jobs may be other tenants'.
        reasons.append(
            "running jobs hold expired leases not yet rescued: a live worker's rescue duty "
            "requeues them within its rescue interval"
        )
    return "; ".join(reasons)


def no_live_worker(*, workers: int, heartbeat_age: float | None, app: str | None = None) -> str:
    """Say that no worker will run a queued job, and how to start one.

    >>> no_live_worker(workers=0, heartbeat_age=None)
    'no worker has heartbeated on this database — start one with `conveyor worker APP`'
    >>> no_live_worker(workers=1, heartbeat_age=95.0, app="jobs:app")
    'no live worker: the last heartbeat was 95s ago — start one with `conveyor worker jobs:app`'
    """
    start = f"start one with `conveyor worker {app or 'APP'}`"
    if not workers or heartbeat_age is None:
        return f"{NO_WORKER_EVER} — {start}"
    return f"no live worker: the last heartbeat was {heartbeat_age:.0f}s ago — {start}"


def unserved_queues(
    queued: Mapping[str, int], live_queues: Iterable[Iterable[str]], paused: Iterable[str] = ()
) -> dict[str, int]:
    """The queues holding queued jobs that no live worker serves, with their numbers of
    queued jobs (a paused queue is left out: its jobs wait on purpose). Only when some
    worker is live: with none, the verdict's hint already says to start one.

    >>> unserved_queues({"default": 3, "held": 2, "idle": 0}, [("default",)])
    {'held': 2}
    >>> unserved_queues({"held": 2}, [])
    {}
    """
    served: set[str] = set()
    live = False
    for queues in live_queues:
        live = True
        served.update(queues)
    if not live:
        return {}
    skip = set(paused)
    return {q: n for q, n in sorted(queued.items()) if n and q not in served and q not in skip}


def type_not_served(job_type: str, queued: int) -> str:
    """Say that jobs of a type no live worker has a handler for wait, and what to do.

    >>> print(type_not_served("build_report", 3))  # doctest: +NORMALIZE_WHITESPACE
    3 jobs waiting for type 'build_report', which no live worker serves: start a worker
    whose application has its handler (a rolling deploy not finished?)
    """
    what = f"{queued} job{'' if queued == 1 else 's'}"
    return (
        f"{what} waiting for type {job_type!r}, which no live worker serves: start a worker "
        "whose application has its handler (a rolling deploy not finished?)"
    )


def queue_not_served(queue: str, what: str) -> str:
    """Say that ``what`` (``"2 jobs"``, ``"this job"``) sits in a queue no live worker
    serves, and what to do.

    >>> print(queue_not_served("held", "2 jobs"))  # doctest: +NORMALIZE_WHITESPACE
    2 jobs queued in queue 'held', which no live worker serves: start a worker with
    `--queues held` (or submit to a queue one serves)
    """
    return (
        f"{what} queued in queue {queue!r}, which no live worker serves: start a worker "
        f"with `--queues {queue}` (or submit to a queue one serves)"
    )
