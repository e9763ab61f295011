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

A small submit (``here=True``) skips the hand-off: at the end of the turn, if every write
queued is such a write of this loop and the store's thread is idle (it holds the
connection's lock, :class:`StoreThread`, while it runs anything), the group runs right
there on the event loop's thread, which saves the two cross-thread wake-ups that cost
more than the transaction itself. The loop waits for that one small transaction and its
fsync, never for another process: ``BEGIN IMMEDIATE`` is tried with no busy timeout, and
if the file is locked, or the store's thread busy, the group goes to the thread as any.

A task that submits one job after another (a loop of ``await app.submit(...)``) gains
nothing from waiting for the end of the turn: nobody else asked for a write meanwhile.
So a small write whose task also asked the writer's last small write, with nothing
queued, runs on the spot (:meth:`GroupWriter.write_now`, in the caller's step of the
loop), and returns without the turn of the loop the others wait for; that one write
has its transaction to itself. Writes of different tasks in one turn (concurrent
requests of a web server, handlers submitting children) still wait for the end of the
turn and share a transaction, as does every write but a small one: a task's write after
another task's is never on the spot. Returning without a turn of the loop, a run of such
writes would keep the loop from the other tasks (a worker's heartbeats, a server's other
requests) for as long as it lasts: after ``_SPOT_SLICE`` of writes on the spot in a row,
the next one gives the loop a turn before it returns.

A job submitted alone on the spot is one ``INSERT`` that SQLite commits by itself
(``alone``): sent outside any transaction, with no ``BEGIN IMMEDIATE`` and ``COMMIT`` around
it, so three statements through the driver become one (the same WAL frames and fsync).
Another connection's write lock makes it fail at once, nothing written, and the write goes
to the store's thread as any; in a group, on the store's thread, it is one write of many.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, ParamSpec, TypeVar, cast

from conveyor.store.sqlite._connection import BUSY_TIMEOUT_MS, release_wal
from conveyor.store.sqlite._errors import disk_full, rollback

T = TypeVar("T")
P = ParamSpec("P")

# How long the store's thread waits for the loop's turn to end before it runs the writes
# queued so far (the loop may be blocked by a handler: the writes must not wait for it).
_TURN_WAIT = 0.002
# How long a run of writes on the spot may keep the loop before one of them gives it a turn.
_SPOT_SLICE = 0.005


