"""Wake-ups for SQLite: noticing other connections' commits.

``PRAGMA data_version`` on a connection changes when any *other* connection commits. The
store's own connection therefore tells, right after each of its write transactions, whether
someone else committed since it last looked (:meth:`Watcher.check`, on the store's thread, at
the cost of one pragma). A thread of the :class:`Watcher` covers the time the store does
not write: it polls a connection of its own every 2 ms, where a change is either another
connection's commit or the store's own.

While the store writes (a draining worker commits every few milliseconds), the thread does
not poll: each of the store's commits looks for others' anyway. Once the store goes quiet
(no commit begun since the last poll and none in flight: a COMMIT with its fsync may
outlast a poll), the thread takes a new reading and has the store look once more, which
covers a commit that came after the store's last look and before that reading; from then
on a change is someone else's unless the store began a commit meanwhile.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import Executor

from conveyor.store.sqlite._writer import GroupWriter

# An idle worker notices a commit from another process by polling PRAGMA data_version,
# which reads shared memory only; 2 ms keeps enqueue-to-start latency low at ~1% CPU.
WATCH_INTERVAL = 0.002


class Watcher:
    """Wakes a store's waiters when another connection commits to its file.

    Started by the store's first :meth:`wait`, on its event loop; the store calls
    :meth:`check` on its own thread after each commit, and :meth:`stop` when it closes.
    ``executor`` is the store's one thread, ``conn`` its connection there, ``writer``
    its group writer (whose commit counters tell the store's commits from others').
    """

    def __init__(
        self, path: str, executor: Executor, conn: sqlite3.Connection, writer: GroupWriter
    ) -> None:
        self._path = path
        self._executor = executor
        self._conn = conn
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._seen: int | None = None  # the store connection's data_version, last read
        self._asked = threading.Event()  # a look is queued on the store's thread
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._poll, name="conveyor-sqlite-watch", daemon=True
        )
        self._thread.start()

    async def wait(self, timeout: float) -> None:
        """Wait until another connection committed since the last wait, or ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass
        self._wake.clear()

    def stop(self) -> None:
        """Stop the polling thread (waiters then run to their timeouts)."""
        self._stop.set()
        self._thread.join(timeout=1)

    def check(self, conn: sqlite3.Connection) -> None:
        """On the store's thread: wake the waiters if another connection committed since
        the last look (the first look wakes them too: it has nothing to compare with)."""
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._seen:
                self._seen = version
                self._set()
        except (sqlite3.Error, RuntimeError):
            pass

    def _set(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop is closed
            pass

    def _looked(self, conn: sqlite3.Connection) -> None:
        try:
            self.check(conn)
        finally:
            self._asked.clear()

    def _ask_store(self) -> None:
        """Have the store's thread look once (at most one look queued at a time)."""
        if not self._asked.is_set():
            self._asked.set()
            try:
                self._executor.submit(self._looked, self._conn)
            except RuntimeError:  # the store is closing
                self._asked.clear()

    def _poll(self) -> None:
        writer = self._writer
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        try:
            mark = writer.commits_begun  # the store's commits begun, at the last poll
            last = _version(conn)
            self._ask_store()  # the store's first look, after this reading
            quiet = True
            while not self._stop.wait(WATCH_INTERVAL):
                begun = writer.commits_begun
                if begun != mark or writer.commits_ended != begun:
                    # The store writes (its commits look for others'), or a commit of its
                    # is in flight: a reading now could miss it and see it on the next.
                    mark, quiet = begun, False
                    continue
                if not quiet:  # it stopped writing: a new reading, and one more look
                    quiet = True
                    last = _version(conn)
                    self._ask_store()
                    continue
                now = _version(conn)
                if now == last:
                    continue
                last = now
                if writer.commits_begun == mark:
                    self._set()  # no commit of the store's since: someone else's
                # else the store began one: the next poll finds it writing.
        except (sqlite3.Error, RuntimeError):
            # The database went away or the loop closed: waiters fall back to timeouts.
            pass
        finally:
            conn.close()


def _version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA data_version").fetchone()[0])
