"""How healthy a cluster is, decided from counts the store reports (no I/O here).

Each worker is judged by its own lease: it is *live* while its newest heartbeat is
younger than its lease, and *dead* once it has been silent for longer (killed, frozen,
cut off from the database), since by then every lease it held has expired. A worker that
stopped cleanly is neither.

``unhealthy`` when workers have run on this database but none is live now; ``degraded``
when no worker has ever run, when some workers are dead, or when running jobs hold
expired leases not yet rescued; ``healthy`` otherwise.

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
