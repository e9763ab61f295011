"""Scripts of named leases: acquired, renewed and released, with their history."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from conveyor.store.protocol import (
    LeaseRecord,
)
from conveyor.store.scripts.base import Dialect, Row, Script
from conveyor.store.scripts.rows import lease_record, past_lease

# -- named leases ------------------------------------------------------------------------


def acquire_lease(dialect: Dialect, name: str, owner: str, ttl: float) -> Script[LeaseRecord]:
    """Take a named lease with a new token, or return its current holder unchanged."""
    before = yield "get_lease", {"name": name}
    taken = yield "take_lease", {"name": name, "owner": owner, "ttl": float(ttl)}
    if not taken:
        # Held by someone else; read it again in case it was created meanwhile.
        (current,) = yield "current_lease", {"name": name}
        return lease_record(dialect, current)
    if before and before[0]["owner"] is not None:
        yield from _record_lease_end(before[0], before[0]["expires_at"], "expired")
    return lease_record(dialect, taken[0])


def renew_lease(dialect: Dialect, name: str, token: int, ttl: float) -> Script[datetime | None]:
    """Extend a held lease; None when the token no longer holds it."""
    rows = yield "renew_lease", {"name": name, "token": token, "ttl": float(ttl)}
    return dialect.time(rows[0]["expires_at"]) if rows else None


def release_lease(name: str, token: int) -> Script[bool]:
    """Give a lease up, keeping its holder in the history; False if the token lost it."""
    before = yield "get_lease", {"name": name}
    released = yield "release_lease", {"name": name, "token": token}
    if not released or not before:
        return False
    held, moment = before[0], released[0]["released_at"]
    expired = held["expires_at"] is not None and held["expires_at"] <= moment
    ended_at = held["expires_at"] if expired else moment
    yield from _record_lease_end(held, ended_at, "expired" if expired else "released")
    return not expired


def _record_lease_end(row: Row, ended_at: Any, how: str) -> Script[None]:
    """Keep a past holder of a named lease, and only the last few."""
    yield (
        "record_lease_end",
        {
            "name": row["name"],
            "token": row["token"],
            "owner": row["owner"],
            "acquired_at": row["acquired_at"],
            "ended_at": ended_at,
            "ended": how,
        },
    )
    yield "trim_lease_history", {"name": row["name"]}


def lease_history(dialect: Dialect, name: str) -> Script[list[LeaseRecord]]:
    """Return the last holders of a lease, newest first."""
    current = yield "current_lease", {"name": name}
    past = [past_lease(dialect, r) for r in (yield "lease_history", {"name": name})]
    if current and current[0]["owner"] is not None:
        return [lease_record(dialect, current[0]), *past]
    return past
