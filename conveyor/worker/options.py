"""How a worker runs: :class:`WorkerOptions`, validated when built."""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.errors import ConfigurationError
from conveyor.store import Retention


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs, validated when built."""

    # Jobs at once, and the most claimed in one round trip: 100 keeps a worker of short
    # jobs from waiting on round trips (10 drained at half the rate on PostgreSQL).
    concurrency: int = 100
    queues: tuple[str, ...] | None = None  # None: the queues of the registered job types
    lease: float = 30.0
    grace: float = 30.0
    cancel_grace: float = 5.0
    poll_interval: float = 1.0
    rescue_interval: float = 5.0
    cron_interval: float = 1.0
    prune_interval: float = 60.0
    # Seconds after a worker's last heartbeat when the registry forgets it, dead or
    # stopped (a duty on the prune interval deletes it; its attempts keep its history).
    # Health counts a death only inside this window, so a killed worker stops making the
    # cluster "degraded" once it has passed.
    forget_after: float = 3600.0
    retention: Retention | None = None  # None: the defaults with the job types' overrides
    burst: bool = False
    # Whether this worker fires due schedule ticks (False: a JobTester's, whose ticks fire
    # only when the test moves time with advance()).
    fire_schedules: bool = True
    worker_id: str | None = None
    # Count attempts into the application's metrics (off only to measure what they cost).
    metrics: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.concurrency, int) or not 1 <= self.concurrency <= 10_000:
            raise ConfigurationError("concurrency must be an integer from 1 to 10000")
        if self.lease < 0.3:
            raise ConfigurationError("lease must be at least 0.3 seconds")
        for name in ("grace", "cancel_grace"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{name} must not be negative")
        for name in ("poll_interval", "rescue_interval", "cron_interval", "prune_interval"):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"{name} must be positive")
        if self.forget_after <= self.lease:
            raise ConfigurationError(
                f"forget_after ({self.forget_after:g}s) must be longer than the lease "
                f"({self.lease:g}s): a dead worker stays in the registry at least until "
                "its leases have expired and its jobs were rescued"
            )
        if self.queues is not None and not self.queues:
            raise ConfigurationError("queues, when given, must name at least one queue")
