"""Connecting to PostgreSQL: URL parsing, error messages that say what to do, quiet pools."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from conveyor.core.retry import pause_after_failures
from conveyor.errors import ConfigurationError, DatabaseUnavailable

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from conveyor.store.postgres.backend import PostgresStore

log = logging.getLogger("conveyor.store.postgres")

T = TypeVar("T")

# How long an operation waits for a pooled connection. A restart of the server takes a
# few seconds: operations made meanwhile wait for it rather than fail.
ACQUIRE_TIMEOUT = 5.0
# How often an operation runs when its connection was dead or its transaction deadlocked.
ATTEMPTS = 3

# psycopg_pool logs a warning for every connection it discards and every reconnection
# attempt: a restart of the server would flood each worker's log. For conveyor's own
# pools, the store logs the outage once instead (PostgresStore._connect_failed).
QUIET_POOLS: weakref.WeakValueDictionary[str, PostgresStore] = weakref.WeakValueDictionary()
OUR_CONNECTIONS: weakref.WeakSet[Any] = weakref.WeakSet()


class _PoolNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg == "error connecting in %r: %s" and len(args) == 2:
            store = QUIET_POOLS.get(str(args[0]))
            if store is not None:
                store._connect_failed(reason(args[1]) if isinstance(args[1], Exception) else "")
                return False
        if str(record.msg).startswith("discarding ") and args:
            try:
                return args[0] not in OUR_CONNECTIONS
            except TypeError:
                return True
        return True


logging.getLogger("psycopg.pool").addFilter(_PoolNoise())

# Connection settings applied unless the URL sets them: fail fast when the server is
# unreachable, and notice a silently dead peer (a network partition) within ~30s.
CONNECTION_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "application_name": "conveyor",
}


def retrying(
    pool: ConnectionPool[psycopg.Connection[Any]], work: Callable[[psycopg.Connection[Any]], T]
) -> T:
    """Run ``work`` on a pooled blocking connection, again after a deadlock or a dead
    idle connection (see :meth:`PostgresStore._run`)."""
    for attempt in range(1, ATTEMPTS + 1):
        with pool.connection(timeout=ACQUIRE_TIMEOUT) as conn:
            try:
                return work(conn)
            except psycopg.Error as exc:
                if not may_run_again(exc, conn, attempt):
                    raise
        if conn.broken:
            pool.check()
    raise AssertionError("not reached")


def may_run_again(
    exc: psycopg.Error,
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    attempt: int,
) -> bool:
    """Whether work that raised ``exc`` on ``conn`` at its ``attempt``-th try may run once
    more (both retry loops: :func:`retrying`, :meth:`PostgresStore._run`): a transaction
    the server broke to end a lock cycle, or a connection that had died while idle (then
    the pool's other idle ones are checked first); never past :data:`ATTEMPTS`."""
    if attempt >= ATTEMPTS:
        return False
    if isinstance(exc, psycopg.errors.DeadlockDetected):
        return True
    return isinstance(exc, psycopg.OperationalError) and conn.broken


def redact(url: str) -> str:
    """Hide the password of a URL.

    >>> redact("postgresql://app:s3cret@db:5432/jobs")
    'postgresql://app:***@db:5432/jobs'
    """
    return re.sub(r"(//[^/@:]*:)[^@/]*@", r"\1***@", url)


def parse_postgres_url(url: str) -> dict[str, str]:
    """Return the connection parameters of a ``postgresql://`` URL, or raise ConfigurationError.

    >>> parse_postgres_url("postgresql://app@db.internal:6432/jobs")["port"]
    '6432'
    """
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "cannot be parsed"
        raise ConfigurationError(
            f"malformed PostgreSQL URL {redact(url)!r} ({reason}): write "
            "postgresql://user:password@host:5432/dbname"
        ) from None
    for port in str(params.get("port", "5432")).split(","):
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigurationError(
                f"malformed PostgreSQL URL {redact(url)!r}: port {port!r} is not a number "
                "from 1 to 65535"
            )
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in SSLMODES:
        raise ConfigurationError(
            f"malformed PostgreSQL URL {redact(url)!r}: sslmode {sslmode!r} is not one of "
            f"{', '.join(SSLMODES)}"
        )
    return {k: str(v) for k, v in params.items()}


# libpq's values of sslmode; another is a setting to fix, not a server to wait for.
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def describe(params: Mapping[str, str]) -> str:
    host = params.get("host") or params.get("hostaddr") or "localhost (default socket)"
    port = params.get("port", "5432")
    database = params.get("dbname") or params.get("user") or "(default)"
    user = params.get("user") or "(current user)"
    return f"PostgreSQL at {host}:{port} (database {database!r}, user {user!r})"


def reason(exc: BaseException) -> str:
    """The server's or libpq's reason for a failure, on one line."""
    text = str(exc).strip() or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = re.sub(r"^connection failed: ", "", lines[0])
    first = re.sub(r'^connection to server (at|on) "[^"]*"(, port \d+)? failed: ', "", first)
    return re.sub(r"^(FATAL|ERROR):\s+", "", first)


def advice(reason: str) -> str:
    """What to do about a failed connection, from libpq's reason."""
    if re.search(r'database "[^"]*" does not exist', reason):
        return "Create the database (createdb NAME) or fix its name in the URL"
    if "password" in reason or re.search(r'role "[^"]*" does not exist', reason):
        return "Check the user and password in the URL"
    return (
        "Check that the server is running and reachable from this machine, and the host "
        "and port in the URL (CONVEYOR_DATABASE_URL)"
    )


CANCEL_CHANNEL = "conveyor_cancel"


async def listen_forever(
    connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
    listen: str,
    wake: asyncio.Event,
    cancelled: set[str],
    where: Callable[[], str],
) -> None:
    """Listen (``listen``: the LISTEN statements) for the store's notifications until
    cancelled: set ``wake`` on each, and
    add the id of each job whose cancel was asked for to ``cancelled``. A lost connection
    is opened again (with backoff); meanwhile the worker polls."""
    failures = 0
    while True:
        try:
            conn = await connect()
            async with conn:
                await conn.execute(listen)
                if failures:
                    log.warning("listening for notifications again on %s", where())
                failures = 0
                # Whatever happened while nobody listened is found by claiming now.
                wake.set()
                async for note in conn.notifies():
                    if note.channel == CANCEL_CHANNEL:
                        cancelled.add(note.payload)
                    wake.set()
        except (psycopg.Error, DatabaseUnavailable) as exc:
            failures += 1
            if failures == 1:
                log.warning(
                    "no notification connection to %s (%s); polling until it is back",
                    where(),
                    reason(exc),
                )
        await asyncio.sleep(
            pause_after_failures(failures, jitter=random.random(), base=0.2, cap=10.0)
        )
