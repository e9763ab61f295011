"""``conveyor submit`` and ``conveyor jobs``: submit, list, show, cancel and retry jobs."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from conveyor.cli._common import (
    DURATION,
    EXIT_JOB_FAILED,
    EXIT_USAGE,
    SHOWN_STATUSES,
    fail,
    json_option,
)
from conveyor.cli._target import (
    JobsTarget,
    Target,
    client_id,
    exit_interrupted,
    jobs_target,
    parse_payload,
)
from conveyor.core.filter import JobFilter
from conveyor.core.lifecycle import Status

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor.cli._console import ShownJob
    from conveyor.core.model import Attempt


@click.command()
@click.argument("job_type", metavar="TYPE")
@click.option("--payload", "-p", default="{}", help="JSON object of keyword arguments.")
@click.option(
    "--id",
    "job_id",
    default=None,
    callback=lambda _ctx, _param, value: client_id(value),
    help="Client id (idempotent): letters, digits and . _ : @ + = -",
)
@click.option("--queue", default=None, help="Queue (default: the type's).")
@click.option("--priority", type=int, default=None, help="Lower runs first.")
@click.option("--delay", type=DURATION, default=None, help="Run after a delay such as 30s or 5m.")
@click.option("--wait", is_flag=True, help="Wait for the job to end, with a progress bar.")
@click.option(
    "--timeout",
    "wait_timeout",
    type=DURATION,
    default=None,
    help="With --wait: give up after this long (e.g. 90s, 15m).",
)
@jobs_target(creates=True)
def submit(
    target: Target,
    job_type: str,
    payload: str,
    job_id: str | None,
    queue: str | None,
    priority: int | None,
    delay: float | None,
    wait: bool,
    wait_timeout: float | None,
) -> None:
    """Submit a job of TYPE; the payload is checked against the handler's signature.

    With --url the server checks it (no --app needed there). With --wait, Ctrl-C stops
    waiting (exit 130); the job keeps running.
    """
    from conveyor.cli._console import console, print_job

    if not target.remote and not target.has_app:
        fail(
            "submit needs the application to check the payload: pass --app module:attr "
            "or set CONVEYOR_APP",
            EXIT_USAGE,
        )
    data = parse_payload(payload)
    submitted: list[ShownJob] = []

    async def go(jobs: JobsTarget) -> ShownJob:
        job = await jobs.submit(
            job_type, data, id=job_id, queue=queue, priority=priority, delay=delay
        )
        submitted.append(job)
        console.print(f"submitted [bold]{job.id}[/] ({job.type}, {job.status.value})")
        if wait:
            await _wait_for(target, job, wait_timeout)
        return job

    try:
        job = target.run(go)
    except KeyboardInterrupt:
        last = submitted[0] if submitted else None
        exit_interrupted(last.id if last else None, last.status.value if last else None)
    if wait:
        print_job(job, attempts=None)
        if job.status is not Status.SUCCEEDED:
            sys.exit(EXIT_JOB_FAILED)


async def _wait_for(target: Target, job: ShownJob, timeout: float | None) -> None:
    """Follow a job until it ends; warn at once, and fail after ``timeout``, if no worker
    is live to run it."""
    from rich.text import Text

    from conveyor.cli._console import err_console, follow, status_text

    if job.status is Status.QUEUED:
        hint = await target.no_worker_hint(job.record.queue)
        if hint:
            err_console.print(Text.assemble(("warning:", "bold yellow"), " ", hint))
    if await follow(job, timeout):
        return
    message = f"job {job.id} still {status_text(job.record)} after {timeout:g}s"
    if job.status is Status.QUEUED:
        hint = await target.no_worker_hint(job.record.queue)
        if hint:
            message += f": {hint}"
    fail(message, EXIT_JOB_FAILED)


# -- jobs ------------------------------------------------------------------------------


@click.group()
def jobs() -> None:
    """List, show, cancel and retry jobs."""


def _status_filter(words: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    """Stored statuses to ask for, and the shown statuses (scheduled, retrying) to keep."""
    known = [s.value for s in Status]
    stored: list[str] = []
    shown: set[str] = set()
    for word in words:
        word = word.strip().lower()
        if word in SHOWN_STATUSES:
            shown.add(word)
            stored.append(Status.QUEUED.value)
        elif word in known:
            stored.append(word)
        else:
            raise click.BadParameter(
                f"unknown status {word!r}; use one of {', '.join([*known, *SHOWN_STATUSES])}",
                param_hint="--status",
            )
    return tuple(dict.fromkeys(stored)), frozenset(shown)


# Scheduled and retrying jobs are picked among this many newest queued ones.
_SHOWN_STATUS_WINDOW = 1000


@jobs.command("list")
@click.option(
    "--status",
    "-s",
    multiple=True,
    help="Filter by status (repeatable): pending, queued, scheduled, retrying, running, "
    "waiting, succeeded, failed, cancelled.",
)
@click.option("--type", "job_type", default=None, help="Filter by job type.")
@click.option("--queue", default=None, help="Filter by queue.")
@click.option(
    "--children",
    "--include-children",
    "include_children",
    is_flag=True,
    help="Also list jobs spawned by other jobs (by default only top-level jobs).",
)
@click.option("--parent", "parent_id", default=None, metavar="ID", help="The children of ID.")
@click.option("--root", "root_id", default=None, metavar="ID", help="Every job below root ID.")
@click.option("--limit", default=50, show_default=True, help="At most this many jobs.")
@json_option
@jobs_target
def jobs_list(
    target: Target,
    status: tuple[str, ...],
    job_type: str | None,
    queue: str | None,
    include_children: bool,
    parent_id: str | None,
    root_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first (by creation time): top-level ones unless --children, or
    the children of --parent ID, or the jobs below --root ID.

    scheduled and retrying are queued jobs due later (retrying: after a failed attempt),
    as the tables show them.
    """
    from conveyor.cli._console import console, job_document, jobs_table, print_json, status_text

    stored, shown = _status_filter(status)
    # scheduled/retrying (without queued itself) read queued jobs and keep those due later.
    only_shown = bool(shown) and Status.QUEUED.value not in [w.strip().lower() for w in status]
    chosen = JobFilter.of(
        status=stored,
        type=job_type,
        queue=queue,
        include_children=include_children,
        parent_id=parent_id,
        root_id=root_id,
    )
    found = target.run(
        lambda jobs: jobs.list_jobs(
            chosen, limit=max(limit, _SHOWN_STATUS_WINDOW) if only_shown else limit
        )
    )
    if only_shown:
        found = [
            j for j in found if j.status is not Status.QUEUED or status_text(j.record) in shown
        ][:limit]
    if as_json:
        print_json({"jobs": [job_document(j.record) for j in found]})
    else:
        console.print(jobs_table(found, title=f"{len(found)} job(s)"))


