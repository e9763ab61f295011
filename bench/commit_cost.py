"""What one SQLite commit of one new job costs, by schema: ``python -m bench.commit_cost``.

The loop is the bare transaction of a one-by-one submit, ``BEGIN IMMEDIATE``, one
``INSERT``, ``COMMIT``, with WAL and ``synchronous=FULL`` (an fsync at every commit), on
five tables in five files of one directory: ``conveyor_jobs`` as conveyor's migrations
make it (keyed by the creation microsecond: a new job is written into three b-trees, its
row, its id's unique index and the claim index); the same as it was before migration 14
(keyed by id, with an index by creation time: four b-trees); the same as migrated without
the claim index, and without the id's unique index (two b-trees each, as many as
huey's); and SqliteHuey's own table (an integer key and one index). The variants take
turns in blocks, so that the disk's drift hits them alike; it prints each one's median,
mean (what a loop's rate sees: it counts the checkpoints) and 90th percentile.

It answers whether a one-by-one submit is bound by conveyor's schema or by the work
around the commit: compare the medians with a whole call of ``app.submit``
(``python -m bench.submit_latency``, ``python -m bench.index_cost``) and with huey's;
``python -m bench.submit_layers`` sets the statement a submit sends alone beside the whole
call, conveyor's and huey's.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from conveyor import Conveyor
from conveyor.core.ids import new_id

_COLUMNS = "id, type, queue, payload, status, priority, attempt, max_attempts, run_at, "
_INSERT_JOB = (
    f"INSERT INTO conveyor_jobs ({_COLUMNS}created_us, created_at, backoff_base, backoff_cap) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_JOB_BY_ID = (
    f"INSERT INTO conveyor_jobs ({_COLUMNS}created_at, backoff_base, backoff_cap) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _migrated(directory: Path) -> Path:
    """A fresh SQLite file with conveyor's schema."""
    path = directory / "migrated.db"

    async def migrate() -> None:
        app = Conveyor(f"sqlite:///{path}")
        await app.store()
        await app.close()

    asyncio.run(migrate())
    return path


def _open(source: Path, name: str) -> sqlite3.Connection:
    path = source.with_name(f"{name}.db")
    shutil.copy(source, path)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _values(now: float, *created: float) -> tuple[object, ...]:
    job_id = new_id(now)  # as a submit makes it: in time order, so keys go in at one end
    return (job_id, "noop", "default", '{"t": 1.5}', "queued", 0, 0, 3, now, *created, 1.0, 300.0)


def _insert_job(conn: sqlite3.Connection) -> None:
    now = time.time()
    created_us = round(now * 1_000_000)
    conn.execute(_INSERT_JOB, _values(now, created_us, created_us / 1_000_000))


def _insert_job_by_id(conn: sqlite3.Connection) -> None:
    now = time.time()
    conn.execute(_INSERT_JOB_BY_ID, _values(now, now))


def _insert_task(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO task (queue, data, priority) VALUES (?, ?, ?)", ("q", b"x" * 120, 0))


def _keyed_by_id(source: Path, name: str) -> sqlite3.Connection:
    """``conveyor_jobs`` as it was before migration 14: keyed by its id (a rowid table
    with the id's unique index), created_at stored, and an index by creation time."""
    conn = _open(source, name)
    (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'conveyor_jobs'").fetchone()
    indexes = [
        sql.replace("(tenant, created_us)", "(tenant, created_at, id)")
        for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_master "
            "WHERE type = 'index' AND tbl_name = 'conveyor_jobs' AND sql IS NOT NULL"
        )
    ]
    before = re.sub(r"created_us\s+INTEGER PRIMARY KEY,\s*", "", table)
    before = re.sub(r"id(\s+)TEXT NOT NULL UNIQUE", r"id\1TEXT PRIMARY KEY", before)
    conn.execute("DROP TABLE conveyor_jobs")  # empty: nothing to copy
    conn.execute(before)
    for sql in [*indexes, "CREATE INDEX conveyor_jobs_created ON conveyor_jobs (created_at, id)"]:
        conn.execute(sql)
    return conn


def _without_id_index(source: Path, name: str) -> sqlite3.Connection:
    """``conveyor_jobs`` as migrated but without its id's unique index (the table rebuilt,
    empty, with the same indexes): two b-trees a new job is written into, as many as
    huey's, with conveyor's row. Not a working schema (a job could not be found by id);
    it answers what that index costs the commit."""
    conn = _open(source, name)
    (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'conveyor_jobs'").fetchone()
    indexes = [
        sql
        for (sql,) in conn.execute(
            "SELECT sql FROM sqlite_master "
            "WHERE type = 'index' AND tbl_name = 'conveyor_jobs' AND sql IS NOT NULL"
        )
    ]
    conn.execute("DROP TABLE conveyor_jobs")  # empty: nothing to copy
    conn.execute(re.sub(r"id(\s+)TEXT NOT NULL UNIQUE", r"id\1TEXT NOT NULL", table))
    for sql in indexes:
        conn.execute(sql)
    return conn


def variants(source: Path) -> dict[str, tuple[sqlite3.Connection, Callable[..., None]]]:
    """The tables, each in a file of its own, with the insert of one row."""
    leaner = _open(source, "leaner")
    leaner.execute("DROP INDEX conveyor_jobs_claim")
    huey = _open(source, "huey_shaped")
    # SqliteHuey's own table and index (huey 2.5+, its default strict_fifo=False).
    huey.execute(
        "CREATE TABLE task (id INTEGER NOT NULL PRIMARY KEY, queue TEXT NOT NULL, "
        "data BLOB NOT NULL, priority REAL NOT NULL DEFAULT 0.0)"
    )
    huey.execute("CREATE INDEX task_queue_priority_id ON task (queue, priority DESC, id)")
    return {
        "conveyor_jobs, as migrated": (_open(source, "as_migrated"), _insert_job),
        "keyed by id, with a created_at index (before migration 14)": (
            _keyed_by_id(source, "keyed_by_id"),
            _insert_job_by_id,
        ),
        "as migrated, without the claim index": (leaner, _insert_job),
        "as migrated, without the id's unique index": (
            _without_id_index(source, "without_id_index"),
            _insert_job,
        ),
        "huey's table (integer key, one index)": (huey, _insert_task),
    }


def measure(directory: Path, *, blocks: int, per_block: int) -> dict[str, list[float]]:
    """Seconds per one-row commit, for each variant, taking turns in blocks."""
    tables = variants(_migrated(directory))
    seconds: dict[str, list[float]] = {name: [] for name in tables}
    for _ in range(blocks):
        for name, (conn, insert) in tables.items():
            for _ in range(per_block):
                start = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                insert(conn)
                conn.execute("COMMIT")
                seconds[name].append(time.perf_counter() - start)
    for conn, _ in tables.values():
        conn.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where the files go (default: a temporary directory)")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--per-block", type=int, default=150)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        seconds = measure(Path(scratch), blocks=args.blocks, per_block=args.per_block)
    for name, times in seconds.items():
        ordered = sorted(times)
        p90 = ordered[int(len(ordered) * 0.9)]
        print(
            f"{name}: median {statistics.median(times) * 1e6:.0f} µs, "
            f"mean {statistics.fmean(times) * 1e6:.0f} µs, "
            f"p90 {p90 * 1e6:.0f} µs ({len(times)} commits)"
        )


if __name__ == "__main__":
    main()
