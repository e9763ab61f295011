"""One submit at a time on SQLite, call by call: ``python -m bench.submit_latency``.

On a fresh SQLite file (``--file``; put it on tmpfs, e.g. ``/dev/shm/x.db``, to see the
calls' own cost without the disk's fsync), makes ``--calls`` submits of the ``sleep``
type one after the other, ``--way async`` (``await app.submit``, as the peer bench's
one-by-one enqueue) or ``--way sync`` (``app.sync.submit``, a blocking caller), and
prints the median, 25th and 90th percentile latency of a call, the rate over the calls,
and this process's CPU time per call. A disk's fsync varies from call to call far more
than the total shows: the median call is the steadier figure to compare builds with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable

from bench.app import build

PAYLOAD = {"seconds": 0.0}


def _fresh(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        try:
            os.remove(path + suffix)
        except FileNotFoundError:
            pass


async def _async_calls(url: str, calls: int) -> list[float]:
    app = build(url)
    try:
        await app.migrate()
        await app.submit("sleep", PAYLOAD)  # opens the store
        submit, clock, took = app.submit, time.perf_counter, []
        for _ in range(calls):
            start = clock()
            await submit("sleep", PAYLOAD)
            took.append(clock() - start)
        return took
    finally:
        await app.close()


def _sync_calls(url: str, calls: int) -> list[float]:
    app = build(url)
    sync = app.sync
    try:
        sync.migrate()
        sync.submit("sleep", PAYLOAD)  # opens the portal's store
        submit: Callable[..., object] = sync.submit
        clock, took = time.perf_counter, []
        for _ in range(calls):
            start = clock()
            submit("sleep", PAYLOAD)
            took.append(clock() - start)
        return took
    finally:
        sync.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.submit_latency", description=__doc__)
    parser.add_argument("--file", default="/tmp/conveyor-submit-latency.db")
    parser.add_argument("--way", choices=("async", "sync"), default="async")
    parser.add_argument("--calls", type=int, default=1500)
    args = parser.parse_args()
    _fresh(args.file)
    url = f"sqlite:///{args.file}"
    cpu = time.process_time()
    if args.way == "async":
        took = asyncio.run(_async_calls(url, args.calls))
    else:
        took = _sync_calls(url, args.calls)
    cpu = (time.process_time() - cpu) / args.calls * 1e6
    took.sort()
    n = len(took)
    print(
        f"{args.way}: median {took[n // 2] * 1e6:.0f} µs, p25 {took[n // 4] * 1e6:.0f}, "
        f"p90 {took[int(n * 0.9)] * 1e6:.0f}; {n / sum(took):,.0f} calls/s; "
        f"CPU {cpu:.0f} µs per call (start-up included)"
    )
    _fresh(args.file)


if __name__ == "__main__":
    main()
