"""Group commit: the SQLite store's writes that come together share one transaction.

A worker settles batch N and claims batch N+1 at the same moment; on their own these are
two ``BEGIN IMMEDIATE ... COMMIT`` transactions on the store's thread, two WAL fsyncs and
two trips there and back. The :class:`GroupWriter` queues every write asked for during one
turn of the event loop and runs the queue on the store's thread in one transaction: one
fsync, one trip, one wake-up of the loop for all their results. The store's thread waits
for the end of the turn at most 2 ms: writes asked just before a handler blocks the loop
still run while it is blocked.

Nothing is acknowledged before the COMMIT that holds it has returned, so a write is as
durable as before; the group only shares the fsync. A write whose function fails must not
undo the others: in a group, each write runs in a savepoint, and a failure rolls back to
it, so that the failed write leaves nothing behind and the others commit. A failure of
BEGIN or COMMIT itself (a lock held past the busy timeout, a full disk), or one after
which SQLite rolled the whole transaction back, fails every write of the group: none of
them was committed, and each caller gets the error as it would have alone.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

from conveyor.store.sqlite._connection import release_wal
from conveyor.store.sqlite._errors import disk_full, rollback

T = TypeVar("T")

# How long the store's thread waits for the loop's turn to end before it runs the writes
# queued so far (the loop may be blocked by a handler: the writes must not wait for it).
_TURN_WAIT = 0.002


class _Write(Generic[T]):
    __slots__ = ("error", "fn", "future", "loop", "result", "then")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], T],
        then: Callable[[T], None] | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.fn = fn
        self.then = then
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()
        self.result: Any = None
        self.error: BaseException | None = None


class GroupWriter:
    """Runs write transactions on the store's one thread, grouping those asked together.

    ``on_commit`` runs on the store's thread after each COMMIT that succeeded, with the
    connection (the store looks for other connections' commits there). ``commits_begun``
    and ``commits_ended`` count the COMMITs sent and those returned or failed: while they
    differ, one is in flight (the watcher reads them from its thread).
    """

    def __init__(
        self,
        executor: Executor,
        conn: sqlite3.Connection,
        *,
        on_commit: Callable[[sqlite3.Connection], None],
    ) -> None:
        self._executor = executor
        self._conn = conn
        self._on_commit = on_commit
        self._lock = threading.Lock()
        self._queue: list[_Write[Any]] = []
        self._sent = False  # whether a run of the queue is on its way to the store's thread
        self.groups = 0  # transactions run (for tests and the benchmark)
        self.writes = 0  # writes committed in them
        # Counted before a COMMIT shows in data_version and after it has (or failed): the
        # watcher must not take the store's own commit for another connection's.
        self.commits_begun = 0
        self.commits_ended = 0

    async def write(
        self, fn: Callable[[sqlite3.Connection], T], then: Callable[[T], None] | None = None
    ) -> T:
        """Run ``fn`` in a write transaction, with the writes asked during this loop turn."""
        loop = asyncio.get_running_loop()
        write = _Write(fn, then, loop)
        with self._lock:
            self._queue.append(write)
            sent = self._sent
            self._sent = True
        if not sent:
            # The store's thread starts at once but waits for the end of this turn of the
            # loop, so that the writes asked until then (a settle and the claim after
            # it) go in the same transaction; a loop that blocks holds them back only
            # for _TURN_WAIT.
            turn_over = threading.Event()
            loop.call_soon(turn_over.set)
            self._send(turn_over)
        return await write.future

    def _send(self, turn_over: threading.Event) -> None:
        try:
            self._executor.submit(self._run_queue, turn_over)
        except RuntimeError:  # the store was closed meanwhile
            with self._lock:
                writes, self._queue = self._queue, []
                self._sent = False
            for w in writes:
                w.error = RuntimeError("the store is closed")
            _deliver(writes)

    # -- on the store's thread ----------------------------------------------------------

    def _run_queue(self, turn_over: threading.Event) -> None:
        turn_over.wait(_TURN_WAIT)
        with self._lock:
            writes, self._queue = self._queue, []
            self._sent = False
        if not writes:
            return
        try:
            self._together(writes)
        except BaseException as exc:  # nothing of the group was committed
            for w in writes:
                if w.error is None:
                    w.error = exc
        if any(disk_full(w.error) for w in writes):
            # The log filled the disk: give its space back before anyone tries again.
            release_wal(self._conn)
        _deliver(writes)

    def _together(self, writes: list[_Write[Any]]) -> None:
        """Run ``writes`` in one transaction, each in a savepoint of its own when there are
        several; set their results once it has committed. Raises when nothing was."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            done = [w for w in writes if _attempt(conn, w, len(writes) > 1)]
        except BaseException:
            rollback(conn)
            raise
        if not done:
            rollback(conn)
            return
        self.commits_begun += 1
        try:
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
        finally:
            self.commits_ended += 1
        self.groups += 1
        self.writes += len(done)
        self._on_commit(conn)
        for w in done:
            if w.then is not None:
                try:
                    w.then(w.result)
                except BaseException as exc:
                    w.error = exc


def _attempt(conn: sqlite3.Connection, w: _Write[Any], shared: bool) -> bool:
    """Run one write's function; False (its error kept) if it failed and was undone.

    In a shared transaction the write runs in a savepoint, so that its failure undoes its
    own changes only. Raises when the whole transaction is lost: alone, on any failure;
    shared, when SQLite rolled the transaction back itself (a full disk, an I/O error).
    """
    if shared:
        conn.execute("SAVEPOINT conveyor_write")
    try:
        w.result = w.fn(conn)
    except BaseException as exc:
        w.error = exc
        if not shared or not conn.in_transaction:
            raise
        conn.execute("ROLLBACK TO conveyor_write")
        conn.execute("RELEASE conveyor_write")
        return False
    if shared:
        conn.execute("RELEASE conveyor_write")
    return True


def _deliver(writes: list[_Write[Any]]) -> None:
    """Hand each write's outcome to its loop: one wake-up per loop for the group."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Write[Any]]] = {}
    for w in writes:
        by_loop.setdefault(w.loop, []).append(w)
    for loop, mine in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_futures, mine)
        except RuntimeError:  # that loop is closed: nobody waits for these any more
            pass


def _settle_futures(writes: list[_Write[Any]]) -> None:
    for w in writes:
        if w.future.done():  # cancelled while it ran
            continue
        if w.error is not None:
            w.future.set_exception(w.error)
        else:
            w.future.set_result(w.result)
