"""Rows read into the domain's values, and the domain's values written as parameters."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from conveyor.core.auth import Role, Token
from conveyor.core.cron import (
    CatchUp,
    Cron,
    Overlap,
    Schedule,
)
from conveyor.core.jsontext import compact
from conveyor.core.model import (
    JSON,
    Attempt,
    Outcome,
)
from conveyor.store.protocol import (
    HealthCounts,
    LeaseRecord,
    QueueInfo,
    ScheduleInfo,
    WorkerInfo,
)
from conveyor.store.scripts.base import Dialect, Row, _time

# -- rows read and parameters written ---------------------------------------------------


def schedule_params(s: Schedule) -> dict[str, Any]:
    """Return a schedule's definition as upsert_schedule's parameters."""
    return {
        "name": s.name,
        "cron": s.cron.expression,
        "timezone": s.cron.timezone,
        "type": s.type,
        "payload": dumps(s.payload),
        "queue": s.queue,
        "priority": s.priority,
        "max_attempts": s.max_attempts,
        "timeout": s.timeout,
        "lease_seconds": s.lease,
        "backoff_base": s.backoff_base,
        "backoff_cap": s.backoff_cap,
        "catch_up": s.catch_up.value,
        "backfill_limit": s.backfill_limit,
        "grace": s.grace,
        "overlap": s.overlap.value,
    }


def schedule_info(dialect: Dialect, row: Row) -> ScheduleInfo:
    """Read a row of conveyor_schedules."""
    return ScheduleInfo(
        schedule=Schedule(
            name=row["name"],
            cron=Cron(row["cron"], row["timezone"]),
            type=row["type"],
            payload=dialect.json(row["payload"]),
            queue=row["queue"],
            priority=row["priority"],
            max_attempts=row["max_attempts"],
            timeout=row["timeout"],
            lease=row["lease_seconds"],
            backoff_base=row["backoff_base"],
            backoff_cap=row["backoff_cap"],
            catch_up=CatchUp(row["catch_up"]),
            backfill_limit=row["backfill_limit"],
            grace=row["grace"],
            overlap=Overlap(row["overlap"]),
        ),
        enabled=bool(row["enabled"]),
        next_run_at=_time(dialect, row["next_run_at"], f"next tick of {row['name']!r}"),
        last_run_at=dialect.time(row["last_run_at"]),
        skipped_ticks=int(row["skipped_ticks"]),
    )


def lease_record(dialect: Dialect, row: Row) -> LeaseRecord:
    """Read a named lease's current row."""
    return LeaseRecord(
        name=row["name"],
        owner=row["owner"] or "",
        token=row["token"],
        acquired_at=dialect.time(row["acquired_at"]) or datetime.fromtimestamp(0, UTC),
        expires_at=dialect.time(row["expires_at"]),
    )


def past_lease(dialect: Dialect, row: Row) -> LeaseRecord:
    """Read a row of a named lease's history."""
    return LeaseRecord(
        name=row["name"],
        owner=row["owner"],
        token=row["token"],
        acquired_at=dialect.time(row["acquired_at"]) or datetime.fromtimestamp(0, UTC),
        ended_at=dialect.time(row["ended_at"]),
        ended=row["ended"],
    )


def token(dialect: Dialect, row: Row) -> Token:
    """Read a row of conveyor_tokens."""
    return Token(
        id=row["id"],
        tenant=row["tenant"],
        role=Role(row["role"]),
        secret_hash=row["secret_hash"],
        name=row["name"],
        created_at=_time(dialect, row["created_at"], f"creation time of token {row['id']!r}"),
        last_used_at=dialect.time(row["last_used_at"]),
        revoked_at=dialect.time(row["revoked_at"]),
        expires_at=dialect.time(row["expires_at"]),
        previous_hash=row["previous_hash"],
        previous_expires_at=dialect.time(row["previous_expires_at"]),
    )


def health_counts(dialect: Dialect, row: Row) -> HealthCounts:
    """Read the row of the ``health`` query."""
    return HealthCounts(
        queued=row["queued"],
        due=row["due"],
        running=row["running"],
        stale_running=row["stale_running"],
        workers=row["workers"],
        live_workers=row["live_workers"],
        last_heartbeat=dialect.time(row["last_heartbeat"]),
        now=_time(dialect, row["now"], "time"),
        dead_workers=row["dead_workers"],
    )


def attempt(dialect: Dialect, row: Row) -> Attempt:
    """Read a row of conveyor_attempts."""
    return Attempt(
        job_id=row["job_id"],
        number=row["number"],
        worker_id=row["worker_id"],
        started_at=dialect.time(row["started_at"]),
        finished_at=dialect.time(row["finished_at"]),
        outcome=Outcome(row["outcome"]),
        error=row["error"],
        traceback=row["traceback"],
    )


def worker_info(dialect: Dialect, row: Row) -> WorkerInfo:
    """Read a row of conveyor_workers."""
    return WorkerInfo(
        id=row["id"],
        hostname=row["hostname"],
        pid=row["pid"],
        queues=dialect.strings(row["queues"]),
        concurrency=row["concurrency"],
        started_at=dialect.time(row["started_at"]),
        heartbeat_at=dialect.time(row["heartbeat_at"]),
        stopped_at=dialect.time(row["stopped_at"]),
        lease=row["lease_seconds"],
        heartbeat_interval=row["heartbeat_seconds"],
        types=None if row["types"] is None else dialect.strings(row["types"]),
        forget_after=row["forget_seconds"],
    )


def queue_infos(rows: Sequence[Row]) -> list[QueueInfo]:
    """Read the rows of the queues query: one per queue and status, or per idle queue."""
    counts: dict[str, dict[str, int]] = {}
    paused: dict[str, bool] = {}
    for row in rows:
        name = row["name"]
        paused[name] = bool(row["paused"])
        bucket = counts.setdefault(name, {})
        if row["status"] is not None:
            bucket[row["status"]] = int(row["n"])
    return [QueueInfo(name, paused[name], counts[name]) for name in sorted(counts)]


def worker_params(worker: WorkerInfo) -> dict[str, Any]:
    """Return register_worker's parameters (the queues as a list)."""
    return {
        "id": worker.id,
        "hostname": worker.hostname,
        "pid": worker.pid,
        "queues": list(worker.queues),
        "concurrency": worker.concurrency,
        "lease_seconds": worker.lease,
        "heartbeat_seconds": worker.heartbeat_interval,
        "types": None if worker.types is None else list(worker.types),
        "forget_seconds": worker.forget_after,
    }


def token_params(token: Token) -> dict[str, Any]:
    """Return create_token's parameters (the creation time as a datetime)."""
    return {
        "id": token.id,
        "tenant": token.tenant,
        "role": token.role.value,
        "secret_hash": token.secret_hash,
        "name": token.name,
        "created_at": token.created_at,
        "expires_at": token.expires_at,
    }


def dumps(value: JSON) -> str | None:
    """Write a JSON document as compact text (None stays None)."""
    return None if value is None else compact(value)
