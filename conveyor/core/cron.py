"""Cron arithmetic: which ticks of a schedule are due, and what a catch-up policy fires.

Pure functions of the expression, the timezone and the times given; the maintenance duty
passes the database's now. Expressions have five fields (minute hour day month weekday)
or six with seconds first (``*/10 * * * * *``: every ten seconds).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from conveyor.core.lifecycle import Status
from conveyor.core.model import NewJob

# Enough to catch up any realistic downtime; bounds the work after a very long one.
_MAX_TICKS = 10_000


class CatchUp(StrEnum):
    """What a schedule fires for ticks missed while no worker was running."""

    SKIP = "skip"  # fire none of them; resume with the next tick
    ONCE = "once"  # fire one job for all of them
    BACKFILL = "backfill"  # fire one job per missed tick, the latest backfill_limit of them


class Overlap(StrEnum):
    """What a tick does while the schedule's previous run has not finished.

    The names of Temporal's schedule overlap policies; ``skip`` is APScheduler's
    ``max_instances=1`` (or Oban's cron with a unique job that spans executing states).
    """

    ALLOW = "allow"  # fire every tick, however many earlier runs are still unfinished
    SKIP = "skip"  # skip the tick while the previous run is pending, queued, running or waiting


@dataclass(frozen=True, slots=True)
class Cron:
    """A validated cron expression in a timezone."""

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        fields = self.expression.split()
        if len(fields) not in (5, 6):
            raise ValueError(
                f"invalid cron expression {self.expression!r}: use five fields "
                "(minute hour day month weekday) or six with seconds first"
            )
        try:
            ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown timezone {self.timezone!r}: use an IANA name such as 'Europe/Paris'"
            ) from None
        # croniter is imported where cron is used: a worker without schedules never loads it.
        from croniter import CroniterError, croniter

        try:
            croniter(self.expression, second_at_beginning=True)
        except (CroniterError, ValueError, KeyError) as exc:
            raise ValueError(f"invalid cron expression {self.expression!r}: {exc}") from None

    def next_after(self, moment: datetime) -> datetime:
        """Return the first tick strictly after ``moment``, in UTC.

        >>> Cron("0 2 * * *", "Europe/Paris").next_after(datetime(2026, 6, 30, 12, tzinfo=UTC))
        datetime.datetime(2026, 7, 1, 0, 0, tzinfo=datetime.timezone.utc)
        """
        # Iterate wall-clock times, then place each in the zone: a wall time that occurs
        # twice (autumn) takes its first occurrence and one that does not exist (spring)
        # takes the zone's standard offset, so a daily schedule fires once either way.
        from croniter import croniter

        zone = ZoneInfo(self.timezone)
        wall = moment.astimezone(zone).replace(tzinfo=None)
        ticks = croniter(self.expression, wall, second_at_beginning=True)
        while True:
            candidate: datetime = ticks.get_next(datetime).replace(tzinfo=zone, fold=0)
            result = candidate.astimezone(UTC)
            if result > moment:
                return result


@dataclass(frozen=True, slots=True)
class Firing:
    """The ticks to fire now and the schedule's next tick."""

    ticks: tuple[datetime, ...]
    next_run_at: datetime
    missed: int


def plan(
    cron: Cron,
    *,
    next_run_at: datetime,
    now: datetime,
    catch_up: CatchUp,
    backfill_limit: int,
    grace: float,
) -> Firing:
    """Decide which ticks to fire when a schedule's ``next_run_at`` has come.

    A due tick seen within ``grace`` seconds fires under every policy; ticks older than
    that were missed (no worker ran then) and follow ``catch_up``.

    >>> from datetime import timedelta
    >>> c = Cron("* * * * *")
    >>> t0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    >>> [t.minute for t in plan(c, next_run_at=t0, now=t0 + timedelta(seconds=5),
    ...       catch_up=CatchUp.SKIP, backfill_limit=0, grace=30).ticks]
    [0]
    >>> f = plan(c, next_run_at=t0, now=t0 + timedelta(minutes=10, seconds=40),
    ...          catch_up=CatchUp.BACKFILL, backfill_limit=3, grace=30)
    >>> [t.minute for t in f.ticks], f.next_run_at.minute, f.missed
    ([8, 9, 10], 11, 11)
    """
    due: list[datetime] = []
    tick = next_run_at
    while tick <= now and len(due) < _MAX_TICKS:
        due.append(tick)
        tick = cron.next_after(tick)
    if tick <= now:  # more than _MAX_TICKS behind: jump ahead
        tick = cron.next_after(now)
    on_time = [t for t in due if (now - t).total_seconds() <= grace]
    missed = [t for t in due if (now - t).total_seconds() > grace]
    if catch_up is CatchUp.SKIP or not missed:
        fire = on_time
    elif catch_up is CatchUp.ONCE:
        fire = on_time or missed[-1:]
    else:
        fire = missed[-backfill_limit:] if backfill_limit > 0 else []
        fire = fire + on_time
    return Firing(ticks=tuple(fire), next_run_at=tick, missed=len(missed))


def tick_id(schedule: str, tick: datetime) -> str:
    """The id of the job a schedule fires for a tick: the same on every worker.

    >>> tick_id("nightly", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    'cron:nightly:2026-01-02T03:04:05Z'
    """
    return f"cron:{schedule}:{tick.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}"


@dataclass(frozen=True, slots=True)
class Schedule:
    """A named cron schedule and the job it fires on each tick."""

    name: str
    cron: Cron
    type: str
    payload: dict[str, object]
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 3
    timeout: float | None = None
    lease: float | None = None
    backoff_base: float = 1.0
    backoff_cap: float = 3600.0
    catch_up: CatchUp = CatchUp.SKIP
    backfill_limit: int = 10
    grace: float | None = None  # None: half the gap between ticks, at most 60 s
    overlap: Overlap = Overlap.ALLOW

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 200 or "\x00" in self.name:
            raise ValueError("a schedule name must be 1 to 200 characters")
        if self.backfill_limit < 0:
            raise ValueError("backfill_limit must not be negative")
        if self.grace is not None and self.grace < 0:
            raise ValueError("grace must not be negative")

    def grace_at(self, tick: datetime) -> float:
        """Seconds a tick may be late and still count as on time."""
        if self.grace is not None:
            return self.grace
        gap = (self.cron.next_after(tick) - tick).total_seconds()
        return min(60.0, gap / 2)


def plan_schedule(
    schedule: Schedule, *, next_run_at: datetime, now: datetime, min_grace: float = 0.0
) -> Firing:
    """Plan a schedule's firing with its own catch-up policy and grace.

    ``min_grace`` is the least grace whatever the schedule says: the firing worker passes
    what its checks may lag behind the clock, so a tick is only ever counted as missed
    when no worker was running, never because a healthy one looked a moment late.

    >>> from datetime import timedelta
    >>> s = Schedule("beat", Cron("* * * * * *"), "ping", {})
    >>> t0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    >>> late = t0 + timedelta(seconds=0.8)  # past half the one-second gap
    >>> plan_schedule(s, next_run_at=t0, now=late).ticks
    ()
    >>> [t.second for t in plan_schedule(s, next_run_at=t0, now=late, min_grace=2.0).ticks]
    [0]
    """
    return plan(
        schedule.cron,
        next_run_at=next_run_at,
        now=now,
        catch_up=schedule.catch_up,
        backfill_limit=schedule.backfill_limit,
        grace=max(schedule.grace_at(next_run_at), min_grace),
    )


def without_overlap(
    ticks: tuple[datetime, ...], overlap: Overlap, previous: Status | None
) -> tuple[tuple[datetime, ...], int]:
    """The ticks to fire under an overlap policy, and how many it skips.

    ``previous`` is the status of the schedule's last fired run (None: none, or pruned).
    Under ``skip`` an unfinished previous run skips every tick, and of several due at once
    (a catch-up) only the latest fires, so that runs of the schedule never overlap.

    >>> t = (datetime(2026, 1, 1, 12, 0, tzinfo=UTC), datetime(2026, 1, 1, 12, 1, tzinfo=UTC))
    >>> without_overlap(t, Overlap.ALLOW, Status.RUNNING) == (t, 0)
    True
    >>> without_overlap(t, Overlap.SKIP, Status.QUEUED)
    ((), 2)
    >>> [x.minute for x in without_overlap(t, Overlap.SKIP, Status.SUCCEEDED)[0]]
    [1]
    """
    if overlap is Overlap.ALLOW or not ticks:
        return ticks, 0
    if previous is not None and not previous.terminal:
        return (), len(ticks)
    return ticks[-1:], len(ticks) - 1


def check_grace(interval: float) -> float:
    """The least grace for ticks fired by a worker that checks every ``interval`` seconds.

    Twice the interval, and never under five seconds: a worker looks at least once per
    interval (at once when it knows the tick is due), but on a loaded machine every
    process can stall for seconds at a time (seen: 4 s beside a CPU hog), and a tick a
    healthy cluster fires that late is late, not missed.

    >>> check_grace(1.0)
    5.0
    >>> check_grace(10.0)
    20.0
    """
    return max(2 * interval, 5.0)


def next_check(
    upcoming: Iterable[datetime], *, now: datetime, interval: float, jitter: float = 0.0
) -> float:
    """Seconds to wait before the next look for due ticks.

    Until the earliest ``upcoming`` tick, plus ``jitter`` (so that workers woken by the
    same tick do not all reach the database at the same instant), and never more than
    ``interval``, so schedules enabled or declared by other processes are found too.
    Waiting for the tick itself, rather than a fixed interval after the last look,
    keeps firing on the wall clock however long each look takes.

    >>> from datetime import timedelta
    >>> t0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    >>> next_check([t0 + timedelta(seconds=0.25)], now=t0, interval=1.0, jitter=0.125)
    0.375
    >>> next_check([t0 + timedelta(minutes=5), t0 + timedelta(seconds=0.5)], now=t0,
    ...            interval=1.0)
    0.5
    >>> next_check([t0 + timedelta(minutes=5)], now=t0, interval=1.0)  # far off
    1.0
    >>> next_check([], now=t0, interval=1.0)  # no schedule
    1.0
    >>> next_check([t0 - timedelta(seconds=3)], now=t0, interval=1.0, jitter=0.125)  # due
    0.125
    """
    until = min([(tick - now).total_seconds() for tick in upcoming], default=interval)
    return min(max(until, 0.0), interval) + jitter


def schedule_job(schedule: Schedule, tick: datetime, *, manual: bool = False) -> NewJob:
    """The job a schedule fires for ``tick`` (or, ``manual``, when run by hand)."""
    job_id = tick_id(schedule.name, tick)
    if manual:
        job_id = job_id.replace("cron:", "cron-manual:", 1)
    return NewJob(
        id=job_id,
        type=schedule.type,
        payload=dict(schedule.payload),
        queue=schedule.queue,
        priority=schedule.priority,
        max_attempts=schedule.max_attempts,
        timeout=schedule.timeout,
        lease=schedule.lease,
        backoff_base=schedule.backoff_base,
        backoff_cap=schedule.backoff_cap,
        submitted_by=f"schedule:{schedule.name}",
    )
