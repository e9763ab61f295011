"""``conveyor demo``: a database with jobs in every state, to look at."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from conveyor.cli._common import EXIT_USAGE, fail, load_app, run_command

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor.app.client import Conveyor

# -- demo ------------------------------------------------------------------------------


@click.command()
@click.argument("app_spec", metavar="APP", default="examples.app:app")
@click.option("--concurrency", default=4, show_default=True)
def demo(app_spec: str, concurrency: int) -> None:
    """Submit APP's demo jobs and watch a worker run them, live.

    APP's module provides the jobs through a function ``seed(app)`` that submits them
    (sync or async). The demo ends when every job it submitted has ended.
    """
    app = load_app(app_spec)
    module = sys.modules[app_spec.partition(":")[0]]
    seed: Callable[[Conveyor], Any] | None = getattr(module, "seed", None)
    if seed is None:
        fail(f"{app_spec} has no seed(app) function that submits demo jobs", EXIT_USAGE)
    run_command(_demo(app, app_spec, seed, concurrency))


async def _demo(
    app: Conveyor, app_spec: str, seed: Callable[[Conveyor], Any], concurrency: int
) -> None:
    import asyncio

    from rich.live import Live

    from conveyor.cli._console import console, jobs_table
    from conveyor.worker import WorkerOptions

    submitted = seed(app)
    if inspect.isawaitable(submitted):
        submitted = await submitted
    ids = [j.id for j in submitted]
    worker_ = app.worker(
        WorkerOptions(concurrency=concurrency, poll_interval=0.2, rescue_interval=1.0)
    )
    running = asyncio.create_task(worker_.run())
    try:
        with Live(console=console, refresh_per_second=8) as live:
            while True:
                handles = [await app.get(i) for i in ids]
                live.update(jobs_table(handles, title="conveyor demo: jobs moving"))
                if all(h.terminal for h in handles) or running.done():
                    break
                await asyncio.sleep(0.25)
    finally:
        worker_.stop()
        await running
    counts: dict[str, int] = {}
    for h in handles:
        counts[h.status.value] = counts.get(h.status.value, 0) + 1
    console.print(
        "done: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f". Inspect one with: conveyor jobs show {ids[0]} --database-url {app.url}"
    )
    _, secret = await app.create_token(
        tenant="default", role="admin", name="created by conveyor demo for the dashboard"
    )
    console.print(
        "\nSee them in the dashboard: start the server with\n"
        f"  conveyor serve {app_spec} --database-url {app.url}\n"
        "then open http://127.0.0.1:8000/ui/ and sign in with this admin token "
        "(shown this once):",
        highlight=False,
    )
    console.print(secret, highlight=False, soft_wrap=True)
