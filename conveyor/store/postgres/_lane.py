"""One-job submits on a connection of their own, driven at the protocol level.

A submit of one job without dependencies is one prepared INSERT in autocommit (see
``submit_one`` in queries.sql). Through psycopg's async cursor each such statement costs
about as much client CPU again as the round trip itself: a pooled connection taken and
given back, the socket registered with the event loop and unregistered, a future and a
timer per wait. The lane keeps one connection, with the statement prepared and its
socket registered once, and sends the statement and reads its reply with libpq's own
calls (``send_query_prepared``, ``consume_input``, ``get_result``): half the client
CPU per submit.

It is only a shortcut. A submit finding the lane busy (another submit under way), not yet
open or lost takes the pool, as every other statement does; a connection lost under a
submit makes that submit run again on the pool (safe: a job already written is found by
its id, as any retried submit's is).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import pq

from conveyor.core.jsontext import compact
from conveyor.core.lifecycle import Status
from conveyor.core.model import NewJob
from conveyor.store._rows import SUBMITTED, Kind, job_writer
from conveyor.store.postgres._codec import Q, utc
from conveyor.store.postgres._connection import OUR_CONNECTIONS
from conveyor.store.postgres._errors import translated
from conveyor.store.postgres._submit import submit_one
from conveyor.store.protocol import Submitted

_STATEMENT = b"conveyor_submit_one"
# The parameters of submit_one, in the order of the prepared statement's $1, $2, ...:
# the submitted columns but depends_on (a job without dependencies), the payload as its
# text (the one the submit's check wrote, when it kept it), and the times.
_COLUMNS = tuple(c for c in SUBMITTED if c.kind is not Kind.IDS and c.name != "payload")
_PARAMETERS = (*(c.name for c in _COLUMNS), "payload", "run_at", "delay", "now")
_values = job_writer(
    {kind: "{}" for kind in Kind}
    | {Kind.INT: "int({})", Kind.FLOAT: "float({})", Kind.JSON: "compact({})"},
    {"compact": compact},
    columns=_COLUMNS,
    after=("payload", "run_at", "delay", "now"),
    form="tuple",
)
# After a lane could not be opened, the pool serves for this long before the next try.
_REOPEN_AFTER = 5.0
_POSTGRES_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# SQLSTATEs of a session the server ends or cannot serve (connection exceptions,
# shutdowns), or that lost its prepared statement (a pooler in transaction mode): the
# submit runs again on the pool.
_CONNECTION_LOST = ("08", "57P01", "57P02", "57P03", "26000")
_MICROSECONDS = struct.Struct(">q")

Connect = Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]
Run = Callable[[Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


def prepared_sql() -> str:
    """submit_one with positional parameters, as PREPARE takes it."""
    sql = Q["submit_one"]
    for number, name in enumerate(_PARAMETERS, 1):
        sql = sql.replace(f"%({name})s", f"${number}")
    if "%(" in sql:
        raise RuntimeError("submit_one has a parameter the lane does not send")
    return sql


def _text(value: object, encoding: str) -> bytes | None:
    """A parameter in PostgreSQL's text format, in the connection's encoding."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return utc(value).isoformat().encode()
    return str(value).encode(encoding)


def _parameters(job: NewJob, now: datetime | None, encoding: str) -> list[bytes | None]:
    values = _values(job, job.payload_json(), job.run_at, float(job.delay), now)
    return [_text(value, encoding) for value in values]


def _timestamptz(binary: bytes | None) -> datetime:
    if binary is None:
        raise ValueError("submit_one returned a null time")
    (microseconds,) = _MICROSECONDS.unpack(binary)
    return _POSTGRES_EPOCH + timedelta(microseconds=microseconds)


class _Lost(Exception):
    """The lane's connection is gone; the submit it carried must run elsewhere."""


