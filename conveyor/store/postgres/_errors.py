"""PostgreSQL's runtime failures as conveyor's errors, each saying what to do.

The backend runs every pooled operation inside :func:`translated`. Connection failures
(the server down, restarting or unreachable, the pool exhausted) and the server's
resource errors become :class:`StorageError`; errors that are bugs are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import psycopg
from psycopg import errors as pg
from psycopg_pool import PoolTimeout

from conveyor.errors import StorageError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0].strip()


def storage_error(exc: psycopg.Error, where: str) -> StorageError | None:
    """The conveyor error for ``exc`` on the server described by ``where``; None for a bug.

    >>> print(storage_error(pg.DiskFull("could not extend file"), "PostgreSQL at db:5432"))
    ... # doctest: +ELLIPSIS
    the disk of PostgreSQL at db:5432 is full (could not extend file): free space ...
    """
    reason = _first_line(exc)
    if isinstance(exc, PoolTimeout):
        message = (
            f"no connection to {where} came free in time ({reason}): the server is down or "
            "unreachable, or every pooled connection is busy; check the server, then try again"
        )
    elif isinstance(exc, pg.DiskFull):
        message = f"the disk of {where} is full ({reason}): free space on the server"
    elif isinstance(exc, pg.InsufficientResources):  # out of memory, too many connections
        message = f"{where} is out of resources ({reason}): see the server's log"
    elif isinstance(exc, pg.QueryCanceled):
        message = (
            f"a statement on {where} ran past its timeout ({reason}): another session holds "
            "a lock for long, or the server is overloaded"
        )
    elif isinstance(exc, pg.LockNotAvailable):
        message = f"a lock on {where} was not free in time ({reason}); try again"
    elif isinstance(exc, pg.TransactionRollback | pg.DeadlockDetected | pg.SerializationFailure):
        message = f"a transaction on {where} kept conflicting with others ({reason}); try again"
    elif isinstance(exc, pg.ReadOnlySqlTransaction):
        message = f"{where} is read-only ({reason}): point the URL at the primary server"
    elif isinstance(exc, pg.DataCorrupted | pg.IndexCorrupted):
        message = f"{where} reports corrupt data ({reason}): see the server's log"
    elif isinstance(exc, psycopg.OperationalError):  # the connection broke
        message = (
            f"lost the connection to {where} ({reason}): check that the server is running "
            "and reachable; conveyor reconnects by itself when it is back"
        )
    else:
        return None
    return StorageError(message)


class _Translation:
    __slots__ = ("where",)

    def __init__(self, where: Callable[[], str]) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, psycopg.Error):
            error = storage_error(exc, self.where())
            if error is not None:
                raise error from exc


def translated(where: Callable[[], str]) -> _Translation:
    """A ``with`` block whose PostgreSQL failures are raised as :class:`StorageError`.

    ``where`` describes the server, and is called only when something failed.
    """
    return _Translation(where)
