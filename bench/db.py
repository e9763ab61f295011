"""Plain, synchronous database access for the benchmark's own reads and set-up writes.

The benchmark reads what conveyor wrote (timestamps, counts) and loads rows in bulk
with its own connection, outside any timed section.  Both backends get the same
three calls; the SQL they run is written out per backend by the caller.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from bench.databases import sqlite_path

Row = tuple[Any, ...]


class Db:
    """One autocommit connection to a run's database, SQLite or PostgreSQL."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Row] | None = None
        if backend == "sqlite":
            self._sqlite = sqlite3.connect(sqlite_path(url), isolation_level=None, timeout=60.0)
            self._sqlite.execute("PRAGMA busy_timeout = 60000")
        else:
            self._pg = psycopg.connect(url, autocommit=True)

    def rows(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Row]:
        """Run one statement and return all its rows (named parameters: SQLite only)."""
        if self._sqlite is not None:
            return self._sqlite.execute(sql, params).fetchall()
        cursor = self._postgres().execute(sql.encode(), params)
        return cursor.fetchall() if cursor.description is not None else []

    def value(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """Run one statement and return the first column of its first row (or None)."""
        found = self.rows(sql, params)
        return found[0][0] if found else None

    def script(self, sql: str) -> None:
        """Run several statements separated by semicolons (no parameters)."""
        if self._sqlite is not None:
            self._sqlite.executescript(sql)
            return
        self._postgres().execute(sql.encode())

    def _postgres(self) -> psycopg.Connection[Row]:
        if self._pg is None:
            raise RuntimeError("the connection is closed")
        return self._pg

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            self._pg.close()


@contextmanager
def connect(backend: str, url: str) -> Iterator[Db]:
    """Yield a :class:`Db` on ``url`` and close it afterwards."""
    db = Db(backend, url)
    try:
        yield db
    finally:
        db.close()
