"""Storage: the :class:`Store` protocol (the union of its roles, ``SubmitStore``,
``WorkerStore``, ...) and the backends behind it, chosen by URL."""

from __future__ import annotations

import time
from collections.abc import Callable

from conveyor.errors import ConfigurationError
from conveyor.store._pooling import Pooling
from conveyor.store.protocol import (
    Beat,
    Clock,
    HealthCounts,
    Inserted,
    JobPageQuery,
    JobReads,
    Lease,
    LeaseRecord,
    Limits,
    LockStore,
    MaintenanceStore,
    OperatorStore,
    QueueInfo,
    QueueLag,
    ReadStore,
    Rescued,
    Retention,
    ScheduleInfo,
    Store,
    StoreLifecycle,
    SubmitStore,
    Submitted,
    TokenStore,
    UnservedType,
    WorkerInfo,
    WorkerStore,
)


def create_store(
    url: str,
    *,
    clock: Callable[[], float] | None = None,
    migrate: bool = True,
    pooling: Pooling | None = None,
) -> Store:
    """Return an unopened store for a ``sqlite:///`` or ``postgresql://`` URL.

    ``clock`` pins the store's time (seconds since the epoch) for tests; in production
    SQLite uses the machine's clock and PostgreSQL the server's ``now()``. ``pooling``
    says whether a PostgreSQL URL goes through a transaction pooler (store/_pooling.py).
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            "no database URL: pass one such as sqlite:///conveyor.db or "
            "postgresql://user@host/db, or set CONVEYOR_DATABASE_URL"
        )
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "sqlite":
        if pooling is not None and pooling.configured_any:
            raise ConfigurationError(
                f"a pooler and a listen URL (CONVEYOR_POOLER, CONVEYOR_LISTEN_URL) apply to "
                f"PostgreSQL only, and the database URL is {url!r}: unset them, or use a "
                "postgresql:// URL"
            )
        from conveyor.store.sqlite import SQLiteStore
        from conveyor.store.sqlite.backend import parse_sqlite_url

        return SQLiteStore(parse_sqlite_url(url), clock=clock or time.time, migrate=migrate)
    if scheme in ("postgres", "postgresql"):
        try:
            from conveyor.store.postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError(
                f"PostgreSQL support is not installed ({exc.name} is missing): "
                'pip install "conveyor[postgres]"'
            ) from exc
        return PostgresStore(url, clock=clock, migrate=migrate, pooling=pooling)
    raise ConfigurationError(
        f"malformed database URL {url!r}: use sqlite:///path/to/file.db or "
        "postgresql://user@host:5432/dbname"
    )


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///`` URL, None for another scheme (raises on a malformed one)."""
    if not url.lower().startswith("sqlite:"):
        return None
    from conveyor.store.sqlite.backend import parse_sqlite_url

    return parse_sqlite_url(url)


__all__ = [
    "Beat",
    "Clock",
    "HealthCounts",
    "Inserted",
    "JobPageQuery",
    "JobReads",
    "Lease",
    "LeaseRecord",
    "Limits",
    "LockStore",
    "MaintenanceStore",
    "OperatorStore",
    "Pooling",
    "QueueInfo",
    "QueueLag",
    "ReadStore",
    "Rescued",
    "Retention",
    "ScheduleInfo",
    "Store",
    "StoreLifecycle",
    "SubmitStore",
    "Submitted",
    "TokenStore",
    "UnservedType",
    "WorkerInfo",
    "WorkerStore",
    "create_store",
    "sqlite_path",
]
