"""Scripts of rescue: what becomes of the runs whose leases expired."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.core.lifecycle import (
    Status,
)
from conveyor.core.model import (
    Outcome,
    Settlement,
    after_failure,
)
from conveyor.store.protocol import (
    Rescued,
)
from conveyor.store.scripts.base import Row

# -- rescue ------------------------------------------------------------------------------


def rescue_decisions(rows: Sequence[Row], jitter: float) -> list[Settlement]:
    """Decide what becomes of jobs whose lease expired: each attempt ends as ``lost``.

    A job whose cancel was asked for ends cancelled (its cancel reason kept), never runs
    again: the request outlives the worker that was to act on it.
    """
    return [
        Settlement(
            job_id=r["id"],
            token=r["lease_token"],
            status=Status.CANCELLED,
            outcome=Outcome.LOST,
            error=f"lease expired: worker {r['lease_owner']} stopped heartbeating",
        )
        if r["cancel_requested"]
        else after_failure(
            job_id=r["id"],
            token=r["lease_token"],
            attempt=r["attempt"],
            max_attempts=r["max_attempts"],
            outcome=Outcome.LOST,
            error=f"lease expired: worker {r['lease_owner']} stopped heartbeating",
            backoff_base=r["backoff_base"],
            backoff_cap=r["backoff_cap"],
            jitter=jitter,
        )
        for r in rows
    ]


def rescued(
    rows: Sequence[Row], decisions: Sequence[Settlement], refused: Sequence[str]
) -> list[Rescued]:
    """Report the rescues the settle accepted."""
    owners = {r["id"]: r["lease_owner"] for r in rows}
    skip = set(refused)
    return [
        Rescued(job_id=d.job_id, worker_id=owners[d.job_id], status=d.status)
        for d in decisions
        if d.job_id not in skip
    ]
