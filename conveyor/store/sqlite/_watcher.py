"""Wake-ups for SQLite: a thread that notices other connections' commits."""

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


def start_watcher(store: SQLiteStore) -> threading.Thread:
    """Start a thread that wakes the store's waiters when another connection commits.

    A thread polls ``PRAGMA data_version`` on a connection of its own, which changes
    on every commit of any other connection, this store's included. While the store
    itself is writing (a draining worker commits every few milliseconds), a change
    may be its own commit: the watcher then asks the store's thread, whose own
    connection's data_version changes only with other connections' commits, instead
    of waking the event loop for nothing.
    """
    loop = asyncio.get_running_loop()
    wake = store._wake = asyncio.Event()
    stop = store._watch_stop
    path = store.path
    executor = store._executor
    seen: int | None = None  # the store connection's data_version, last read
    checking = threading.Event()  # a check is queued on the store's thread

    def check(conn: sqlite3.Connection) -> None:
        nonlocal seen
        try:
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != seen:
                seen = version
                loop.call_soon_threadsafe(wake.set)
        except (sqlite3.Error, RuntimeError):
            pass
        finally:
            checking.clear()

    def ask_store() -> None:
        conn = store._conn
        if executor is None or conn is None:
            loop.call_soon_threadsafe(wake.set)
        elif not checking.is_set():
            checking.set()
            try:
                executor.submit(check, conn)
            except RuntimeError:  # the store is closing
                checking.clear()

    def watch() -> None:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            ask_store()  # learn the store connection's data_version
            # The store counts a commit as begun before it shows in data_version, and as
            # done after. Its commits done before ``last`` was read are in ``last``; a
            # change of version is another connection's for sure only if no commit of
            # the store's began since then.
            settled = store._committed
            last = conn.execute("PRAGMA data_version").fetchone()[0]
            while not stop.wait(WATCH_INTERVAL):
                done = store._committed
                version = conn.execute("PRAGMA data_version").fetchone()[0]
                if version == last:
                    continue
                begun = store._commits
                last, before, settled = version, settled, done
                if begun == before:
                    loop.call_soon_threadsafe(wake.set)  # not ours: someone else's
                else:
                    ask_store()
        except (sqlite3.Error, RuntimeError):
            # The database went away or the loop closed: waiters fall back to timeouts.
            pass
        finally:
            conn.close()

    watcher = threading.Thread(target=watch, name="conveyor-sqlite-watch", daemon=True)
    watcher.start()
    return watcher
