"""The dashboard's rows: audit entries and per-minute statistics."""

from __future__ import annotations

from typing import Any

from conveyor.store.protocol import (
    AuditEntry,
    MinuteStats,
)
from conveyor.store.scripts.base import Dialect, Row, _time

# -- the dashboard's rows ---------------------------------------------------------------------


def audit_params(entry: AuditEntry) -> dict[str, Any]:
    """Return record_audit's parameters (the time as a datetime)."""
    return {
        "at": entry.at,
        "tenant": entry.tenant,
        "token_id": entry.token_id,
        "action": entry.action,
        "target": entry.target,
        "detail": entry.detail,
    }


def audit_entry(dialect: Dialect, row: Row) -> AuditEntry:
    """Read a row of conveyor_audit."""
    return AuditEntry(
        at=_time(dialect, row["at"], f"time of audit entry {row['id']}"),
        tenant=row["tenant"],
        token_id=row["token_id"],
        action=row["action"],
        target=row["target"],
        detail=row["detail"],
        id=int(row["id"]),
    )


def minute_stats(dialect: Dialect, row: Row) -> MinuteStats:
    """Read a row of the minute_stats query."""
    wait = row["wait"]
    return MinuteStats(
        minute=_time(dialect, row["minute"], "minute of minute_stats"),
        succeeded=int(row["succeeded"]),
        failed=int(row["failed"]),
        wait_seconds=None if wait is None else float(wait),
    )
