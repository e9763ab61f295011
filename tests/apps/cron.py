"""An application with one cron schedule, for cron tests with real worker processes.

CONVEYOR_TEST_SCHEDULE picks the schedule. ``every-second`` (real time, default grace
and catch-up: what a user gets) or, by default, ``every-minute`` on a clock that runs
fast: every process computes the same time, CONVEYOR_TEST_CLOCK_START (store time at
real time CONVEYOR_TEST_CLOCK_REAL) plus real seconds since then times
CONVEYOR_TEST_CLOCK_SPEED.
"""

from __future__ import annotations

import os
import time

from conveyor import Conveyor, JobContext

_START = float(os.environ.get("CONVEYOR_TEST_CLOCK_START", "0") or 0)
_REAL = float(os.environ.get("CONVEYOR_TEST_CLOCK_REAL", "0") or 0)
_SPEED = float(os.environ.get("CONVEYOR_TEST_CLOCK_SPEED", "1"))


def fast_clock() -> float:
    return _START + (time.time() - _REAL) * _SPEED


app = Conveyor(
    os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db"),
    clock=fast_clock if _START else None,
)


@app.job(queue="ticks")
async def tick(ctx: JobContext) -> None:
    if "CONVEYOR_TEST_RECORD" in os.environ:
        from tests.apps.procs import record

        record(ctx, "tick")


if os.environ.get("CONVEYOR_TEST_SCHEDULE") == "every-second":
    app.schedule("every-second", "* * * * * *", tick)
else:
    # At 600x a tick's default grace (30 s of store time) is 50 ms of real time, which a
    # loaded machine can miss; a generous grace keeps every tick on time, so the test
    # counts exactly-once firing, not the skip policy. An hour (6 s of real time) was
    # not enough: beside a CPU hog and another test process, 27 of 100 ticks once came
    # later than that. A day is 144 s.
    app.schedule("every-minute", "* * * * *", tick, grace="1d")
