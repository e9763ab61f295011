"""A one-by-one SQLite submit split into its statement and the work around it, conveyor
beside huey: ``python -m bench.submit_layers``.

Four ways of adding one job, each on a file of its own in one directory, taking turns in
blocks (in one order, then the reverse) in one process, so that the disk's and the
machine's drift hit them alike:

- ``conveyor, whole call``: ``await app.submit("noop", {"t": ...})``, as the peer bench's
  one-by-one enqueue calls it;
- ``conveyor, its statement``: the one ``INSERT`` that call sends (a job alone is one
  statement, committed by itself), on conveyor's schema, with the values a submit binds,
  sent straight through ``sqlite3``;
- ``huey, whole call``: a SqliteHuey task called (``noop(t)``: the task is pickled and
  enqueued in ``BEGIN``, ``INSERT``, ``COMMIT``);
- ``huey, its statement``: huey's ``INSERT`` into its own table, alone.

Each file is filled with ``--per-block`` × 10 jobs and emptied with ``DELETE`` first (the
peer harness empties its files so between runs: new pages then come off the free list).
All in WAL mode with ``synchronous=FULL``, huey's as huey sets it (its default cache).

It prints each way's median time per job, the median over the blocks of whole call minus
statement (what each library's code around its statement costs), and conveyor's speed
as a multiple of huey's for the whole call and for the statement alone. Needs huey (the
``bench`` extra). ``--dir`` chooses the disk: ``/dev/shm`` takes the disk away and leaves
the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.app import submit_only
from conveyor.core.ids import new_id
from conveyor.store.sqlite._submit import _PLAIN, _statement

WAYS = (
    "conveyor, whole call",
    "conveyor, its statement",
    "huey, whole call",
    "huey, its statement",
)
_HUEY_INSERT = "INSERT INTO task (queue, data, priority) VALUES (?, ?, ?)"


class _Statement:
    """The ``INSERT`` of a job submitted alone, on a file of conveyor's schema, with the
    values a submit of ``noop`` binds (its columns: ``_PLAIN``)."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.sql = _statement(_PLAIN, 1)
        self._last_us = 0

    def values(self, t: float) -> tuple[object, ...]:
        now = time.time()
        created_us = self._last_us = max(round(now * 1_000_000), self._last_us + 1)
        by_column = {
            "id": new_id(now),
            "type": "noop",
            "queue": "default",
            "priority": 0,
            "max_attempts": 3,
            "backoff_base": 1.0,
            "backoff_cap": 3600.0,
            "submitted_by": "local",
            "payload": f'{{"t":{t!r}}}',
            "run_at": now,
            "created_us": created_us,
            "created_at": created_us / 1_000_000,
        }
        return tuple(by_column[column] for column in _PLAIN)


def _huey_table(path: Path) -> sqlite3.Connection:
    """A connection to a file holding SqliteHuey's table and index, opened as huey opens
    its own (WAL; synchronous left at SQLite's FULL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA cache_size = -8000")
    conn.execute(
        "CREATE TABLE task (id INTEGER NOT NULL PRIMARY KEY, queue TEXT NOT NULL, "
        "data BLOB NOT NULL, priority REAL NOT NULL DEFAULT 0.0)"
    )
    conn.execute("CREATE INDEX task_priority_id ON task (priority DESC, id ASC)")
    return conn


async def measure(directory: Path, *, blocks: int, per_block: int) -> dict[str, list[float]]:
    """Seconds per job for each way, one figure per block."""
    from huey import SqliteHuey  # type: ignore[import-untyped]  # the bench extra

    app = submit_only(directory / "conveyor_call.db")
    await app.migrate()
    await _migrate(directory / "conveyor_statement.db")
    statement = _Statement(directory / "conveyor_statement.db")
    huey = SqliteHuey("bench", filename=str(directory / "huey_call.db"))
    huey_noop = huey.task()(_noop)
    huey_conn = _huey_table(directory / "huey_statement.db")
    # What huey stores for a task of one float argument, to the byte: one enqueued, taken.
    huey_noop(0.5)
    data = huey.storage.dequeue()

    # Each way adds n jobs and returns the seconds it took.
    async def conveyor_call(n: int) -> float:
        submit = app.submit
        start = time.perf_counter()
        for i in range(n):
            await submit("noop", {"t": float(i)})
        return time.perf_counter() - start

    async def conveyor_statement(n: int) -> float:
        rows = [statement.values(float(i)) for i in range(n)]  # made before the clock starts
        execute, sql = statement.conn.execute, statement.sql
        start = time.perf_counter()
        for row in rows:
            execute(sql, row)
        return time.perf_counter() - start

    async def huey_call(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            huey_noop(float(i))
        return time.perf_counter() - start

    async def huey_statement(n: int) -> float:
        execute = huey_conn.execute
        start = time.perf_counter()
        for _ in range(n):
            execute(_HUEY_INSERT, ("bench", data, 0))
        return time.perf_counter() - start

    ways: dict[str, Callable[[int], Awaitable[float]]] = dict(
        zip(WAYS, (conveyor_call, conveyor_statement, huey_call, huey_statement), strict=True)
    )
    try:
        for way in ways.values():  # the harness's way: a file that held jobs, emptied
            await way(per_block * 10)
        _empty(directory)
        seconds: dict[str, list[float]] = {way: [] for way in ways}
        for block in range(blocks):
            order = list(ways) if block % 2 == 0 else list(reversed(ways))
            for name in order:
                seconds[name].append(await ways[name](per_block) / per_block)
    finally:
        await app.close()
        statement.conn.close()
        huey_conn.close()
        huey.storage.close()
    return seconds


def _noop(t: float) -> None:
    """huey's task: never run, the benchmark only enqueues."""


async def _migrate(path: Path) -> None:
    app = submit_only(path)
    await app.migrate()
    await app.close()


def _empty(directory: Path) -> None:
    """Delete every job of the four files, as the peer harness does between runs."""
    for name, table in (
        ("conveyor_call", "conveyor_jobs"),
        ("conveyor_statement", "conveyor_jobs"),
        ("huey_call", "task"),
        ("huey_statement", "task"),
    ):
        conn = sqlite3.connect(directory / f"{name}.db", isolation_level=None, timeout=30)
        conn.execute(f"DELETE FROM {table}")
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where the files go (default: a temporary directory)")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--per-block", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        seconds = asyncio.run(measure(Path(scratch), blocks=args.blocks, per_block=args.per_block))
    for way in WAYS:
        print(f"{way}: median {statistics.median(seconds[way]) * 1e6:.1f} µs a job")
    for library in ("conveyor", "huey"):
        whole, alone = seconds[f"{library}, whole call"], seconds[f"{library}, its statement"]
        around = statistics.median(w - s for w, s in zip(whole, alone, strict=True))
        print(f"{library}, around its statement: median {around * 1e6:.1f} µs a job")
    for what in ("whole call", "its statement"):
        ratio = statistics.median(
            h / c
            for c, h in zip(seconds[f"conveyor, {what}"], seconds[f"huey, {what}"], strict=True)
        )
        print(f"conveyor's speed against huey's, {what}: {ratio:.3f}× (median of the blocks)")
    print(f"({args.blocks} blocks of {args.per_block} jobs; load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
