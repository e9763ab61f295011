"""How healthy a cluster is, decided from counts the store reports (no I/O here).

``degraded`` when no worker has ever started or running jobs hold expired leases,
``unhealthy`` when the newest worker heartbeat is stale, ``healthy`` otherwise.

>>> assess(workers=0, stale_running=0, heartbeat_age=None, stale_after=60)
'degraded'
>>> assess(workers=2, stale_running=0, heartbeat_age=500.0, stale_after=60)
'unhealthy'
>>> assess(workers=2, stale_running=0, heartbeat_age=3.0, stale_after=60)
'healthy'
"""

from __future__ import annotations

HEALTHY = "healthy"
DEGRADED = "degraded"
UNHEALTHY = "unhealthy"


def assess(
    *, workers: int, stale_running: int, heartbeat_age: float | None, stale_after: float
) -> str:
    """Return ``healthy``, ``degraded`` or ``unhealthy``.

    ``workers`` counts workers ever registered, ``heartbeat_age`` is the age in seconds
    of the newest worker heartbeat (None when there is none).
    """
    if workers and heartbeat_age is not None and heartbeat_age > stale_after:
        return UNHEALTHY
    if not workers or stale_running:
        return DEGRADED
    return HEALTHY
