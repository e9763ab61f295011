"""Scripts of cron schedules: synced from code, fired when due, enabled, run at once."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from conveyor.core.cron import (
    Cron,
    Overlap,
    Schedule,
    plan_schedule,
    schedule_job,
    tick_id,
    without_overlap,
)
from conveyor.core.lifecycle import (
    Status,
)
from conveyor.core.model import (
    Job,
)
from conveyor.store.protocol import (
    ScheduleInfo,
)
from conveyor.store.scripts.base import Dialect, Script, _time, now
from conveyor.store.scripts.rows import schedule_info, schedule_params

log = logging.getLogger("conveyor.schedules")


# -- schedules -------------------------------------------------------------------------


def sync_schedules(dialect: Dialect, schedules: Sequence[Schedule]) -> Script[None]:
    """Create or update schedules declared in code (a changed cron restarts its ticks)."""
    if not schedules:
        return
    moment = yield from now(dialect)
    for s in schedules:
        yield "upsert_schedule", schedule_params(s) | {"next_run_at": s.cron.next_after(moment)}


def fire_schedules(dialect: Dialect, limit: int, min_grace: float = 0.0) -> Script[list[str]]:
    """Fire due ticks: advance each schedule by compare-and-set, then insert its jobs.

    A tick at most ``min_grace`` seconds late is on time whatever the schedule's grace.
    Under ``overlap="skip"`` a tick is skipped (the schedule still advances past it) while
    the run of the last fired tick is unfinished; that run's id comes from the schedule's
    name and ``last_run_at``, so finding it is one primary-key lookup.
    """
    created: list[str] = []
    for row in (yield "due_schedules", {"limit": limit}):
        info = schedule_info(dialect, row)
        moment = _time(dialect, row["read_at"], "time")
        firing = plan_schedule(
            info.schedule, next_run_at=info.next_run_at, now=moment, min_grace=min_grace
        )
        ticks, skipped = firing.ticks, 0
        if info.schedule.overlap is not Overlap.ALLOW and ticks:
            previous = yield from _last_run_status(info)
            ticks, skipped = without_overlap(ticks, info.schedule.overlap, previous)
        moved = yield (
            "advance_schedule",
            {
                "name": info.schedule.name,
                "expected": row["next_run_at"],
                "next_run_at": firing.next_run_at,
                "last_run_at": ticks[-1] if ticks else row["last_run_at"],
                "skipped": skipped,
            },
        )
        if not moved:
            continue  # another worker fired these ticks
        if skipped:
            log.debug(
                "schedule %r skipped %d tick(s): its last run is unfinished (overlap=skip)",
                info.schedule.name,
                skipped,
            )
        jobs = [schedule_job(info.schedule, tick) for tick in ticks]
        if jobs:
            submitted = yield from dialect.submit(jobs)
            created.extend(s.job.id for s in submitted if s.created)
    return created


def _last_run_status(info: ScheduleInfo) -> Script[Status | None]:
    """The status of the job fired for a schedule's last tick (None: none, or pruned)."""
    if info.last_run_at is None:
        return None
    job_id = tick_id(info.schedule.name, info.last_run_at)
    rows = yield "schedule_run_status", {"id": job_id}
    return Status(rows[0]["status"]) if rows else None


def set_schedule_enabled(dialect: Dialect, name: str, enabled: bool) -> Script[ScheduleInfo | None]:
    """Enable or disable a schedule; re-enabling restarts its ticks from now."""
    rows = yield "get_schedule", {"name": name}
    if not rows:
        return None
    upcoming = Cron(rows[0]["cron"], rows[0]["timezone"]).next_after((yield from now(dialect)))
    params = {"name": name, "enabled": enabled, "next_run_at": upcoming}
    (row,) = yield "set_schedule_enabled", params
    return schedule_info(dialect, row)


def run_schedule(dialect: Dialect, name: str) -> Script[Job | None]:
    """Submit a schedule's job now, outside its ticks."""
    rows = yield "get_schedule", {"name": name}
    if not rows:
        return None
    moment = yield from now(dialect)
    job = schedule_job(schedule_info(dialect, rows[0]).schedule, moment, manual=True)
    (submitted,) = yield from dialect.submit([job])
    return submitted.job


def schedules(dialect: Dialect) -> Script[list[ScheduleInfo]]:
    """Return every schedule."""
    return [schedule_info(dialect, row) for row in (yield "schedules", {})]
