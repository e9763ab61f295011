"""Two releases of one application for the rolling-deploy tests: ``old`` knows only
``send_email``; ``new`` adds ``build_report``. Each run is recorded as in procs.py."""

from __future__ import annotations

import os

from conveyor import Conveyor, JobContext
from tests.apps.procs import record

_URL = os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db")
old = Conveyor(_URL)
new = Conveyor(_URL)


@old.job(name="send_email")
async def old_send_email(ctx: JobContext, n: int) -> int:
    record(ctx, "run")
    return n


@new.job(name="send_email")
async def new_send_email(ctx: JobContext, n: int) -> int:
    record(ctx, "run")
    return n


@new.job(name="build_report", max_attempts=3, backoff="100ms")
async def build_report(ctx: JobContext, n: int) -> int:
    record(ctx, "run")
    return n