# Sub-jobs `jobs show` lists under a job (all of them are counted).
_SHOWN_CHILDREN = 20


@jobs.command("show")
@click.argument("job_id")
@click.option(
    "--follow",
    "-f",
    "following",
    is_flag=True,
    help="Follow the job until it ends (a parent: the jobs below it, done/total).",
)
@click.option("--traceback", "tracebacks", is_flag=True, help="Print each attempt's traceback.")
@json_option
@jobs_target
def jobs_show(
    target: Target, job_id: str, following: bool, tracebacks: bool, as_json: bool
) -> None:
    """Show one job with its attempts, the counts of the jobs below it and its first
    sub-jobs (--follow: a live progress bar until it ends; Ctrl-C stops following, exit
    130)."""
    from conveyor.cli._console import console, job_document, jobs_table, print_job, print_json
    from conveyor.core.ids import sibling_order

    shown: list[ShownJob] = []

    async def go(jobs: JobsTarget) -> tuple[ShownJob, list[Attempt], str | None, list[Any]]:
        job = await jobs.get(job_id)
        shown.append(job)
        if following and not job.terminal:
            await _wait_for(target, job, None)
        hint = (
            await target.no_worker_hint(job.record.queue) if job.status is Status.QUEUED else None
        )
        below = job.record.below
        children = await jobs.children(job_id, limit=_SHOWN_CHILDREN) if below else []
        # In natural order (.2 before .10), as the dashboard's tree lists them.
        ordered = sorted(children, key=lambda c: sibling_order(job.id, c.id))
        return job, await job.attempts(), hint, ordered

    try:
        job, attempts, hint, children = target.run(go)
    except KeyboardInterrupt:
        exit_interrupted(job_id, shown[0].status.value if shown else None)
    if as_json:
        document = job_document(job.record, attempts)
        document["hint"] = hint
        document["children"] = [job_document(c.record) for c in children]
        print_json(document)
    else:
        print_job(job, attempts, tracebacks=tracebacks, note=hint)
        if children:
            below = job.record.below
            title = f"sub-jobs (newest {len(children)} of {below.total if below else '?'} below)"
            console.print(jobs_table(children, title=title))


