"""Telling a direct connection from one through a transaction pooler.

A server announces its process id when a connection starts (libpq's ``backend_pid``);
``pg_backend_pid()`` names the process that runs a statement. Directly connected they are
the same. Through a pooler (PgBouncer sends a made-up id) they differ, in any pool mode.
Which mode: in session mode a client keeps its server connection, so two clients never
share one; in transaction mode a server connection goes back to the pool after each
transaction, and the next client to ask (PgBouncer hands out the most recently used
first) gets it. Two clients that take turns and see the same server process prove
transaction pooling; not seeing it (a busy pooler handing out others) proves nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

from conveyor.errors import ConfigurationError, DatabaseUnavailable
from conveyor.store._pooling import Pooling
from conveyor.store.postgres._codec import Q
from conveyor.store.postgres._connection import (
    CONNECTION_DEFAULTS,
    advice,
    describe,
    listen_forever,
    parse_postgres_url,
    reason,
    redact,
)

T = TypeVar("T")

log = logging.getLogger("conveyor.store.postgres")

# Turns the two probing connections take: enough for an idle or lightly used pooler.
_TURNS = 4

Direct = "direct"
Pooled = "pooled"  # a pooler, mode unknown (session, or transaction not caught)
Transaction = "transaction"
# URLs found to go through a pooler of unknown mode: said once per process, not per store.
_POOLERS_SAID: set[str] = set()


def _server_pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(Q["backend_pid"], prepare=False).fetchone()
    if row is None:
        raise RuntimeError("pg_backend_pid() returned no row")
    return int(row["pid"] if isinstance(row, dict) else row[0])


def route(conn: psycopg.Connection[Any], connect: Callable[[], psycopg.Connection[Any]]) -> str:
    """Whether ``conn`` reaches its server directly, through a pooler, or through one in
    transaction mode (``connect`` opens another connection on the same URL to find out)."""
    first = _server_pid(conn)
    if first == conn.info.backend_pid:
        return Direct
    mine, theirs = {first}, set[int]()
    with connect() as other:
        for _ in range(_TURNS):
            pid = _server_pid(other)
            if pid in mine:
                return Transaction
            theirs.add(pid)
            pid = _server_pid(conn)
            if pid in theirs:
                return Transaction
            mine.add(pid)
    return Pooled


class Route:
    """How a store reaches its server: whether through a transaction pooler (checked
    against what the server says), and the direct connection it LISTENs on, if any."""

    def __init__(self, url: str, pooling: Pooling) -> None:
        self.url = url
        self.pooled = pooling.transaction
        self.listen_url = pooling.listen_url
        params = {} if self.listen_url is None else parse_postgres_url(self.listen_url)
        self._kwargs: dict[str, Any] = {
            k: v for k, v in CONNECTION_DEFAULTS.items() if k not in params
        }
        self._polling_said = False

    def connect_kwargs(self, params: Mapping[str, str]) -> dict[str, Any]:
        """psycopg's connection settings for the URL of ``params`` (what it leaves unset)."""
        kwargs: dict[str, Any] = {k: v for k, v in CONNECTION_DEFAULTS.items() if k not in params}
        if self.pooled:
            # Through a transaction pooler the next statement may reach another server
            # session, where a statement psycopg prepared would not exist (or would,
            # under the same name, for another client): never prepare.
            kwargs["prepare_threshold"] = None
        return kwargs

    async def migrating(self, migrations: Awaitable[T], where: str) -> T:
        """Await ``migrations``; through a transaction pooler, a failure says to migrate
        on the direct URL."""
        try:
            return await migrations
        except psycopg.Error as exc:
            if not self.pooled:
                raise
            raise DatabaseUnavailable(
                f"migrating {where} through the transaction pooler failed ({reason(exc)}): "
                "run `conveyor migrate --database-url URL` with the server's direct URL "
                "(not the pooler's), then start conveyor again"
            ) from exc

    @property
    def listens(self) -> bool:
        """Whether the store can LISTEN: not through a transaction pooler, unless it has
        a listen URL."""
        return not self.pooled or self.listen_url is not None

    def polling(self, interval: float) -> float:
        """Say once that wake-ups come by polling only; return how long to wait."""
        if not self._polling_said:
            self._polling_said = True
            log.warning(
                "no wake-ups: the database URL goes through a transaction pooler and no "
                "listen URL is set, so new jobs and cancel requests are found by polling "
                "every %gs; set CONVEYOR_LISTEN_URL (--listen-url) to a direct URL of the "
                "database for wake-ups within milliseconds",
                interval,
            )
        return interval

    def check(
        self, conn: psycopg.Connection[Any], connect: Callable[[], psycopg.Connection[Any]]
    ) -> None:
        """Refuse a URL that goes through a transaction pooler unless told so, and a
        listen URL through one or to another database (``conn``: on the URL)."""
        found = Direct if self.pooled else route(conn, connect)
        if found == Pooled and self.url not in _POOLERS_SAID:
            _POOLERS_SAID.add(self.url)
            log.warning(
                "the database URL %s goes through a connection pooler; if it pools by "
                "transaction (PgBouncer's pool_mode = transaction), set "
                "CONVEYOR_POOLER=transaction and CONVEYOR_LISTEN_URL",
                redact(self.url),
            )
        if found == Transaction:
            raise ConfigurationError(
                f"the database URL {redact(self.url)} goes through a connection pooler in "
                "transaction mode (such as PgBouncer with pool_mode = transaction): its "
                "server sessions change from one transaction to the next, which breaks "
                "prepared statements, session settings and LISTEN. Set "
                "CONVEYOR_POOLER=transaction (Conveyor(pooler='transaction'), --pooler "
                "transaction), and CONVEYOR_LISTEN_URL to a direct URL for wake-ups; or "
                "connect directly or through a session pooler"
            )
        url = self.listen_url
        if url is None:
            return
        with self.connect_listen_sync() as listen:
            if route(listen, self.connect_listen_sync) == Transaction:
                raise ConfigurationError(
                    f"the listen URL {redact(url)} goes through a transaction pooler: LISTEN "
                    "needs a session of its own on the server, so give a direct URL (the "
                    "server's host and port, not the pooler's) in CONVEYOR_LISTEN_URL"
                )
            ours = conn.execute(Q["database_identity"], prepare=False).fetchone()
            theirs = listen.execute(Q["database_identity"], prepare=False).fetchone()
        if ours is None or theirs is None or dict(ours) != dict(theirs):
            what = theirs["database"] if theirs is not None else "?"
            raise ConfigurationError(
                f"the listen URL {redact(url)} is to database {what!r} (or another server), "
                f"not to the application's {describe(parse_postgres_url(self.url))}: "
                "wake-ups would never come. Point CONVEYOR_LISTEN_URL at the same "
                "database, directly"
            )

    def _failed(self, exc: psycopg.OperationalError) -> DatabaseUnavailable:
        why = reason(exc)
        return DatabaseUnavailable(
            f"cannot connect to the listen URL {redact(self.listen_url or '')}: {why}. "
            f"{advice(why).replace('CONVEYOR_DATABASE_URL', 'CONVEYOR_LISTEN_URL')}"
        )

    def connect_listen_sync(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(
                self.listen_url or "", autocommit=True, row_factory=dict_row, **self._kwargs
            )
        except psycopg.OperationalError as exc:
            raise self._failed(exc) from None

    async def connect_listen(self) -> psycopg.AsyncConnection[Any]:
        """Open a connection on the listen URL, or raise DatabaseUnavailable."""
        try:
            return await psycopg.AsyncConnection.connect(
                self.listen_url or "", autocommit=True, row_factory=dict_row, **self._kwargs
            )
        except psycopg.OperationalError as exc:
            raise self._failed(exc) from None

    def where_listening(self) -> str:
        return describe(parse_postgres_url(self.listen_url or ""))


class Wakeups:
    """A store's wake-ups: a task that keeps a LISTEN connection (on the listen URL when
    there is one) and what it heard, or polling alone through a transaction pooler
    without a listen URL."""

    def __init__(
        self,
        route: Route,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        where: Callable[[], str],
    ) -> None:
        self._route = route
        self._connect = route.connect_listen if route.listen_url else connect
        self._where = route.where_listening if route.listen_url else where
        self._listener: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._cancelled: set[str] = set()

    async def wait(self, timeout: float) -> frozenset[str]:
        """Wait for a notification (new work or a cancel request), or ``timeout`` seconds;
        return the ids of the jobs whose cancel was asked for meanwhile.

        The first call starts a task that keeps a LISTEN connection open, reconnecting
        with backoff when it drops; polling by the caller covers the gap.
        """
        if not self._route.listens:
            await asyncio.sleep(self._route.polling(timeout))
            return frozenset()
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                listen_forever(
                    self._connect, Q["listen"], self._wake, self._cancelled, self._where
                ),
                name="conveyor-postgres-listen",
            )
        if not self._wake.is_set():
            try:
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            except TimeoutError:
                pass
        self._wake.clear()
        cancelled = frozenset(self._cancelled)
        self._cancelled.clear()  # the listener holds this set
        return cancelled

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
