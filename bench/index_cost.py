"""What the claim index of ``conveyor_jobs`` and the page size cost a whole one-by-one
submit: ``python -m bench.index_cost``.

:mod:`bench.commit_cost` times the bare transaction of one new job; this times the whole
call an application makes, ``await app.submit("noop", {...})``, on files that differ in one
thing each: conveyor's schema as migrated (a new job is written into three b-trees: its
row, keyed by its creation microsecond, its id's unique index and the claim index); the
same without the claim index (two b-trees, as many as SqliteHuey's table); and the schema
as migrated in files of 2048- and 1024-byte pages (SQLite's default is 4096). A file
without the claim index is not a working conveyor database (a claim would read the whole
table): the variant answers what the index's entry costs the submit.

The variants take turns in blocks, in one order and then the reverse, so that the
machine's drift hits them alike; it prints each one's median rate and the median, over
the blocks, of its rate divided by that of the schema as migrated in the same round. A
bare commit overstates what an index costs the whole call: on 2026-11-28, before
migration 14, the index by creation time was 11 µs of a 44 µs commit on tmpfs, and 2 to
5% of the whole call on disk.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from bench.app import submit_only
from conveyor import Conveyor

# name -> (page size, indexes dropped after migrating)
VARIANTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "as migrated": (4096, ()),
    "without the claim index": (4096, ("conveyor_jobs_claim",)),
    "2048-byte pages": (2048, ()),
    "1024-byte pages": (1024, ()),
}


async def _open(directory: Path, name: str, page_size: int, dropped: tuple[str, ...]) -> Conveyor:
    """A migrated file of ``page_size``-byte pages without the ``dropped`` indexes."""
    path = directory / f"{name.replace(' ', '_')}.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA page_size = {page_size}")  # before the first write fixes it
    conn.execute("PRAGMA journal_mode = WAL")
    conn.close()
    app = submit_only(path)
    await app.migrate()
    conn = sqlite3.connect(path)
    for index in dropped:
        conn.execute(f"DROP INDEX {index}")
    conn.commit()
    conn.close()
    return app


async def measure(directory: Path, *, blocks: int, per_block: int) -> dict[str, list[float]]:
    """Submits a second, for each variant, one figure per block."""
    apps = {
        name: await _open(directory, name, page_size, dropped)
        for name, (page_size, dropped) in VARIANTS.items()
    }
    rates: dict[str, list[float]] = {name: [] for name in apps}
    try:
        for block in range(blocks):
            names = list(apps) if block % 2 == 0 else list(reversed(apps))
            for name in names:
                submit = apps[name].submit
                start = time.perf_counter()
                for _ in range(per_block):
                    await submit("noop", {"t": 0.0})
                rates[name].append(per_block / (time.perf_counter() - start))
    finally:
        for app in apps.values():
            await app.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="where the files go (default: a temporary directory)")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--per-block", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        rates = asyncio.run(measure(Path(scratch), blocks=args.blocks, per_block=args.per_block))
    base = rates["as migrated"]
    for name, figures in rates.items():
        ratio = statistics.median(r / b for r, b in zip(figures, base, strict=True))
        print(
            f"{name}: median {statistics.median(figures):,.0f} submits/s, "
            f"{ratio:.3f}× as migrated ({len(figures)} blocks of {args.per_block})"
        )


if __name__ == "__main__":
    main()
