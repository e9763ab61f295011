"""Fair claiming across tenants, and the operator's per-tenant limits: the claim's one
piece that knows of tenants, kept apart from the rest of the claim (store/scripts/claim.py).

Priority orders jobs within a tenant, not across tenants: when jobs of two or more
tenants are queued, a claim takes each tenant's next job in turn (the first pick rotates
at random), so a tenant with 10,000 jobs at priority -1,000,000 takes its share of each
claim and the others theirs. Jobs without a tenant (the operator's: cron, Python) are
one more turn, taken in the plain claim order. With jobs of one tenant or of none, the
claim is the plain one; whether two or more tenants have queued jobs is read at most
once a second per store (:class:`TenantMix`): a cheap loose scan of an index that jobs
without a tenant are not in.

Per-tenant concurrency and rate limits ride on the flow-control bookkeeping of job types
(core/flow.py), under a name no job type can have: ``"\\x1etenant:" + tenant``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.core.flow import FlowCapacity, TenantLimit

Step = tuple[str, dict[str, Any]]
Script = Generator[Step, list[Any], Any]

# How long a store trusts its last look at which tenants have queued jobs.
MIX_SECONDS = 1.0
# The most tenants one claim reads candidates of.
MOST_TENANTS = 1000
_KEY = "\x1etenant:"


def tenant_key(tenant: str) -> str:
    """The flow-control name of a tenant's limits (never a job type's name)."""
    return _KEY + tenant


class TenantMix:
    """Whether jobs of two or more tenants are queued, as last read (at most once a second)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._read_at: float | None = None
        self.mixed = False

    def stale(self) -> bool:
        """Whether it is time to read it again (then :meth:`saw` what was read)."""
        return self._read_at is None or self._clock() - self._read_at >= MIX_SECONDS

    def saw(self, rows: Sequence[Any]) -> bool:
        """Record the rows of ``queued_tenants`` (limit 2); return whether they are two."""
        self._read_at = self._clock()
        self.mixed = len(rows) >= 2
        return self.mixed


def limits_of(tenants: Iterable[str], limits: Mapping[str, TenantLimit]) -> dict[str, TenantLimit]:
    """Each tenant's limit: its own, else the ``"*"`` one, else none."""
    default = limits.get("*")
    out = {}
    for tenant in tenants:
        limit = limits.get(tenant, default)
        if limit is not None and (limit.concurrency is not None or limit.rate is not None):
            out[tenant] = limit
    return out


@dataclass(frozen=True)
class _TenantFlow:
    """Tenants' limits as the flow-control bookkeeping reads a job type's."""

    cluster: Mapping[str, int]
    rate: Mapping[str, tuple[int, float]]
    local: Mapping[str, int] = field(default_factory=dict)
    per_key: Mapping[str, int] = field(default_factory=dict)


def tenant_capacity(limits: Mapping[str, TenantLimit]) -> Script:
    """Count the running jobs and the starts in each rate window of limited tenants; return
    their :class:`FlowCapacity` (under :func:`tenant_key` names). The caller holds the locks.
    """

    capacity = FlowCapacity.start(
        _TenantFlow(
            cluster={tenant_key(t): n.concurrency for t, n in limits.items() if n.concurrency},
            rate={tenant_key(t): n.rate for t, n in limits.items() if n.rate},
        )
    )
    concurrent = [t for t, lim in limits.items() if lim.concurrency]
    if concurrent:
        rows = yield "running_per_tenant", {"tenants": concurrent}
        capacity.count_running({tenant_key(r["tenant"]): int(r["n"]) for r in rows})
    for tenant, limit in limits.items():
        if limit.rate:
            window = {"type": tenant_key(tenant), "window": float(limit.rate[1])}
            yield "forget_rate_window", window
            (used,) = yield "rate_window_count", window
            capacity.count_rate(tenant_key(tenant), int(used["n"]))
    return capacity


def fits(row: Any, types: FlowCapacity, tenants: FlowCapacity | None) -> bool:
    """Take a candidate's slot if both its type and its tenant have room."""
    tenant = row["tenant"]
    key = tenant_key(tenant) if tenant is not None and tenants is not None else None
    if key is not None and tenants is not None and key in tenants.blocked_types:
        return False
    if not types.take(row["type"], row["concurrency_key"]):
        return False
    if key is not None and tenants is not None:
        tenants.take(key, None)
    return True


def admit_fair(
    params: dict[str, Any],
    tenants: Sequence[str],
    types: FlowCapacity,
    tenant_caps: FlowCapacity | None,
) -> Script:
    """Choose due jobs tenant by tenant in turn; return their candidate rows.

    Each tenant's candidates are its first due jobs in claim order (``tenant_candidates``,
    on conveyor_jobs_tenant_claim); the jobs without a tenant are those of the plain claim
    order's head. A tenant's turn takes its next candidate that fits the limits.
    """
    want = params["limit"]
    rows = yield "tenant_candidates", params | {"tenants": list(tenants), "limit": want}
    head = yield (
        "claim_candidates",
        params | {"blocked_keys": [], "taken": [], "limit": want},
    )
    queues: dict[str | None, list[Any]] = {}
    for r in [*rows, *(r for r in head if r["tenant"] is None)]:
        queues.setdefault(r["tenant"], []).append(r)
    order = list(queues)
    random.shuffle(order)
    taken: list[Any] = []
    cursors = dict.fromkeys(order, 0)
    while len(taken) < want and order:
        for tenant in list(order):
            candidates, i = queues[tenant], cursors[tenant]
            while i < len(candidates) and not fits(candidates[i], types, tenant_caps):
                i += 1
            if i >= len(candidates):
                order.remove(tenant)
                continue
            taken.append(candidates[i])
            cursors[tenant] = i + 1
            if len(taken) >= want:
                break
    return taken
