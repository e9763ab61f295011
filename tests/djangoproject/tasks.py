"""The test project's tasks (found by the worker as ``tests.djangoproject.tasks``)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from django.db import connections
from django.tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(max_attempts=2)
def fail(message: str) -> None:
    raise ValueError(message)


@task(queue_name="other", priority=50)
def where_am_i(alias: str) -> dict[str, Any]:
    """Queries Django's database ``alias`` from the task's thread."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT 1")
        (one,) = cursor.fetchone()
    return {"vendor": connections[alias].vendor, "one": one}


@task
async def async_add(a: int, b: int) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"sum": a + b, "in_loop": asyncio.get_running_loop().is_running()}


@task(takes_context=True, max_attempts=3)
def with_context(context: Any, fail_first: bool) -> dict[str, Any]:
    """Fails its first attempt when asked; reports what its context says."""
    context.job.progress(1, 2, "half way")
    if fail_first and context.attempt == 1:
        raise ValueError("first attempt fails")
    return {
        "attempt": context.attempt,
        "result_id": context.task_result.id,
        "worker_ids": context.task_result.worker_ids,
        "errors": [e.exception_class_path for e in context.task_result.errors],
    }


@task(max_attempts=3)
def block_until(folder: str) -> str:
    """Marks each start, waits for ``release`` to exist, marks its end."""
    here = Path(folder)
    with open(here / "starts", "a") as f:
        f.write(f"{os.getpid()}\n")
    while not (here / "release").exists():
        time.sleep(0.05)
    with open(here / "ends", "a") as f:
        f.write(f"{os.getpid()}\n")
    return "released"
