"""Open a conveyor database at a given wall-clock instant, then close it.

Usage: python -m tests.apps.opener DATABASE_URL START_AT

Several of these started together open one new SQLite file at the same moment: the race
in which SQLite can refuse the switch to WAL mode at once.
"""

from __future__ import annotations

import asyncio
import sys
import time

from conveyor import Conveyor


async def main(url: str, start_at: float) -> None:
    while time.time() < start_at:
        time.sleep(0.0005)  # a busy wait: every process leaves it within a millisecond
    app = Conveyor(url)
    await app.store()
    await app.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
