"""conveyor.testing: assert what was submitted, drain jobs in-process, fake time; and the
example of docs/testing.md, run as it stands with the installed pytest plugin."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conveyor import Conveyor, JobContext, Status
from conveyor.testing import FakeClock, JobTester

ROOT = Path(__file__).resolve().parent.parent

app = Conveyor("sqlite:///conveyor-testing-unused.db")
ran: list[str] = []


@app.job(max_attempts=2, backoff="1m")
async def charge(ctx: JobContext, order: int, amount: float) -> str:
    if amount < 0:
        raise ValueError(f"negative amount for order {order}")
    ran.append(f"charge {order}")
    await ctx.spawn("receipt", {"order": order})
    return f"charged {order}"


@app.job(queue="mail", priority=-1)
async def receipt(ctx: JobContext, order: int) -> None:
    ran.append(f"receipt {order}")


app.schedule("nightly", "0 2 * * *", receipt, {"order": 0})


@pytest.fixture
async def jobs(db_url: str) -> AsyncIterator[JobTester]:
    ran.clear()
    async with JobTester(app, db_url) as tester:
        yield tester


async def test_assert_submitted_matches_type_payload_and_options(jobs: JobTester) -> None:
    await charge.submit(order=1, amount=9.5)
    await app.submit("receipt", {"order": 7}, delay="1h")
    found = await jobs.assert_submitted("charge", payload={"order": 1})
    assert found.payload == {"order": 1, "amount": 9.5}
    await jobs.assert_submitted("receipt", queue="mail", priority=-1, delay="1h")
    await jobs.assert_not_submitted("charge", payload={"order": 2})
    with pytest.raises(AssertionError, match=r"no job 'charge' payload ⊇ \{'order': 2\}.*"
                       r"submitted: charge \{'order': 1, 'amount': 9.5\}"):  # fmt: skip
        await jobs.assert_submitted("charge", payload={"order": 2})
    with pytest.raises(AssertionError, match="expected no job 'receipt'"):
        await jobs.assert_not_submitted("receipt")
    assert [j.type for j in await jobs.submitted()] == ["charge", "receipt"]


async def test_drain_runs_due_jobs_and_what_they_spawn(jobs: JobTester) -> None:
    await charge.submit(order=1, amount=5)
    later = await app.submit("receipt", {"order": 2}, delay="5m")
    result = await jobs.drain()
    assert len(result.succeeded) == 2 and result.failed == []
    assert sorted(ran) == ["charge 1", "receipt 1"]
    assert (await later.refresh()).status is Status.QUEUED
    jobs.clock.advance("5m")
    assert (await jobs.drain()).succeeded == [later.id]


async def test_a_due_job_in_a_queue_no_type_declares_fails_the_drain_loudly(
    jobs: JobTester,
) -> None:
    """Issue #30 item 9: drain() skipped it in silence (``ended == []``)."""
    stray = await app.submit("receipt", {"order": 3}, queue="stray")
    with pytest.raises(AssertionError, match=r"left 1 due job\(s\) in queue 'stray'.*receipt "
                       r".*no job type of the application declares queue 'stray'.*"
                       r"drain\(queues=\['default', 'mail', 'stray'\]\)"):  # fmt: skip
        await jobs.drain()
    result = await jobs.drain(queues=["default", "mail", "stray"])
    assert result.succeeded == [stray.id]
    # A paused queue holds its jobs on purpose: no failure for those.
    await app.pause("stray")
    await app.submit("receipt", {"order": 4}, queue="stray")
    assert (await jobs.drain()).ended == []


async def test_a_drain_never_fires_a_schedule_tick_only_advance_does(db_url: str) -> None:
    # Three minutes before the nightly tick (02:00): moving the clock by hand past it and
    # draining runs the delayed job alone, whatever the time of day the test runs at.
    start = datetime(2026, 3, 4, 1, 57, tzinfo=UTC).timestamp()
    ran.clear()
    async with JobTester(app, db_url, clock=FakeClock(start=start)) as jobs:
        later = await app.submit("receipt", {"order": 2}, delay="5m")
        assert (await jobs.drain()).ended == []  # its worker saw the schedule's next tick
        jobs.clock.advance("5m")
        assert (await jobs.drain()).succeeded == [later.id]
        assert ran == ["receipt 2"]
        fired = await jobs.advance("1d")  # the next nightly tick fires when asked
        assert len(fired) == 1 and fired[0].startswith("cron:nightly:2026-03-0")
        assert (await jobs.drain()).succeeded == fired


async def test_drain_with_advance_carries_retries_to_the_end(jobs: JobTester) -> None:
    job = await jobs.run("charge", {"order": 3, "amount": -1})
    assert job.status is Status.QUEUED and job.attempt == 1  # waits a minute of fake time
    due = job.record.run_at.timestamp()
    assert due > jobs.clock.now  # the backoff
    result = await jobs.drain(advance=True)
    assert result.failed == [job.id] and result.attempts == 1
    assert jobs.clock.now >= due  # the backoff passed in fake time
    assert "negative amount" in ((await job.refresh()).error or "")


async def test_advance_fires_due_cron_ticks(jobs: JobTester) -> None:
    fired = await jobs.advance("1d")
    assert len(fired) == 1  # 02:00 came once
    assert (await jobs.drain()).succeeded == fired
    assert len(await jobs.advance("2d")) == 2


async def test_the_tester_gives_the_application_back(db_url: str) -> None:
    url, clock = app.url, app.clock
    async with JobTester(app) as tester:
        assert app.url == tester.url != url and app.clock is tester.clock
        folder = Path(tester.url.removeprefix("sqlite:///")).parent
        assert folder.exists()
    assert (app.url, app.clock) == (url, clock)
    assert not folder.exists()


def test_the_documented_example_passes_with_the_pytest_plugin(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    (example,) = re.findall(r"```python\n(# test_welcome\.py\n.*?)```", text, re.S)
    (tmp_path / "test_welcome.py").write_text(example)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_welcome.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert list(tmp_path.glob("*.db")) == []  # the testers' files were temporary
