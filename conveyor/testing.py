"""Test code that submits jobs, without starting workers: ``conveyor.testing``.

A :class:`JobTester` points an application at a fresh database (a temporary SQLite file
by default, or a URL you give) with a fake clock, then lets a test assert what was
submitted, run the due jobs in-process, and move time forward for delays, retries and
cron schedules::

    from conveyor.testing import JobTester
    from myproject.jobs import app
    from myproject.signup import sign_up

    async def test_sign_up_sends_a_welcome_mail():
        async with JobTester(app) as jobs:
            await sign_up("a@b.c")                  # submits through app, as in production
            jobs_seen = await jobs.assert_submitted("send_email", payload={"to": "a@b.c"})
            ran = await jobs.drain()                # runs every due job, here, now
            assert ran.succeeded == [jobs_seen.id]

With pytest and pytest-asyncio, the ``conveyor_tester`` fixture (installed with conveyor
as a pytest plugin) builds one for the test and closes it after:
``jobs = await conveyor_tester(app)``.

Jobs run through a real worker in burst mode on the test's event loop: the same claim,
lease, retry and settle code as in production, on a real database, with no mocks. The
fake clock is the one the store and the application read (run_at, delays, backoff, cron
ticks, leases); handlers' own ``time.time()`` and ``asyncio.sleep`` are real.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from conveyor.app.client import Conveyor, JobHandle
from conveyor.core.durations import Duration, seconds
from conveyor.core.lifecycle import TERMINAL, Status
from conveyor.core.model import Job
from conveyor.worker import WorkerOptions

__all__ = ["DrainResult", "FakeClock", "JobTester"]


class FakeClock:
    """A clock that moves only when told: seconds since the epoch, as ``time.time()``.

    Each read moves it by one microsecond, so that jobs submitted one after the other
    keep their order (their ``created_at`` differ), as they would with a real clock.
    """

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else float(start)

    def __call__(self) -> float:
        self.now += 1e-6
        return self.now

    def advance(self, by: Duration) -> float:
        """Move forward by a duration (``30``, ``"15m"``, a ``timedelta``); return the time."""
        self.now += seconds(by)
        return self.now


@dataclass(frozen=True, slots=True)
class DrainResult:
    """The jobs that ended during a drain, by how they ended (ids, in the order seen)."""

    succeeded: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    attempts: int = 0  # attempts run, retries included

    @property
    def ended(self) -> list[str]:
        return [*self.succeeded, *self.failed, *self.cancelled]


class JobTester:
    """An application on a fresh database with a fake clock, for one test.

    ``database``: a URL (e.g. a PostgreSQL database made for the test); by default a
    SQLite file in a temporary folder, deleted by :meth:`close`. The application's own
    URL and clock are restored by :meth:`close`, so a module-level ``app`` can be used by
    many tests in turn.
    """

    def __init__(
        self,
        app: Conveyor,
        database: str | None = None,
        *,
        clock: FakeClock | None = None,
    ) -> None:
        self.app = app
        self.clock = clock or FakeClock()
        self._folder: str | None = None
        if database is None:
            self._folder = tempfile.mkdtemp(prefix="conveyor-test-")
            database = f"sqlite:///{Path(self._folder) / 'jobs.db'}"
        self._saved: tuple[str, Callable[[], float] | None] = (app.url, app.clock)
        app.clock = self.clock
        try:
            app.use_database(database)
        except Exception:
            app.clock = self._saved[1]
            raise
        self.url = database

    async def __aenter__(self) -> JobTester:
        await self.app.migrate()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the store, give the application back its URL and clock, delete the file."""
        await self.app.close()
        url, clock = self._saved
        self.app.clock = clock
        self.app.use_database(url)
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    # -- what was submitted ---------------------------------------------------------------

    async def submitted(self, type: str | None = None) -> list[Job]:
        """Every job submitted so far (children too), oldest first; of ``type`` if given."""
        found: list[Job] = []
        cursor: str | None = None
        while True:
            page = await self.app.page_jobs(
                type=type, include_children=True, newest_first=False, cursor=cursor, limit=1000
            )
            found += [h.record for h in page.jobs]
            if page.next is None:
                return found
            cursor = page.next

    async def assert_submitted(
        self, type: str, *, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> Job:
        """Assert that a job of ``type`` was submitted and return it (the newest match).

        ``payload`` matches when each of its keys has the given value (other keys are
        ignored). ``options`` are compared with the job's fields (``queue``,
        ``priority``, ``max_attempts``, ``unique_key``, ``parent_id``, ``status``...);
        ``delay`` (a duration) with how long after its creation the job is due.
        """
        candidates = await self.submitted(type)
        matches = [j for j in candidates if _matches(j, payload, options)]
        if matches:
            return matches[-1]
        wanted = _describe_wanted(type, payload, options)
        seen = "; ".join(_describe(j) for j in (candidates or await self.submitted()))
        raise AssertionError(f"no job {wanted} was submitted; submitted: {seen or 'none'}")

    async def assert_not_submitted(
        self, type: str, *, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> None:
        """Assert that no job of ``type`` (matching ``payload`` and ``options``) exists."""
        matches = [j for j in await self.submitted(type) if _matches(j, payload, options)]
        if matches:
            raise AssertionError(
                f"expected no job {_describe_wanted(type, payload, options)}, found: "
                + "; ".join(_describe(j) for j in matches)
            )

    # -- running jobs ---------------------------------------------------------------------

    async def drain(
        self, *, queues: Sequence[str] | None = None, advance: bool = False, rounds: int = 100
    ) -> DrainResult:
        """Run the due jobs in-process until none is due; return those that ended.

        Jobs they spawn or unblock run too. With ``advance``, the clock then moves to the
        next queued job's due time (a retry's backoff, a delay) and the drain goes on,
        until no job is queued at all.

        ``queues``: the queues to serve, as ``conveyor worker --queues``; by default those
        of the application's job types, as ``conveyor worker APP`` serves. A due job left
        in a queue the drain does not serve (nor a paused one) fails the drain with an
        ``AssertionError`` naming it: no worker started that way would run it either.
        """
        served = tuple(queues) if queues else tuple(self.app.registry.queues())
        before = {j.id for j in await self.submitted() if j.status in TERMINAL}
        attempts = 0
        for _ in range(rounds):
            attempts += await self._burst(served)
            store = await self.app.store()
            finished = await store.finish_parents(limit=1000)
            if finished:
                continue
            if advance and (due := await self._next_due(served)) is not None:
                self.clock.now = max(self.clock.now, due.timestamp())
                continue
            break
        await self._check_unserved(served, explicit=bool(queues))
        ended: dict[Status, list[str]] = {s: [] for s in TERMINAL}
        for job in await self.submitted():
            if job.status in TERMINAL and job.id not in before:
                ended[job.status].append(job.id)
        return DrainResult(
            succeeded=ended[Status.SUCCEEDED],
            failed=ended[Status.FAILED],
            cancelled=ended[Status.CANCELLED],
            attempts=attempts,
        )

    async def run(
        self, type: str, payload: Mapping[str, Any] | None = None, **kw: Any
    ) -> JobHandle:
        """Submit one job, drain, and return its handle, ended (or still queued for later)."""
        job = await self.app.submit(type, dict(payload or {}), **kw)
        await self.drain()
        return await job.refresh()

    async def advance(self, by: Duration) -> list[str]:
        """Move the fake clock forward and fire the schedule ticks now due; return the ids
        of the jobs those ticks submitted (run them with :meth:`drain`)."""
        target = self.clock.now + seconds(by)
        await self.app.sync_schedules()
        store = await self.app.store()
        fired: list[str] = []
        # Step from tick to tick, as a worker polling every second would see them: a
        # schedule that skips late ticks would skip one jumped over by far.
        for _ in range(10_000):
            schedules = await self.app.list_schedules()
            ticks = [s.next_run_at.timestamp() for s in schedules if s.enabled]
            due = [t for t in ticks if t <= target]
            if not due:
                break
            self.clock.now = max(self.clock.now, min(due))
            fired += await store.fire_schedules(limit=1000)
        self.clock.now = max(self.clock.now, target)
        fired += await store.fire_schedules(limit=1000)
        return fired

    async def _burst(self, queues: Sequence[str] | None) -> int:
        # Short polls, so that a drain ends promptly once nothing is due; cron ticks
        # fire when the test moves time (advance), never in a drain: a clock moved by
        # hand past a tick must not make a drain's outcome depend on the time of day.
        options = WorkerOptions(
            burst=True,
            queues=tuple(queues) if queues else None,
            poll_interval=0.02,
            rescue_interval=0.05,
            fire_schedules=False,
            prune_interval=3600.0,
            grace=5.0,
            cancel_grace=1.0,
        )
        worker = self.app.worker(options)
        await worker.run()
        return worker.processed

    async def _next_due(self, queues: Sequence[str]) -> datetime | None:
        queued = [j for j in await self.submitted() if j.status is Status.QUEUED]
        return min((j.run_at for j in queued if j.queue in queues), default=None)

    async def _check_unserved(self, served: Sequence[str], *, explicit: bool) -> None:
        """Fail loudly when a due job sits in a queue the drain did not serve."""
        now = datetime.fromtimestamp(self.clock.now, UTC)
        paused = {q.name for q in await self.app.queues() if q.paused}
        left = [
            j
            for j in await self.submitted()
            if j.status is Status.QUEUED
            and j.run_at <= now
            and j.queue not in served
            and j.queue not in paused
        ]
        if not left:
            return
        queues = sorted({j.queue for j in left})
        how = (
            f"drain(queues={[*served, *queues]!r}) runs them"
            if explicit
            else f"no job type of the application declares {_names(queues)}, so a worker "
            "started as `conveyor worker APP` does not serve it either: submit to the "
            f"type's queue, or run them with drain(queues={[*served, *queues]!r}) (and "
            "start workers with --queues)"
        )
        raise AssertionError(
            f"drain() left {len(left)} due job(s) in {_names(queues)}, which it does not "
            f"serve ({', '.join(_describe(j) for j in left[:5])}): {how}"
        )


def _matches(job: Job, payload: Mapping[str, Any] | None, options: Mapping[str, Any]) -> bool:
    if payload is not None and any(
        k not in job.payload or job.payload[k] != v for k, v in payload.items()
    ):
        return False
    for name, wanted in options.items():
        if name == "delay":
            if abs((job.run_at - job.created_at).total_seconds() - seconds(wanted)) > 0.001:
                return False
        elif name == "status":
            if job.status is not Status(wanted):
                return False
        elif not hasattr(job, name):
            raise TypeError(f"a job has no field {name!r} to compare")
        elif getattr(job, name) != wanted:
            return False
    return True


def _describe_wanted(
    type: str, payload: Mapping[str, Any] | None, options: Mapping[str, Any]
) -> str:
    parts = [repr(type)]
    if payload is not None:
        parts.append(f"payload ⊇ {dict(payload)!r}")
    parts += [f"{k}={v!r}" for k, v in options.items()]
    return " ".join(parts)


def _names(queues: Sequence[str]) -> str:
    return ("queue " if len(queues) == 1 else "queues ") + ", ".join(repr(q) for q in queues)


def _describe(job: Job) -> str:
    return f"{job.type} {job.payload!r} (queue {job.queue!r}, {job.status.value})"
