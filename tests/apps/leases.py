"""Race for one named lease many times; record each holding outside the database.

Usage: python -m tests.apps.leases DATABASE_URL ROUNDS RECORD_FILE
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from conveyor import Conveyor, LeaseHeld


async def main(url: str, rounds: int, path: str) -> None:
    app = Conveyor(url)
    held = 0
    try:
        for _ in range(rounds):
            try:
                async with app.lease("race", ttl=5) as lease:
                    start = time.time()
                    await asyncio.sleep(0.001)
                    end = time.time()
                    with open(path, "a") as out:
                        out.write(f"{os.getpid()} {lease.token} {start:.6f} {end:.6f}\n")
                    held += 1
            except LeaseHeld:
                await asyncio.sleep(0)
    finally:
        await app.close()
    print(held)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
