"""``conveyor schedules``, ``queues``, ``prune``, ``migrate`` and ``status``: operating a
database and its cluster."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from conveyor.cli._common import (
    DURATION,
    app_from,
    app_option,
    json_option,
    run_command,
    url_option,
)
from conveyor.cli._target import Target, jobs_target

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor.app.health import Health

# -- schedules and retention ----------------------------------------------------------


@click.group()
def schedules() -> None:
    """List, run, enable and disable cron schedules."""


@schedules.command("list")
@app_option
@url_option
@json_option
def schedules_list(app_spec: str | None, database_url: str | None, as_json: bool) -> None:
    """List schedules with their next tick (declared ones are synced first, given --app)."""
    from conveyor.cli._console import console, print_json, schedules_table

    app = app_from(app_spec, database_url, must_exist=True)

    async def go() -> list[Any]:
        await app.sync_schedules()
        return await app.list_schedules()

    found = run_command(go())
    if as_json:
        print_json({"schedules": found})
    else:
        console.print(schedules_table(found))


@schedules.command("run")
@click.argument("name")
@app_option
@url_option
def schedules_run(name: str, app_spec: str | None, database_url: str | None) -> None:
    """Submit a schedule's job now, outside its ticks."""
    from conveyor.cli._console import console

    app = app_from(app_spec, database_url)
    job = run_command(app.run_schedule(name))
    console.print(f"schedule {name} submitted [bold]{job.id}[/]")


@schedules.command("enable")
@click.argument("name")
@app_option
@url_option
def schedules_enable(name: str, app_spec: str | None, database_url: str | None) -> None:
    """Enable a schedule (its ticks restart from now)."""
    from conveyor.cli._console import console

    app = app_from(app_spec, database_url)
    run_command(app.enable_schedule(name, True))
    console.print(f"schedule {name} enabled")


@schedules.command("disable")
@click.argument("name")
@app_option
@url_option
def schedules_disable(name: str, app_spec: str | None, database_url: str | None) -> None:
    """Disable a schedule: no tick fires until it is enabled again."""
    from conveyor.cli._console import console

    app = app_from(app_spec, database_url)
    run_command(app.enable_schedule(name, False))
    console.print(f"schedule {name} disabled")


@click.command()
@app_option
@url_option
@click.option(
    "--succeeded", type=DURATION, default="1d", show_default=True, help="Keep succeeded jobs."
)
@click.option("--failed", type=DURATION, default="7d", show_default=True, help="Keep failed jobs.")
@click.option(
    "--cancelled", type=DURATION, default="7d", show_default=True, help="Keep cancelled jobs."
)
def prune(
    app_spec: str | None,
    database_url: str | None,
    succeeded: float,
    failed: float,
    cancelled: float,
) -> None:
    """Delete finished job trees older than their retention, in small batches.

    Job types' own retention (given --app) overrides these for their jobs.
    """
    from conveyor.cli._console import console
    from conveyor.store import Retention

    app = app_from(app_spec, database_url, must_exist=True)
    policy = Retention(succeeded=succeeded, failed=failed, cancelled=cancelled)
    deleted = run_command(app.prune(policy))
    console.print(f"pruned {deleted} finished job(s)")


# -- migrate ---------------------------------------------------------------------------


@click.command()
@app_option
@url_option
def migrate(app_spec: str | None, database_url: str | None) -> None:
    """Create or upgrade conveyor's tables."""
    from conveyor.cli._console import console

    app = app_from(app_spec, database_url)
    applied = run_command(app.migrate())
    if applied:
        console.print(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        console.print("database is up to date")


# -- queues ----------------------------------------------------------------------------


@click.group()
def queues() -> None:
    """List queues with their job counts; pause and resume claiming from one."""


@queues.command("list")
@jobs_target
@json_option
def queues_list(target: Target, as_json: bool) -> None:
    """List queues with their job counts per status and whether each is paused."""
    from conveyor.cli._console import console, print_json, queues_table

    found = target.run(lambda jobs: jobs.queues())
    if as_json:
        print_json({"queues": found})
    else:
        console.print(queues_table(found))


@queues.command("pause")
@click.argument("queue")
@jobs_target
def queues_pause(target: Target, queue: str) -> None:
    """Stop workers claiming jobs from QUEUE (running jobs finish)."""
    from conveyor.cli._console import console

    target.run(lambda jobs: jobs.pause(queue))
    console.print(f"queue {queue} paused: workers claim no new job from it")


@queues.command("resume")
@click.argument("queue")
@jobs_target
def queues_resume(target: Target, queue: str) -> None:
    """Let workers claim jobs from QUEUE again."""
    from conveyor.cli._console import console

    target.run(lambda jobs: jobs.resume(queue))
    console.print(f"queue {queue} resumed")


# -- status ----------------------------------------------------------------------------


@click.command()
@app_option
@url_option
@json_option
def status(app_spec: str | None, database_url: str | None, as_json: bool) -> None:
    """Show the cluster's health verdict, its queues and its workers.

    The verdict and counts are those of the API's /health/ready: each worker is live
    while its newest heartbeat is younger than its own lease, dead once silent longer.
    """
    from conveyor.cli._console import (
        console,
        print_json,
        queues_table,
        worker_document,
        workers_table,
    )
    from conveyor.core.health import queue_not_served, type_not_served, unserved_queues

    app = app_from(app_spec, database_url, must_exist=True)

    async def go() -> tuple[Health, list[Any], list[Any], list[Any]]:
        return (
            await app.health(),
            await app.queues(),
            await app.workers(),
            await app.unserved_types(),
        )

    health, queues, workers, types = run_command(go())
    now = health.counts.now
    hint = health.explain(app_spec)
    unserved = unserved_queues(
        {q.name: q.counts.get("queued", 0) for q in queues},
        [w.queues for w in workers if w.state(now) == "live"],
        paused=[q.name for q in queues if q.paused],
    )
    if as_json:
        print_json(
            {
                "health": health.to_dict(),
                "hint": hint,
                "unserved_queues": unserved,
                "unserved_types": {t.type: t.queued for t in types},
                "queues": queues,
                "workers": [worker_document(w, now) for w in workers],
            }
        )
        return
    c = health.counts
    style = {"healthy": "green", "degraded": "yellow", "unhealthy": "red"}[health.status]
    age = f"{health.heartbeat_age:.0f}s ago" if health.heartbeat_age is not None else "never"
    console.print(
        f"[bold {style}]{health.status}[/]: {c.live_workers} live, {c.dead_workers} dead of "
        f"{c.workers} worker(s); last heartbeat {age}; {c.queued} queued ({c.due} due), "
        f"{c.running} running ({c.stale_running} with an expired lease)",
        highlight=False,
    )
    if hint:
        console.print(f"[yellow]note:[/] {hint}", highlight=False)
    for queue, n in unserved.items():
        what = f"{n} job{'' if n == 1 else 's'}"
        console.print(f"[yellow]note:[/] {queue_not_served(queue, what)}", highlight=False)
    for t in types:
        console.print(f"[yellow]note:[/] {type_not_served(t.type, t.queued)}", highlight=False)
    console.print(queues_table(queues))
    console.print(workers_table(workers, now))
