"""Wake-ups for SQLite: noticing other connections' commits.

``PRAGMA data_version`` on a connection changes when any *other* connection commits. The
store's own connection therefore tells, right after each of its write transactions, whether
someone else committed since it last looked (:meth:`Watch.check`, on the store's thread, at
the cost of one pragma). A thread (:func:`start_watcher`) covers the time the store does
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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.store.sqlite.backend import SQLiteStore

# An idle worker notices a commit from another process by polling PRAGMA data_version,
# which reads shared memory only; 2 ms keeps enqueue-to-start latency low at ~1% CPU.
WATCH_INTERVAL = 0.002


class Watch:
    """What the store's thread needs to wake the loop's waiters for others' commits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, wake: asyncio.Event) -> None:
        self._loop = loop
        self._wake = wake
        self._seen: int | None = None  # the store connection's data_version, last read
        self.asked = threading.Event()  # a look is queued on the store's thread

    def check(self, conn: sqlite3.Connection) -> None:
        """On the store's thread: wake the waiters if another connection committed since
        the last look (the first look wakes them too: it has nothing to compare with)."""
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._seen:
                self._seen = version
                self.wake()
        except (sqlite3.Error, RuntimeError):
            pass

    def wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake.set)
        except RuntimeError:  # the loop is closed
            pass


def start_watcher(store: SQLiteStore) -> threading.Thread:
    """Start the thread that wakes the store's waiters when another connection commits."""
    loop = asyncio.get_running_loop()
    wake = store._wake = asyncio.Event()
    watch = Watch(loop, wake)
    store._watch = watch
    stop = store._watch_stop
    path = store.path
    executor = store._executor
    writer = store._writer
    assert writer is not None, "the store opens before it watches"

    def looked(conn: sqlite3.Connection) -> None:
        try:
            watch.check(conn)
        finally:
            watch.asked.clear()

    def ask_store() -> None:
        conn = store._conn
        if executor is None or conn is None:
            watch.wake()
        elif not watch.asked.is_set():
            watch.asked.set()
            try:
                executor.submit(looked, conn)
            except RuntimeError:  # the store is closing
                watch.asked.clear()

    def version(conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA data_version").fetchone()[0])

    def watch_thread() -> None:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            mark = writer.commits_begun  # the store's commits begun, at the last poll
            last = version(conn)
            ask_store()  # the store's first look, after this reading
            quiet = True
            while not stop.wait(WATCH_INTERVAL):
                begun = writer.commits_begun
                if begun != mark or writer.commits_ended != begun:
                    # The store writes (its commits look for others'), or a commit of its
                    # is in flight: a reading now could miss it and see it on the next.
                    mark, quiet = begun, False
                    continue
                if not quiet:  # it stopped writing: a new reading, and one more look
                    quiet = True
                    last = version(conn)
                    ask_store()
                    continue
                now = version(conn)
                if now == last:
                    continue
                last = now
                if writer.commits_begun == mark:
                    watch.wake()  # no commit of the store's since: someone else's
                # else the store began one: the next poll finds it writing.
        except (sqlite3.Error, RuntimeError):
            # The database went away or the loop closed: waiters fall back to timeouts.
            pass
        finally:
            conn.close()

    watcher = threading.Thread(target=watch_thread, name="conveyor-sqlite-watch", daemon=True)
    watcher.start()
    return watcher