@jobs.command("cancel")
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="Wait until a running job has actually stopped.")
@click.option(
    "--timeout",
    "wait_timeout",
    type=DURATION,
    default=None,
    help="With --wait: give up after this long (exit 1).",
)
@jobs_target
def jobs_cancel(target: Target, job_id: str, wait: bool, wait_timeout: float | None) -> None:
    """Cancel a job (a running one is asked to stop; --wait waits until it has)."""
    from conveyor.cli._console import console, follow

    async def go(jobs: JobsTarget) -> tuple[ShownJob, bool]:
        job = await jobs.cancel(job_id)
        if not (wait and job.status in (Status.RUNNING, Status.WAITING)):
            return job, False
        console.print(f"job {job.id} is {job.status.value}: waiting for it to stop")
        if not await follow(job, wait_timeout):
            fail(f"job {job.id} still running after {wait_timeout:g}s", EXIT_JOB_FAILED)
        return job, True

    try:
        job, waited = target.run(go)
    except KeyboardInterrupt:
        exit_interrupted(job_id, "running")
    if job.status is Status.CANCELLED:
        console.print(f"job {job.id} cancelled" + (" and stopped" if waited else ""))
    elif job.status is Status.RUNNING:
        console.print(f"job {job.id} is running: its worker was asked to stop it")
    elif job.status is Status.WAITING:
        console.print(
            f"job {job.id} is waiting for the jobs running below it, which were asked to "
            "stop: it ends cancelled once they have"
        )
    elif waited:
        # It ended some other way while its worker was stopping it.
        fail(f"job {job.id} ended {job.status.value} before it could be stopped", EXIT_JOB_FAILED)
    else:
        fail(f"job {job.id} is already {job.status.value}", EXIT_JOB_FAILED)


@jobs.command("retry")
@click.argument("job_id")
@click.option(
    "--failed-children",
    is_flag=True,
    help="Retry every failed job below JOB_ID instead (its failed parents wait again).",
)
@jobs_target
def jobs_retry(target: Target, job_id: str, failed_children: bool) -> None:
    """Retry a failed or cancelled job as a new job in its place (the old one is kept;
    a parent that failed because of it waits again). --failed-children: every failed
    job below JOB_ID, in one go."""
    from conveyor.cli._console import console

    if failed_children:
        retried = target.run(lambda jobs: jobs.retry_failed_children(job_id))
        for job in retried:
            console.print(f"job {job.record.retry_of} retried as [bold]{job.id}[/]")
        console.print(f"{len(retried)} failed job(s) below {job_id} retried")
        return
    job = target.run(lambda jobs: jobs.retry(job_id))
    console.print(f"job {job_id} retried as [bold]{job.id}[/] (retry {job.record.retry_count})")
