"""The SQLite backend: one file, zero set-up, several worker processes on one machine.

Writes run in ``BEGIN IMMEDIATE`` transactions on a WAL database with ``synchronous=FULL``
(an acknowledged submit survives a power loss) and a busy timeout, so several processes
can share the file. Each store owns one connection, used from one thread of its own so
that a busy wait never blocks the event loop.
"""

from conveyor.store.sqlite.backend import SQLiteStore

__all__ = ["SQLiteStore"]
