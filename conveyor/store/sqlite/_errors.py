"""SQLite's failures as conveyor's errors, each saying what is wrong and what to do.

The backend runs every operation inside :func:`translated`; what a failure means is
decided here, by SQLite's result code, so the backend stays about queries. Errors that
are bugs (a constraint or syntax error) are left as they are.
"""

from __future__ import annotations

import sqlite3
from types import TracebackType

from conveyor.errors import StorageError

# Primary result codes (https://www.sqlite.org/rescode.html); extended codes add high bits.
_PERM, _BUSY, _LOCKED, _NOMEM, _READONLY, _IOERR, _CORRUPT = 3, 5, 6, 7, 8, 10, 11
_FULL, _CANTOPEN, _NOTADB = 13, 14, 26


def storage_error(exc: sqlite3.Error, path: str) -> StorageError | None:
    """The conveyor error for ``exc`` on the database at ``path``; None for a bug.

    >>> full = sqlite3.OperationalError("database or disk is full")
    >>> full.sqlite_errorcode = 13
    >>> print(storage_error(full, "/srv/jobs.db"))  # doctest: +ELLIPSIS
    the disk holding SQLite database '/srv/jobs.db' is full (database or disk is full): free ...
    >>> bug = sqlite3.OperationalError("no such column: x")
    >>> bug.sqlite_errorcode = 1
    >>> storage_error(bug, "/srv/jobs.db") is None
    True
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return None
    where = f"SQLite database {path!r}"
    primary = code & 0xFF
    if primary == _FULL:
        message = (
            f"the disk holding {where} is full ({exc}): free space on it (the file's -wal "
            "journal grows with each write), then try again"
        )
    elif primary in (_BUSY, _LOCKED):
        message = (
            f"{where} stayed locked by another connection past the busy timeout ({exc}): "
            "a long transaction or a stopped process holds its write lock; end it, then "
            "try again"
        )
    elif primary == _IOERR:
        message = (
            f"I/O error on {where} ({exc}): check the disk and the file system it is on "
            "(dmesg), then try again"
        )
    elif primary in (_READONLY, _PERM, _CANTOPEN):
        message = (
            f"{where} cannot be written ({exc}): conveyor writes the file, its -wal and "
            "-shm files and their folder; fix their permissions or the mount"
        )
    elif primary in (_CORRUPT, _NOTADB):
        message = (
            f"{where} is corrupt ({exc}): stop the workers and restore it from a backup "
            "(or save what is left with `sqlite3 FILE .recover`)"
        )
    elif primary == _NOMEM:
        message = f"SQLite ran out of memory working on {where} ({exc})"
    else:
        return None
    return StorageError(message)


class _Translation:
    __slots__ = ("path",)

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, sqlite3.Error):
            error = storage_error(exc, self.path)
            if error is not None:
                raise error from exc


def disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` is SQLite's "database or disk is full"."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == _FULL


def translated(path: str) -> _Translation:
    """A ``with`` block whose SQLite failures are raised as :class:`StorageError`.

    A class rather than a generator: it wraps every operation, the hot path included.
    """
    return _Translation(path)


def rollback(conn: sqlite3.Connection) -> None:
    """End what is left of a failed transaction.

    After a full disk or an I/O error SQLite may have rolled the transaction back itself;
    a ROLLBACK then fails, and that failure must neither hide the error that matters nor
    leave the connection inside a transaction that every later BEGIN would trip over.
    """
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass
