"""What one SQLite commit of one new job costs, by schema: ``python -m bench.commit_cost``.

The loop is the bare transaction of a one-by-one submit, ``BEGIN IMMEDIATE``, one
``INSERT``, ``COMMIT``, with WAL and ``synchronous=FULL`` (an fsync at every commit), on
five tables in five files of one directory: ``conveyor_jobs`` as conveyor's migrations
make it; the same without its ``created_at`` and claim indexes (the two index entries
every new job adds beside the row and its id's key); the same made ``WITHOUT ROWID``
(the row stored in the id's b-tree: one b-tree fewer to write), with all its indexes
and without the ``created_at`` one; and SqliteHuey's own table (an integer key and one
index). The variants take turns in blocks, so that the disk's drift
hits them alike; it prints each one's median, mean (what a loop's rate sees: it counts
the checkpoints) and 90th percentile.

It answers whether a one-by-one submit is bound by conveyor's schema or by the work
around the commit: compare the medians with a whole call of ``app.submit``
(``python -m bench.submit_latency``) and with huey's.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from conveyor import Conveyor
from conveyor.core.ids import new_id

_INSERT_JOB = (
    "INSERT INTO conveyor_jobs (id, type, queue, payload, status, priority, attempt, "
    "max_attempts, run_at, created_at, backoff_base, backoff_cap) "
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


def _insert_job(conn: sqlite3.Connection) -> None:
    now = time.time()
    job_id = new_id(now)  # as a submit makes it: in time order, so keys go in at one end
    values = (job_id, "noop", "default", '{"t": 1.5}', "queued", 0, 0, 3, now, now, 1.0, 300.0)
    conn.execute(_INSERT_JOB, values)


def _insert_task(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO task (queue, data, priority) VALUES (?, ?, ?)", ("q", b"x" * 120, 0))


def _without_rowid(source: Path, name: str, *, drop: tuple[str, ...] = ()) -> sqlite3.Connection:
    """``conveyor_jobs`` made again as a ``WITHOUT ROWID`` table (its id the b-tree's key,
    no separate index of ids), with the same indexes but those named in ``drop``."""
    conn = _open(source, name)
    (table,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'conveyor_jobs'").fetchone()
    indexes = [
        sql
        for index, sql in conn.execute(
            "SELECT name, sql FROM sqlite_master "
            "WHERE type = 'index' AND tbl_name = 'conveyor_jobs' AND sql IS NOT NULL"
        )
        if index.removeprefix("conveyor_jobs_") not in drop
    ]
    conn.execute("DROP TABLE conveyor_jobs")  # empty: nothing to copy
    conn.execute(f"{table} WITHOUT ROWID")
    for sql in indexes:
        conn.execute(sql)
    return conn


def variants(source: Path) -> dict[str, tuple[sqlite3.Connection, Callable[..., None]]]:
    """The tables, each in a file of its own, with the insert of one row."""
    leaner = _open(source, "leaner")
    leaner.execute("DROP INDEX conveyor_jobs_created")
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
        "without the created_at and claim indexes": (leaner, _insert_job),
        "WITHOUT ROWID (no separate id index)": (
            _without_rowid(source, "without_rowid"),
            _insert_job,
        ),
        "WITHOUT ROWID, without the created_at index": (
            _without_rowid(source, "without_rowid_created", drop=("created",)),
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
