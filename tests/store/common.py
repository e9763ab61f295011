"""What the store contract's modules share."""

from __future__ import annotations

from conveyor.core.model import Job
from conveyor.store import Store


async def claim(store: Store, limit: int = 10, queues: tuple[str, ...] = ("default",)) -> list[Job]:
    """Claim up to ``limit`` jobs as worker ``w1`` with a 30 s lease."""
    return await store.claim(worker_id="w1", queues=queues, limit=limit, lease=30)
