"""What the ``conveyor`` command prints: rich tables of jobs, schedules, tokens, queues
and workers, one job in detail, and a live progress bar while following a job; and the
same things as JSON documents for ``--json``.

On a terminal the tables fit its width. Anywhere else (a pipe, a file, CI logs) lines are
never wrapped, so ids and messages stay whole on one line for grep and log shippers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO

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
from conveyor.core.model import Attempt, Job, TreeCounts
from conveyor.core.model import Progress as ProgressRecord
from conveyor.store import QueueInfo, ScheduleInfo, WorkerInfo

# Wide enough that nothing wraps; rich sizes tables to their content, not to this.
_UNWRAPPED = 100_000


def _console(stream: TextIO, *, stderr: bool) -> Console:
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=_UNWRAPPED, soft_wrap=True)


console = _console(sys.stdout, stderr=False)
err_console = _console(sys.stderr, stderr=True)


def jsonable(value: Any, *, omit: frozenset[str] = frozenset()) -> Any:
    """Turn records (dataclasses), enums, datetimes, tuples and mappings into JSON values.

    ``omit`` names dataclass fields left out (a lease token, a secret's hash).
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: jsonable(getattr(value, f.name), omit=omit)
            for f in dataclasses.fields(value)
            if f.name not in omit
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, omit=omit) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v, omit=omit) for v in value]
    return value


