"""The health report of a cluster: the verdict of :mod:`conveyor.core.health` on the counts
a store reports, with the hint that says why and what to do, as the API, the CLI and the
dashboard show it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conveyor.core.health import assess, explain
from conveyor.store import HealthCounts


@dataclass(frozen=True, slots=True)
class Health:
    """The cluster's health: ``healthy``, ``degraded`` or ``unhealthy``, and its counts."""

    status: str
    counts: HealthCounts
    heartbeat_age: float | None  # seconds since the newest worker heartbeat

    @classmethod
    def of(cls, counts: HealthCounts) -> Health:
        """The verdict on the counts a store reports (``Store.health``)."""
        age = None
        if counts.last_heartbeat is not None:
            age = max(0.0, (counts.now - counts.last_heartbeat).total_seconds())
        status = assess(
            workers=counts.workers,
            live_workers=counts.live_workers,
            dead_workers=counts.dead_workers,
            stale_running=counts.stale_running,
        )
        return cls(status=status, counts=counts, heartbeat_age=age)

    @property
    def no_live_worker(self) -> bool:
        """True when no worker would run a queued job now."""
        return not self.counts.live_workers

    @property
    def hint(self) -> str | None:
        """Why the verdict is not ``healthy`` and what to do about it (None when it is)."""
        return self.explain()

    def explain(self, app: str | None = None) -> str | None:
        """:attr:`hint`, naming ``app`` (an ``APP`` spec) in a command it says to run."""
        c = self.counts
        return explain(
            workers=c.workers,
            live_workers=c.live_workers,
            dead_workers=c.dead_workers,
            stale_running=c.stale_running,
            heartbeat_age=self.heartbeat_age,
            app=app,
        )

    def to_dict(self) -> dict[str, Any]:
        """The verdict and counts, as ``GET /health/ready`` and ``conveyor status --json``
        give them."""
        c = self.counts
        return {
            "status": self.status,
            "queued": c.queued,
            "due": c.due,
            "running": c.running,
            "stale_running": c.stale_running,
            "workers": c.workers,
            "live_workers": c.live_workers,
            "dead_workers": c.dead_workers,
            "last_heartbeat": c.last_heartbeat.isoformat() if c.last_heartbeat else None,
            "heartbeat_age": self.heartbeat_age,
            "hint": self.hint,
            "error": None,
        }