class StoreThread(ThreadPoolExecutor):
    """The store's one thread. Each task runs holding :attr:`busy`, the lock of the
    connection, so that another thread may use the connection while none runs."""

    def __init__(self) -> None:
        super().__init__(max_workers=1, thread_name_prefix="conveyor-sqlite")
        self.busy = threading.Lock()
        # Called with busy held, before each task: the writer puts back the busy timeout
        # that a write on the loop's thread left at 0.
        self.on_take: Callable[[], None] | None = None

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return super().submit(self._holding, fn, *args, **kwargs)

    def submit_bare(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """Run ``fn`` on the thread without taking :attr:`busy` for it."""
        return super().submit(fn, *args, **kwargs)

    def _holding(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self.busy:
            if self.on_take is not None:
                self.on_take()
            return fn(*args, **kwargs)


class _Locked(Exception):
    """Another connection holds the write lock: the group goes to the store's thread."""


class _Write(Generic[T]):
    __slots__ = ("error", "fn", "future", "here", "loop", "result", "then")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], T],
        then: Callable[[T], None] | None,
        loop: asyncio.AbstractEventLoop,
        here: bool,
    ) -> None:
        self.fn = fn
        self.then = then
        self.loop = loop
        self.here = here
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
        executor: StoreThread,
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
        # Whether the connection's busy timeout is 0, as the loop's thread leaves it (set
        # and read with the connection's lock held; the store's thread restores it).
        self._hasty = False
        executor.on_take = self._patient
        self.groups = 0  # transactions run (for tests and the benchmark)
        self.writes = 0  # writes committed in them
        # Counted before a COMMIT shows in data_version and after it has (or failed): the
        # watcher must not take the store's own commit for another connection's.
        self.commits_begun = 0
        self.commits_ended = 0
        # The task that asked the last small write (here=True), if it still exists.
        self._last_asker: weakref.ref[asyncio.Task[Any]] | None = None
        # When the current run of writes on the spot began (monotonic), if one is going on.
        self._spot_since: float | None = None

    async def write(
        self,
        fn: Callable[[sqlite3.Connection], T],
        then: Callable[[T], None] | None = None,
        *,
        here: bool = False,
        alone: bool = False,
    ) -> T:
        """Run ``fn`` in a write transaction, with the writes asked during this loop turn
        (``here``: on this thread if it can, see the module's docstring; ``alone``: as
        :meth:`write_now` takes it, when it runs on the spot)."""
        if here and self._asked_last():
            done, result = self.write_now(fn, alone=alone)
            if done:
                written = cast(T, result)  # write_now's result, once done
                if then is not None:
                    then(written)
                if self._turn_due():
                    await asyncio.sleep(0)
                return written
        self._spot_since = None
        loop = asyncio.get_running_loop()
        write = _Write(fn, then, loop, here)
        with self._lock:
            self._queue.append(write)
            sent = self._sent
            self._sent = True
        if not sent and here:
            loop.call_soon(self._run_here, loop)
        elif not sent:
            # The store's thread starts at once but waits for the end of this turn of the
            # loop, so that the writes asked until then (a settle and the claim after
            # it) go in the same transaction; a loop that blocks holds them back only
            # for _TURN_WAIT.
            turn_over = threading.Event()
            loop.call_soon(turn_over.set)
            self._send(turn_over)
        return await write.future

    def _asked_last(self) -> bool:
        """Whether the running task asked the last small write too and nothing is queued
        (then this one may run on the spot); notes the task as the last to ask."""
        task = asyncio.current_task()
        last, self._last_asker = self._last_asker, None if task is None else weakref.ref(task)
        if task is None or last is None or last() is not task:
            return False
        with self._lock:
            return not self._queue and not self._sent

    def _turn_due(self) -> bool:
        """After a write on the spot: whether to give the loop a turn, the run of them
        having lasted ``_SPOT_SLICE`` (each returns without one, see the module's
        docstring)."""
        now = time.monotonic()
        if self._spot_since is None:
            self._spot_since = now
        elif now - self._spot_since >= _SPOT_SLICE:
            self._spot_since = None
            return True
        return False

    def _send(self, turn_over: threading.Event) -> None:
        try:
            # Not submit(): the run takes the connection's lock itself, and lets it go
            # before it hands the results back.
            self._executor.submit_bare(self._run_queue, turn_over)
        except RuntimeError:  # the store was closed meanwhile
            with self._lock:
                writes, self._queue = self._queue, []
                self._sent = False
            for w in writes:
                w.error = RuntimeError("the store is closed")
            _deliver(writes)

    def _run_here(self, loop: asyncio.AbstractEventLoop) -> None:
        """At the end of the turn, on the loop's thread: run the queue here if it holds
        only writes of this loop that may run here and the store's thread is idle;
        else send it to the store's thread."""
        busy = self._executor.busy
        if not busy.acquire(blocking=False):  # the store's thread runs something
            self._send_now()  # the queue as it is; _sent is still set
            return
        try:
            with self._lock:
                writes = self._queue
                mine = all(w.here and w.loop is loop for w in writes)
                if mine:
                    self._queue, self._sent = [], False
            if not writes:
                return
            if not mine:
                self._send_now()
                return
            try:
                self._run_group(writes, wait=False)
            except _Locked:  # another connection writes: the store's thread waits for it
                with self._lock:
                    self._queue[:0] = writes  # first in line, as they were asked first
                    sent, self._sent = self._sent, True
                if not sent:
                    self._send_now()
                return
        finally:
            busy.release()
        _settle_futures(writes)

    def write_now(
        self, fn: Callable[[sqlite3.Connection], T], *, alone: bool = False
    ) -> tuple[bool, T | None]:
        """Run ``fn`` in a write transaction of its own on the calling thread, a thread
        without an event loop (a blocking caller's): ``(True, result)`` once committed,
        or ``(False, None)``, with nothing done, if the store's thread runs something or
        another connection holds the write lock (the caller then asks the usual way).

        ``alone``: ``fn`` sends one statement, which runs outside any transaction and so
        commits by itself (one statement sent instead of three: ``BEGIN IMMEDIATE``, it,
        ``COMMIT``). Run in a group, on the store's thread, it is one write of many.
        """
        busy = self._executor.busy
        if not busy.acquire(blocking=False):
            return False, None
        try:
            conn = self._conn
            if alone:
                try:
                    return True, self._alone(conn, fn)
                except _Locked:
                    return False, None
            try:
                self._begin_at_once(conn)
            except _Locked:
                return False, None
            try:
                result = fn(conn)
            except BaseException:
                rollback(conn)
                raise
            self.commits_begun += 1
            try:
                conn.execute("COMMIT")
            except BaseException as exc:
                rollback(conn)
                self._after_failure(exc)
                raise
            finally:
                self.commits_ended += 1
            self._counted_commit(conn)
            return True, result
        finally:
            busy.release()

    def _alone(self, conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run a write of one statement as its own transaction, without waiting for another
        connection's write lock (raises :class:`_Locked`, nothing done); its result (None:
        it wrote nothing)."""
        self._hasten(conn)
        self.commits_begun += 1
        try:
            result = fn(conn)
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise _Locked() from exc
            self._after_failure(exc)
            raise
        finally:
            self.commits_ended += 1
        if result is not None:
            self._counted_commit(conn)
        return result

    def _counted_commit(self, conn: sqlite3.Connection) -> None:
        """Count a committed transaction of one write; look for others' commits."""
        self.groups += 1
        self.writes += 1
        self._on_commit(conn)

    def _after_failure(self, exc: BaseException) -> None:
        """After a write that failed: a full disk's log gives its space back."""
        if disk_full(exc):
            release_wal(self._conn)
            self._hasty = False  # release_wal left the store's busy timeout set

    def _send_now(self) -> None:
        """Send the queue to the store's thread, the turn being over already."""
        turn_over = threading.Event()
        turn_over.set()
        self._send(turn_over)

    # -- on the store's thread ----------------------------------------------------------

    def _run_queue(self, turn_over: threading.Event) -> None:
        turn_over.wait(_TURN_WAIT)
        with self._lock:
            writes, self._queue = self._queue, []
            self._sent = False
        if not writes:
            return
        with self._executor.busy:
            self._patient()
            self._run_group(writes)
        # Once the lock is let go: the loop, woken, may find the connection free.
        _deliver(writes)

    def _run_group(self, writes: list[_Write[Any]], *, wait: bool = True) -> None:
        """Run ``writes`` in one transaction, on whichever thread holds the connection.

        A failure that committed nothing becomes the error of each write without one of
        its own; after a full disk the log's space is given back before anyone tries
        again (and before the errors come back). ``wait=False``: raises :class:`_Locked`,
        nothing done, if another connection holds the write lock.
        """
        try:
            self._together(writes, wait=wait)
        except _Locked:
            raise
        except BaseException as exc:  # nothing of the group was committed
            for w in writes:
                if w.error is None:
                    w.error = exc
        full = next((w.error for w in writes if disk_full(w.error)), None)
        if full is not None:
            self._after_failure(full)

    def _begin_at_once(self, conn: sqlite3.Connection) -> None:
        """``BEGIN IMMEDIATE`` without waiting for another connection's write lock. The
        busy timeout stays at 0 until the store's thread next runs (:meth:`_patient`):
        submits one after the other set it once, not twice each."""
        self._hasten(conn)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _busy(exc):
                raise _Locked() from exc
            raise

    def _hasten(self, conn: sqlite3.Connection) -> None:
        """The busy timeout at 0, for a write on the loop's thread that must not wait."""
        if not self._hasty:
            conn.execute("PRAGMA busy_timeout = 0")
            self._hasty = True

    def _patient(self) -> None:
        """On the store's thread, before each task: the busy timeout as the store sets it."""
        if self._hasty:
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            self._hasty = False

    def _together(self, writes: list[_Write[Any]], *, wait: bool = True) -> None:
        """Run ``writes`` in one transaction, each in a savepoint of its own when there are
        several; set their results once it has committed. Raises when nothing was
        (:class:`_Locked` if ``wait`` is False and another connection holds the lock)."""
        conn = self._conn
        if wait:
            conn.execute("BEGIN IMMEDIATE")
        else:
            self._begin_at_once(conn)
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


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked": another connection writes."""
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY


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