def print_json(document: Any) -> None:
    """Write one JSON document on stdout (plain text: no markup, colour or wrapping)."""
    sys.stdout.write(json.dumps(jsonable(document), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


# A job's fields that belong to the worker holding it, not to a reader.
_JOB_INTERNALS = frozenset({"lease_token", "lease_owner", "lease_expires_at"})


def job_document(job: Job, attempts: Sequence[Attempt] | None = None) -> dict[str, Any]:
    """A job as ``--json`` prints it: its fields, its status as the tables show it
    (``shown_status``: scheduled, retrying...) and, if given, its attempts."""
    document: dict[str, Any] = jsonable(job, omit=_JOB_INTERNALS)
    document["shown_status"] = status_text(job)
    if job.below is not None:
        document["below"] = job.below.to_dict()
    if attempts is not None:
        document["attempts"] = jsonable(list(attempts))
    return document


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
    columns = ("id", "type", "queue", "status", "attempt", "progress", "by", "result / error")
    for column in columns:
        table.add_column(column, overflow="fold")
    for job in found:
        r = job.record
        progress = ""
        if r.below is not None:
            progress = f"{r.below.done}/{r.below.total} below"
        elif r.progress is not None:
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
            r.submitted_by,
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
        ("submitted by", r.submitted_by),
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
    rows.extend(_tree_rows(r))
    if r.state is not None:
        rows.append(("state", json.dumps(r.state)))
    if r.status is Status.SUCCEEDED or r.result is not None:
        rows.append(("result", json.dumps(r.result)))
    if r.error:
        rows.append(("error", r.error))
    return rows


def _tree_rows(r: Job) -> list[tuple[str, str]]:
    """Where a job sits in its tree and in its chain of retries, and what is below it."""
    rows = [(k, v) for k, v in (("parent", r.parent_id), ("root", r.root_id)) if v]
    if r.retry_of:
        rows.append(("retry", f"{r.retry_count} of {r.retry_of}"))
    if r.retried_by:
        rows.append(("retried as", r.retried_by))
    if r.below is not None:
        counts = ", ".join(
            f"[{STATUS_STYLE[k]}]{v} {k}[/]" for k, v in r.below.by_status().items() if v
        )
        rows.append(("below", f"{r.below.done}/{r.below.total} done: {counts or 'none'}"))
    return rows


def print_job(
    job: ShownJob,
    attempts: list[Attempt] | None,
    *,
    tracebacks: bool = False,
    note: str | None = None,
) -> None:
    """Print one job's fields, then its attempts (if given) and their tracebacks (if asked).

    ``note`` is a hint printed under the fields, e.g. that no worker is live.
    """
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in _job_rows(job.record):
        table.add_row(key, value)
    console.print(table)
    if note:
        console.print(f"[yellow]note:[/] {note}", highlight=False)
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
    if tracebacks:
        shown = [a for a in attempts or () if a.traceback]
        if not shown:
            console.print("no attempt recorded a traceback", highlight=False)
        for a in shown:
            console.print(f"[bold]traceback of attempt {a.number}[/] ({a.outcome.value}):")
            console.print(a.traceback, markup=False, highlight=False)


def _counts_message(below: TreeCounts) -> str:
    return " ".join(f"{v} {k}" for k, v in below.by_status().items() if v)


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
                    below, p = job.record.below, job.progress
                    done: float
                    total: float | None
                    if below is not None:  # a parent: the jobs below it
                        done, total, message = below.done, below.total, _counts_message(below)
                    else:
                        done = p.done if p else 0
                        total = p.total if p and p.total else None
                        message = (p.message or "") if p else ""
                    bar.update(
                        task,
                        description=job.status.value,
                        completed=done,
                        total=total,
                        message=message,
                    )
                    await asyncio.sleep(0.2)
        except TimeoutError:
            return False
    return True


def schedules_table(found: Sequence[ScheduleInfo]) -> Table:
    table = Table(title=f"{len(found)} schedule(s)", title_justify="left")
    columns = ("name", "cron", "timezone", "job type", "catch-up", "overlap", "enabled", "next")
    for column in (*columns, "last"):
        table.add_column(column)
    for info in found:
        s = info.schedule
        table.add_row(
            s.name,
            s.cron.expression,
            s.cron.timezone,
            s.type,
            s.catch_up.value,
            f"{s.overlap.value} ({info.skipped_ticks} skipped)"
            if info.skipped_ticks
            else s.overlap.value,
            "yes" if info.enabled else "[red]no[/]",
            info.next_run_at.isoformat(timespec="seconds"),
            info.last_run_at.isoformat(timespec="seconds") if info.last_run_at else "",
        )
    return table


def tokens_table(found: Sequence[Token], now: datetime) -> Table:
    table = Table(title=f"{len(found)} token(s)", title_justify="left")
    columns = ("id", "tenant", "role", "name", "state", "created", "expires", "last used")
    for column in columns:
        table.add_column(column, overflow="fold")
    for t in found:
        table.add_row(
            t.id,
            t.tenant,
            t.role.value,
            t.name or "",
            t.state_at(now),
            _when(t.created_at),
            _when(t.expires_at) or "never",
            _when(t.last_used_at) or "never",
        )
    return table


def _when(at: datetime | None) -> str:
    return at.isoformat(timespec="seconds") if at else ""


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


_WORKER_STATE_STYLE = {"live": "green", "dead": "red", "stopped": "bright_black"}


def workers_table(workers: Sequence[WorkerInfo], now: datetime) -> Table:
    """Workers with their state judged at ``now`` (the database's time) by their own lease."""
    table = Table(title="workers", title_justify="left")
    for column in ("id", "host", "pid", "queues", "concurrency", "lease", "last heartbeat"):
        table.add_column(column)
    table.add_column("state")
    for w in workers:
        state = w.state(now)
        table.add_row(
            w.id,
            w.hostname,
            str(w.pid),
            ",".join(w.queues),
            str(w.concurrency),
            f"{w.lease:g}s",
            w.heartbeat_at.isoformat() if w.heartbeat_at else "",
            f"[{_WORKER_STATE_STYLE[state]}]{state}[/]",
        )
    return table


def worker_document(w: WorkerInfo, now: datetime) -> dict[str, Any]:
    """A worker as ``status --json`` prints it, with its state judged at ``now``."""
    document: dict[str, Any] = jsonable(w)
    document["state"] = w.state(now)
    return document
