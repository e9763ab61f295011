"""The operator's limits per tenant: how many of a tenant's jobs may run at once, start
per period, and wait in the queues.

Set in Python on the application (``app.tenants.limit("acme", concurrency=5)``) or with
``--tenant-limit acme:concurrency=5,rate=100/m,max_queued=10000`` on ``conveyor worker``
and ``conveyor serve``; ``"*"`` sets the limit of every tenant without one of its own.
Concurrency and rate are kept by each claim, on both backends (store/_fairness.py);
``max_queued`` by each submit of a tenant's jobs, which is refused beyond it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from conveyor.core.flow import TenantLimit, parse_rate, parse_tenant_limit
from conveyor.core.model import NewJob
from conveyor.errors import ConfigurationError, TooManyQueued
from conveyor.store import Store


class TenantLimits:
    """Each tenant's :class:`TenantLimit` (``"*"``: of every tenant without its own)."""

    def __init__(self) -> None:
        self._limits: dict[str, TenantLimit] = {}

    @property
    def limits(self) -> Mapping[str, TenantLimit]:
        return self._limits

    def limit(
        self,
        tenant: str,
        *,
        concurrency: int | None = None,
        rate: str | None = None,
        max_queued: int | None = None,
    ) -> TenantLimit:
        """Limit ``tenant``'s jobs: at most ``concurrency`` running across the cluster, at
        most ``rate`` starts (``"100/m"``), at most ``max_queued`` queued. None: no limit."""
        try:
            limit = TenantLimit(
                concurrency=concurrency,
                rate=None if rate is None else parse_rate(rate),
                max_queued=max_queued,
            )
        except ValueError as exc:
            raise ConfigurationError(f"tenant {tenant!r}: {exc}") from None
        self._limits[tenant] = limit
        return limit

    def parse(self, specs: Sequence[str]) -> None:
        """Apply ``TENANT:concurrency=N,rate=COUNT/PERIOD,max_queued=N`` specifications."""
        for spec in specs:
            try:
                tenant, limit = parse_tenant_limit(spec)
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
            self._limits[tenant] = limit

    def of(self, tenant: str) -> TenantLimit | None:
        return self._limits.get(tenant, self._limits.get("*"))

    async def check_room(self, store: Store, jobs: Sequence[NewJob]) -> None:
        """Refuse (:class:`TooManyQueued`) jobs that would take a tenant past its
        ``max_queued``; checked before the submit, so concurrent submits may each pass."""
        wanted = Counter(job.tenant for job in jobs if job.tenant is not None)
        for tenant, n in wanted.items():
            limit = self.of(tenant)
            if limit is None or limit.max_queued is None:
                continue
            queued = await store.count_queued(tenant)
            if queued + n > limit.max_queued:
                raise TooManyQueued(
                    f"tenant {tenant!r} has {queued} jobs queued and may have at most "
                    f"{limit.max_queued}: submit again once some have run"
                )
