"""A process-isolated job type whose child takes longer to start than its time limit."""

from __future__ import annotations

import multiprocessing
import os
import time

from conveyor import Conveyor, JobContext

app = Conveyor(os.environ.get("CONVEYOR_DATABASE_URL", "sqlite:///conveyor-test-unused.db"))

if multiprocessing.parent_process() is not None:
    time.sleep(1.5)  # the child's import: three times the handler's limit below


@app.job(isolation="process", max_attempts=1, timeout="500ms")
def quick(ctx: JobContext) -> str:
    return "done"
