"""Scripts of limited claims: claiming within the concurrency and rate limits, fairly
across tenants.
"""

from __future__ import annotations

from typing import Any

from conveyor.core.flow import FlowCapacity
from conveyor.store import _fairness as fairness
from conveyor.store.protocol import (
    Limits,
)
from conveyor.store.scripts.base import Script

# How many claim_candidates rounds a limited claim makes: each round blocks at least one
# more type or key, so a few rounds fill a claim unless nearly everything is limited.
_CLAIM_ROUNDS = 8


# -- limited claims ----------------------------------------------------------------------


def claim_limited(
    params: dict[str, Any], limits: Limits, *, fair: bool = False
) -> Script[list[Any]]:
    """Claim within concurrency and rate limits, tenant by tenant in turn when ``fair``
    (store/_fairness.py); return the rows claimed.

    The counts read here are exact because no other claim of a limited type (or tenant)
    runs meanwhile: SQLite's write lock serialises every claim; PostgreSQL takes an
    advisory lock per type without waiting, and leaves a type another worker holds to
    that worker.
    """
    capacity = FlowCapacity.start(limits)
    # -- fairness: which tenants have queued jobs, and the limits of those that have one
    tenants: list[str] = []
    if fair or limits.tenants:
        rows = yield "queued_tenants", {"limit": fairness.MOST_TENANTS}
        tenants = [r["tenant"] for r in rows]
    per_tenant = fairness.limits_of(tenants, limits.tenants)
    tenant_keys = {fairness.tenant_key(t) for t in per_tenant}
    # -- end of fairness
    shared = sorted(set(limits.cluster) | set(limits.per_key) | set(limits.rate) | tenant_keys)
    locked: set[str] = set(shared)
    if shared:
        locked = {r["type"] for r in (yield "lock_limited_types", {"types": shared})}
        capacity.blocked_types.update(t for t in shared if t not in locked)
    tenant_caps = None
    if per_tenant:
        tenant_caps = yield from fairness.tenant_capacity(per_tenant)
        tenant_caps.blocked_types.update(k for k in tenant_keys if k not in locked)
    if limits.cluster:
        rows = yield "running_per_type", {"types": list(limits.cluster)}
        capacity.count_running({r["type"]: int(r["n"]) for r in rows})
    if limits.per_key:
        rows = yield "running_per_key", {"types": list(limits.per_key)}
        capacity.count_keys({(r["type"], r["concurrency_key"]): int(r["n"]) for r in rows})
    for job_type, (_count, window) in limits.rate.items():
        window_params = {"type": job_type, "window": float(window)}
        yield "forget_rate_window", window_params
        (used,) = yield "rate_window_count", window_params
        capacity.count_rate(job_type, int(used["n"]))
    if fair:
        chosen = yield from fairness.admit_fair(params, tenants, capacity, tenant_caps)
    else:
        chosen = yield from _admit(params, capacity, tenant_caps)
    if not chosen:
        return []
    claimed = yield "claim_ids", params | {"ids": [r["id"] for r in chosen]}
    rated = [r["type"] for r in chosen if r["type"] in limits.rate]
    rated += [
        fairness.tenant_key(r["tenant"])
        for r in chosen
        if r["tenant"] in per_tenant and per_tenant[r["tenant"]].rate
    ]
    if rated:
        yield "record_rate_starts", {"types": rated}
    return claimed


def _admit(
    params: dict[str, Any], capacity: FlowCapacity, tenant_caps: FlowCapacity | None
) -> Script[list[Any]]:
    """Choose due jobs in claim order that fit the capacity; return their rows."""
    taken: list[str] = []
    chosen: list[Any] = []
    for _ in range(_CLAIM_ROUNDS):
        want = params["limit"] - len(taken)
        # A type at its limit is left out of the claim's ranges, not filtered from them.
        types = [t for t in params["types"] if t not in capacity.blocked_types]
        if not types:
            break
        rows = yield (
            "claim_candidates",
            params
            | {
                "limit": want,
                "types": types,
                "blocked_keys": sorted(f"{t}\x1f{k}" for t, k in capacity.blocked_keys),
                "taken": list(taken),
            },
        )
        blocked = len(capacity.blocked_types) + len(capacity.blocked_keys)
        before = len(taken)
        for r in rows:
            if fairness.fits(r, capacity, tenant_caps):
                taken.append(r["id"])
                chosen.append(r)
        if len(rows) < want or len(taken) >= params["limit"]:
            break
        if len(taken) == before and blocked == len(capacity.blocked_types) + len(
            capacity.blocked_keys
        ):
            break  # nothing fitted and nothing new is left out: another round finds the same
    return chosen
