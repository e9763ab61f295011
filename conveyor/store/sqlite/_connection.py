"""Opening a SQLite file: checks that say what to do, WAL mode, the busy timeout, and a
write-ahead log that gives its space back."""

from __future__ import annotations

import os
import random
import sqlite3
import time
from pathlib import Path

from conveyor.errors import ConfigurationError, DatabaseUnavailable, NotAConveyorDatabase

BUSY_TIMEOUT_MS = 30_000
# SQLite never shrinks the -wal file by itself: a burst of writes while a reader held an
# old snapshot leaves it as large as the burst for good. With a limit, each checkpoint
# that starts the log over truncates the file to this size (a little more than the 1000
# pages an automatic checkpoint lets it hold).
WAL_SIZE_LIMIT = 8 * 1024 * 1024
# How long the checkpoint after a full disk waits for other connections' readers.
RELEASE_WAIT_MS = 2_000


def switch_to_wal(conn: sqlite3.Connection) -> str:
    """Put the file in WAL mode (a no-op once it is); return the journal mode it is in.

    When several processes open a new file at once, SQLite can refuse the switch with
    "database is locked" at once, without waiting for the busy timeout (it does so
    where waiting could deadlock: this connection reads the file while another waits to
    write it). The refused statement holds no lock, so trying again soon succeeds.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    pause = 0.005
    while True:
        try:
            mode: str = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            return mode
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 0.1)


def connect(path_name: str) -> sqlite3.Connection:
    """Open the file in WAL mode, or raise an error that says what to do."""
    path = Path(path_name)
    if path.is_dir():
        raise ConfigurationError(f"database path {path_name!r} is a directory: name a file")
    if not path.parent.exists():
        raise ConfigurationError(
            f"cannot create database {path_name!r}: folder {str(path.parent)!r} does not "
            "exist; create it or choose another path"
        )
    if path.exists() and not os.access(path, os.R_OK | os.W_OK):
        raise ConfigurationError(
            f"database {path_name!r} is not readable and writable by this user: "
            "fix its permissions or choose another path"
        )
    if not path.exists() and not os.access(path.parent, os.W_OK):
        raise ConfigurationError(
            f"cannot create database {path_name!r}: folder {str(path.parent)!r} is not "
            "writable; fix its permissions or choose another path"
        )
    try:
        conn = sqlite3.connect(path_name, isolation_level=None, check_same_thread=False, timeout=30)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        mode = switch_to_wal(conn)
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc):
            raise NotAConveyorDatabase(
                f"{path_name!r} is not a SQLite database ({exc}): point "
                "CONVEYOR_DATABASE_URL at a conveyor database or a new file"
            ) from exc
        raise DatabaseUnavailable(f"cannot open SQLite database {path_name!r}: {exc}") from exc
    if mode.lower() != "wal":
        conn.close()
        raise ConfigurationError(
            f"cannot switch {path_name!r} to WAL journal mode (got {mode!r}): "
            "conveyor needs WAL to share the file between processes"
        )
    return conn


def release_wal(conn: sqlite3.Connection) -> None:
    """Copy the write-ahead log into the database and truncate it to nothing, if no reader
    of another connection needs it for long; best effort, never raises.

    Run after a full disk: the log is the file that grew to fill it, and without this it
    keeps its size (SQLite reuses it from the start), so freeing some other file would be
    the only way back. Readers hold the truncation back, so it waits for them briefly
    rather than for the busy timeout.
    """
    try:
        conn.execute(f"PRAGMA busy_timeout = {RELEASE_WAIT_MS}")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.Error:
        pass  # still full, or readers held on: the next full-disk error tries again
    finally:
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        except sqlite3.Error:
            pass


def parse_sqlite_url(url: str) -> str:
    """Return the file path of a ``sqlite:///path`` URL (``sqlite:///:memory:`` is refused).

    >>> parse_sqlite_url("sqlite:///conveyor.db")
    'conveyor.db'
    >>> parse_sqlite_url("sqlite:////var/lib/app/jobs.db")
    '/var/lib/app/jobs.db'
    """
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigurationError(
            f"malformed SQLite URL {url!r}: write sqlite:///relative/path.db "
            "or sqlite:////absolute/path.db"
        )
    path = url[len(prefix) :].split("?", 1)[0]
    if path == ":memory:":
        raise ConfigurationError(
            "sqlite:///:memory: cannot be shared between a worker and its clients: "
            "use a file such as sqlite:///conveyor.db"
        )
    return path
