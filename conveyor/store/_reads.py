"""Reads that are one named query and a row decoder on every backend, written once.

Each backend inherits them and supplies ``_fetch`` (run a named read, return its rows)
and ``_time_param`` (a time as its driver takes it; ``None`` for the store's now).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conveyor.core.auth import Token
from conveyor.store import scripts
from conveyor.store.protocol import (
    AuditEntry,
    HealthCounts,
    JobEvent,
    MinuteStats,
    QueueInfo,
    QueueLag,
    UnservedType,
    WorkerInfo,
)
from conveyor.store.scripts import Dialect


class SharedReads(ABC):
    """The store operations whose only difference between dialects is the codec."""

    dialect: Dialect

    @abstractmethod
    async def _fetch(self, name: str, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Run one named read outside any transaction and return its rows."""

    @abstractmethod
    def _time_param(self, value: datetime | None) -> Any:
        """``value`` as this backend's queries take a time; ``None`` is the store's now."""

    async def find_token(self, token_id: str) -> Token | None:
        rows = await self._fetch("find_token", {"id": token_id})
        return scripts.token(self.dialect, rows[0]) if rows else None

    async def list_tokens(self) -> list[Token]:
        return [scripts.token(self.dialect, r) for r in await self._fetch("list_tokens")]

    async def server_secret(self, name: str) -> str | None:
        rows = await self._fetch("server_secret", {"name": name})
        return str(rows[0]["value"]) if rows else None

    async def queue_lag(self) -> list[QueueLag]:
        rows = await self._fetch("queue_lag", {"now": self._time_param(None)})
        return [QueueLag(r["queue"], r["due"], max(0.0, r["oldest_age"])) for r in rows]

    async def audit_log(
        self, *, tenant: str | None = None, before_id: int | None = None, limit: int = 100
    ) -> list[AuditEntry]:
        params = {"tenant": tenant, "before_id": before_id, "limit": limit}
        rows = await self._fetch("audit_log" if tenant is None else "tenant_audit_log", params)
        return [scripts.audit_entry(self.dialect, r) for r in rows]

    async def minute_stats(
        self, since: datetime, *, tenant: str | None = None
    ) -> list[MinuteStats]:
        since_param = self._time_param(since)
        if tenant is None:
            rows = await self._fetch("minute_stats", {"since": since_param})
        else:
            rows = await self._fetch(
                "tenant_minute_stats", {"since": since_param, "tenant": tenant}
            )
        return [scripts.minute_stats(self.dialect, r) for r in rows]

    async def health(self) -> HealthCounts:
        (row,) = await self._fetch("health", {"now": self._time_param(None)})
        return scripts.health_counts(self.dialect, row)

    async def unserved_types(self) -> list[UnservedType]:
        rows = await self._fetch("unserved_types", {"now": self._time_param(None)})
        return [UnservedType(r["type"], int(r["n"])) for r in rows]

    async def workers(self) -> list[WorkerInfo]:
        return [scripts.worker_info(self.dialect, r) for r in await self._fetch("workers")]

    async def queues(self, *, tenant: str | None = None) -> list[QueueInfo]:
        if tenant is not None:
            return scripts.queue_infos(await self._fetch("tenant_queues", {"tenant": tenant}))
        return scripts.queue_infos(await self._fetch("queues"))

    async def lease_names(self, *, limit: int = 200) -> list[str]:
        return [r["name"] for r in await self._fetch("lease_names", {"limit": limit})]

    async def count_queued(self, tenant: str) -> int:
        (row,) = await self._fetch("tenant_queued", {"tenant": tenant})
        return int(row["n"])

    async def running_by_worker(self, *, tenant: str | None = None) -> dict[str, int]:
        if tenant is not None:
            rows = await self._fetch("tenant_running_by_worker", {"tenant": tenant})
        else:
            rows = await self._fetch("running_by_worker")
        return {r["lease_owner"] or "": int(r["n"]) for r in rows}

    async def failed_below(self, job_id: str, *, limit: int) -> list[str]:
        rows = await self._fetch("failed_below", {"id": job_id, "limit": limit})
        return [r["id"] for r in rows]

    async def job_events(self, job_id: str) -> list[JobEvent]:
        rows = await self._fetch("job_events", {"id": job_id})
        return [scripts.job_event(self.dialect, r) for r in rows]
