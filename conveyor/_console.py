"""What the ``conveyor`` command prints: rich tables of jobs, schedules, tokens, queues
and workers, one job in detail, and a live progress bar while following a job."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from conveyor.core.auth import Token
from conveyor.core.lifecycle import Status
from conveyor.core.model import Attempt, Job
from conveyor.core.model import Progress as ProgressRecord
from conveyor.store import QueueInfo, ScheduleInfo, WorkerInfo

console = Console()
err_console = Console(stderr=True)

STATUS_STYLE = {
    "pending": "magenta",
    "queued": "cyan",
    "running": "yellow",
    "waiting": "blue",
    "succeeded": "green",
    "failed": "red",
    "cancelled": "bright_black",
}


class ShownJob(Protocol):
    """A job the commands print and follow: a local handle, or one read over HTTP."""

    record: Job

    @property
    def id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def status(self) -> Status: ...
    @property
    def progress(self) -> ProgressRecord | None: ...
    @property
    def terminal(self) -> bool: ...
    async def refresh(self) -> Any: ...
    async def attempts(self) -> list[Attempt]: ...


def status_text(r: Job) -> str:
    """The status as the dashboard shows it: a queued job due later is scheduled or retrying."""
    # Display only: the wall clock decides a label here, never a lease.
    if r.status is Status.QUEUED and r.run_at > datetime.now(UTC):
        return "retrying" if r.attempt > 0 else "scheduled"
    return r.status.value


def jobs_table(found: Sequence[ShownJob], *, title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("id", "type", "queue", "status", "attempt", "progress", "result / error"):
        table.add_column(column, overflow="fold")
    for job in found:
        r = job.record
        progress = ""
        if r.progress is not None:
            p = r.progress
            progress = f"{p.done:g}/{p.total:g}" if p.total else f"{p.done:g}"
            if p.fraction is not None:
                progress += f" {p.fraction:.0%}"
        outcome = r.error or "" if r.status is not Status.SUCCEEDED else json.dumps(r.result)
        table.add_row(
            r.id,
            r.type,
            r.queue,
            f"[{STATUS_STYLE[r.status.value]}]{status_text(r)}[/]",
            f"{r.attempt}/{r.max_attempts}",
            progress,
            (outcome or "")[:80],
        )
    return table


def _job_rows(r: Job) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [
        ("id", r.id),
        ("type", r.type),
        ("queue", r.queue),
        ("status", f"[{STATUS_STYLE[r.status.value]}]{r.status.value}[/]"),
        ("attempt", f"{r.attempt} of {r.max_attempts}"),
        ("payload", json.dumps(r.payload)),
        ("created", r.created_at.isoformat()),
        ("run at", r.run_at.isoformat()),
    ]
    if r.started_at:
        rows.append(("started", r.started_at.isoformat()))
    if r.finished_at:
        rows.append(("finished", r.finished_at.isoformat()))
    if r.progress:
        p = r.progress
        bar = ""
        if p.fraction is not None:
            filled = int(p.fraction * 30)
            bar = (
                f"[green]{'█' * filled}[/][bright_black]{'░' * (30 - filled)}[/] {p.fraction:.0%} "
            )
        rows.append(("progress", f"{bar}{p.done:g}/{p.total or 0:g} {p.message or ''}"))
    if r.state is not None:
        rows.append(("state", json.dumps(r.state)))
    if r.status is Status.SUCCEEDED:
        rows.append(("result", json.dumps(r.result)))
    if r.error:
        rows.append(("error", r.error))
    return rows


def print_job(job: ShownJob, attempts: list[Attempt] | None) -> None:
    """Print one job's fields, then its attempts (if given)."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in _job_rows(job.record):
        table.add_row(key, value)
    console.print(table)
    if attempts:
        history = Table(title="attempts", title_justify="left")
        for column in ("#", "worker", "started", "finished", "outcome", "error"):
            history.add_column(column, overflow="fold")
        for a in attempts:
            history.add_row(
                str(a.number),
                a.worker_id or "",
                a.started_at.isoformat() if a.started_at else "",
                a.finished_at.isoformat() if a.finished_at else "",
                a.outcome.value,
                (a.error or "")[:100],
            )
        console.print(history)


async def follow(job: ShownJob, timeout: float | None) -> bool:
    """Poll a job until it is terminal, drawing its progress as a bar with rate and ETA.

    Return False if it is still unfinished after ``timeout`` seconds.
    """
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[message]}"),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task(job.status.value, total=None, message="")
        try:
            async with asyncio.timeout(timeout):
                while not (await job.refresh()).terminal:
                    p = job.progress
                    bar.update(
                        task,
                        description=job.status.value,
                        completed=p.done if p else 0,
                        total=p.total if p and p.total else None,
                        message=(p.message or "") if p else "",
                    )
                    await asyncio.sleep(0.2)
        except TimeoutError:
            return False
    return True


def schedules_table(found: Sequence[ScheduleInfo]) -> Table:
    table = Table(title=f"{len(found)} schedule(s)", title_justify="left")
    for column in ("name", "cron", "timezone", "job type", "catch-up", "enabled", "next", "last"):
        table.add_column(column)
    for info in found:
        s = info.schedule
        table.add_row(
            s.name,
            s.cron.expression,
            s.cron.timezone,
            s.type,
            s.catch_up.value,
            "yes" if info.enabled else "[red]no[/]",
            info.next_run_at.isoformat(timespec="seconds"),
            info.last_run_at.isoformat(timespec="seconds") if info.last_run_at else "",
        )
    return table


def tokens_table(found: Sequence[Token]) -> Table:
    table = Table(title=f"{len(found)} token(s)", title_justify="left")
    for column in ("id", "tenant", "role", "name", "created", "last used", "revoked"):
        table.add_column(column, overflow="fold")
    for t in found:
        table.add_row(
            t.id,
            t.tenant,
            t.role.value,
            t.name or "",
            t.created_at.isoformat(timespec="seconds"),
            t.last_used_at.isoformat(timespec="seconds") if t.last_used_at else "",
            t.revoked_at.isoformat(timespec="seconds") if t.revoked_at else "",
        )
    return table


def queues_table(queues: Sequence[QueueInfo]) -> Table:
    table = Table(title="queues", title_justify="left")
    table.add_column("queue")
    table.add_column("paused")
    for s in Status:
        table.add_column(s.value, justify="right")
    for q in queues:
        table.add_row(
            q.name, "yes" if q.paused else "", *(str(q.counts.get(s.value, 0)) for s in Status)
        )
    return table


def workers_table(workers: Sequence[WorkerInfo]) -> Table:
    table = Table(title="workers", title_justify="left")
    for column in ("id", "host", "pid", "queues", "concurrency", "last heartbeat", "state"):
        table.add_column(column)
    for w in workers:
        table.add_row(
            w.id,
            w.hostname,
            str(w.pid),
            ",".join(w.queues),
            str(w.concurrency),
            w.heartbeat_at.isoformat() if w.heartbeat_at else "",
            "stopped" if w.stopped_at else "running",
        )
    return table