class _Lane:
    """An open connection with submit_one prepared and its socket watched by the loop."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.encoding = conn.info.encoding
        self.alive = True
        self.busy = False
        self._waiter: asyncio.Future[list[pq.abc.PGresult]] | None = None
        self._loop = asyncio.get_running_loop()
        self._fd = self.pgconn.socket
        self._loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            self.pgconn.consume_input()
        except psycopg.OperationalError:
            self.lose()
            return
        if self.pgconn.status != pq.ConnStatus.OK:
            self.lose()
            return
        waiter = self._waiter
        if waiter is None or self.pgconn.is_busy():
            return
        results = []
        while (result := self.pgconn.get_result()) is not None:
            results.append(result)
        self._waiter = None
        if not waiter.done():
            waiter.set_result(results)

    def lose(self) -> None:
        """Stop using this connection (its state is unknown); fail a submit waiting."""
        if self.alive:
            self.alive = False
            self._loop.remove_reader(self._fd)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(_Lost())

    async def submit(self, job: NewJob, now: datetime | None) -> Submitted | None:
        self.busy = True
        try:
            try:
                parameters = _parameters(job, now, self.encoding)
                self.pgconn.send_query_prepared(
                    _STATEMENT, parameters, result_format=pq.Format.BINARY
                )
                while self.pgconn.flush():  # the socket's buffer is full: rare
                    await asyncio.sleep(0.001)
            except psycopg.OperationalError:
                self.lose()
                raise _Lost() from None
            if not self.alive:  # lost while the buffer drained: nothing would answer
                raise _Lost()
            # A local reference: reading a reply that is already in may lose the lane,
            # which fails this future and lets go of the lane's own reference to it.
            waiter = self._waiter = self._loop.create_future()
            if not self.pgconn.is_busy():  # the reply was read already (after a full buffer)
                self._readable()
            try:
                results = await waiter
            except asyncio.CancelledError:
                self.lose()  # the reply would reach the next submit: start afresh
                raise
        finally:
            self.busy = False
        return self._read(job, results)

    def _read(self, job: NewJob, results: list[pq.abc.PGresult]) -> Submitted | None:
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                error = psycopg.errors.error_from_result(result, encoding=self.encoding)
                if (error.sqlstate or "").startswith(_CONNECTION_LOST):
                    self.lose()  # the server is ending this session: the pool takes over
                    raise _Lost() from error
                raise error
        (result,) = results
        if result.ntuples == 0:
            return None
        run_at = _timestamptz(result.get_value(0, 0))
        created_at = _timestamptz(result.get_value(0, 1))
        return Submitted(job.stored(Status.QUEUED, run_at, created_at), created=True)

    async def close(self) -> None:
        self.lose()
        await self.conn.close()


class OneJobSubmits:
    """A store's one-job submits: on the lane when it is free, else on the pool."""

    def __init__(
        self, connect: Connect, run: Run, where: Callable[[], str], *, lane: bool = True
    ) -> None:
        self._connect = connect
        self._use_lane = lane
        self._run = run
        self._where = where
        self._lane: _Lane | None = None
        self._opening = False
        self._open_after = 0.0

    async def submit(self, job: NewJob, now: datetime | None) -> Submitted | None:
        """Insert ``job`` (no dependencies) in one statement; None if its id or unique
        key is taken (nothing written then)."""
        lane = self._lane
        if lane is not None and not lane.alive:
            self._lane = None
            with contextlib.suppress(Exception):
                await lane.close()
            lane = None
        if lane is None:
            lane = await self._open()
        if lane is not None and not lane.busy:
            try:
                with translated(self._where):
                    return await lane.submit(job, now)
            except _Lost:
                pass  # written or not, the pool's submit below finds out
        result: Submitted | None = await self._run(lambda conn: submit_one(conn, job, now))
        return result

    async def _open(self) -> _Lane | None:
        if not self._use_lane or self._opening or time.monotonic() < self._open_after:
            return None
        self._opening = True
        try:
            conn = await self._connect()
            try:
                await conn.execute(Q["session_settings"])
                await conn.execute(f"PREPARE {_STATEMENT.decode()} AS {prepared_sql()}")
            except BaseException:
                await conn.close()
                raise
        except Exception:
            # The pool serves meanwhile, and says what is wrong if it cannot either.
            self._open_after = time.monotonic() + _REOPEN_AFTER
            return None
        finally:
            self._opening = False
        OUR_CONNECTIONS.add(conn)
        self._lane = _Lane(conn)
        return self._lane

    async def close(self) -> None:
        lane, self._lane = self._lane, None
        if lane is not None:
            await lane.close()
