"""Scripts of retention: the ended jobs pruned once kept long enough."""

from __future__ import annotations

from conveyor.store.protocol import (
    Retention,
)
from conveyor.store.scripts.base import Script

# A retention longer than this (about 95 years) keeps jobs forever; PostgreSQL's
# intervals cannot hold an infinite one.
FOREVER = 3e9


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
