"""The pure core: state machine table, retry policy, durations, ids."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from conveyor.core import durations, ids
from conveyor.core.cron import (
    CatchUp,
    Cron,
    Schedule,
    check_grace,
    next_check,
    plan,
    plan_schedule,
    tick_id,
)
from conveyor.core.lifecycle import TRANSITIONS, Event, IllegalTransition, Status, transition
from conveyor.core.model import Outcome, after_failure
from conveyor.core.retry import Backoff, backoff_delay


def test_every_status_and_event_pair_is_either_in_the_table_or_illegal() -> None:
    for status in Status:
        for event in Event:
            if (status, event) in TRANSITIONS:
                assert transition(status, event) is TRANSITIONS[(status, event)]
            else:
                with pytest.raises(IllegalTransition):
                    transition(status, event)


def test_terminal_statuses_have_no_way_out_but_the_reopening_of_a_failed_parent() -> None:
    for source, event in TRANSITIONS:
        assert not source.terminal or (source, event) == (Status.FAILED, Event.REOPEN)


@pytest.mark.parametrize(
    ("status", "event"),
    [
        (Status.SUCCEEDED, Event.CLAIM),
        (Status.FAILED, Event.RETRY),
        (Status.CANCELLED, Event.CANCEL),
        (Status.QUEUED, Event.SUCCEED),
        (Status.PENDING, Event.CLAIM),
    ],
)
def test_illegal_transitions_are_rejected_with_a_message(status: Status, event: Event) -> None:
    with pytest.raises(IllegalTransition, match=f"a {status.value} job cannot take"):
        transition(status, event)


def test_backoff_grows_exponentially_and_is_capped() -> None:
    bounds = [backoff_delay(attempt=a, base=2, cap=60, jitter=False) for a in range(1, 8)]
    assert bounds == [2, 4, 8, 16, 32, 60, 60]


def test_full_jitter_stays_within_zero_and_the_bound() -> None:
    for fraction in (0.0, 0.25, 0.999):
        delay = backoff_delay(attempt=4, base=1, cap=100, jitter=fraction)
        assert 0 <= delay <= 8
    with pytest.raises(ValueError, match="fraction"):
        backoff_delay(attempt=1, base=1, cap=2, jitter=1.5)


def test_backoff_parse_and_validation() -> None:
    assert Backoff.parse(("30s", "1h")) == Backoff(30, 3600)
    with pytest.raises(ValueError, match="cap"):
        Backoff.parse(("1h", "30s"))


def test_failure_retries_until_attempts_are_spent() -> None:
    common = {
        "job_id": "j",
        "token": 1,
        "max_attempts": 3,
        "error": "x",
        "backoff_base": 1,
        "backoff_cap": 10,
        "jitter": 0.5,
        "outcome": Outcome.FAILED,
    }
    assert after_failure(attempt=1, **common).status is Status.QUEUED  # type: ignore[arg-type]
    assert after_failure(attempt=3, **common).status is Status.FAILED  # type: ignore[arg-type]
    final = after_failure(attempt=1, final=True, **common)  # type: ignore[arg-type]
    assert final.status is Status.FAILED
    chosen = after_failure(attempt=1, retry_after=42, **common)  # type: ignore[arg-type]
    assert chosen.retry_delay == 42


@pytest.mark.parametrize(
    ("text", "expected"), [("500ms", 0.5), ("30s", 30), ("15m", 900), ("1h30m", 5400), ("2", 2)]
)
def test_durations(text: str, expected: float) -> None:
    assert durations.seconds(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "10x", "-5", "5s junk"])
def test_bad_durations_say_what_to_write(bad: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        durations.seconds(bad)


def test_ids_sort_by_time_and_are_unique() -> None:
    generated = [ids.new_id(1_700_000_000 + i / 1000) for i in range(1000)]
    assert generated == sorted(generated)
    assert len(set(generated)) == 1000


def test_ids_made_together_are_new_id_s_for_the_same_time() -> None:
    digits = "0123456789abcdefghjkmnpqrstvwxyz"
    for now in (0.0, 1.5, 1_700_000_000.123, (2**48 - 1) / 1000):
        together = ids.new_ids(now, 200)
        assert len(set(together)) == 200 and together == sorted(together)
        for made in together:
            value = 0
            for digit in made:
                value = value * 32 + digits.index(digit)
            # The same 26 digits encode() writes, the time in the top 48 bits.
            assert ids.encode(value) == made and value >> 80 == int(now * 1000)
            assert made[:10] == ids.new_id(now)[:10]
    assert ids.new_ids(1.0, 0) == []


def _utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "zone", "message"),
    [
        ("61 * * * *", "UTC", "invalid cron expression"),
        ("* * *", "UTC", "five fields"),
        ("every day", "UTC", "five fields"),
        ("0 2 * * *", "Mars/Olympus", "unknown timezone 'Mars/Olympus'"),
    ],
)
def test_bad_cron_says_what_to_write(expression: str, zone: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Cron(expression, zone)


def test_spring_forward_neither_crashes_nor_doubles() -> None:
    # 02:30 does not exist in Paris on 2026-03-29; the tick moves, once.
    c = Cron("30 2 * * *", "Europe/Paris")
    ticks, t = [], _utc(2026, 3, 27, 12, 0)
    for _ in range(4):
        t = c.next_after(t)
        ticks.append(t)
    assert len(set(ticks)) == 4
    assert [x.day for x in ticks] == [28, 29, 30, 31]


def test_fall_back_fires_a_daily_schedule_once() -> None:
    # 02:30 happens twice in Paris on 2026-10-25; a daily schedule fires on one of them.
    c = Cron("30 2 * * *", "Europe/Paris")
    ticks, t = [], _utc(2026, 10, 23, 12, 0)
    for _ in range(4):
        t = c.next_after(t)
        ticks.append(t)
    assert [x.day for x in ticks] == [24, 25, 26, 27]


def test_catch_up_policies_after_ten_missed_ticks() -> None:
    c = Cron("* * * * *")
    start = _utc(2026, 1, 1, 12, 0)
    now = start + timedelta(minutes=9, seconds=50)  # ticks 12:00..12:09 are all late
    common = {"next_run_at": start, "now": now, "grace": 30.0}
    skip = plan(c, catch_up=CatchUp.SKIP, backfill_limit=0, **common)  # type: ignore[arg-type]
    once = plan(c, catch_up=CatchUp.ONCE, backfill_limit=0, **common)  # type: ignore[arg-type]
    back = plan(c, catch_up=CatchUp.BACKFILL, backfill_limit=4, **common)  # type: ignore[arg-type]
    assert skip.ticks == () and skip.missed == 10
    assert once.ticks == (_utc(2026, 1, 1, 12, 9),)
    assert [t.minute for t in back.ticks] == [6, 7, 8, 9]
    assert skip.next_run_at == once.next_run_at == back.next_run_at == _utc(2026, 1, 1, 12, 10)


def test_tick_ids_are_the_same_everywhere() -> None:
    tick = _utc(2026, 1, 1, 0, 0)
    assert tick_id("a", tick) == tick_id("a", tick.astimezone(ZoneInfo("Asia/Tokyo")))


def _cron_cluster(
    workers: int, *, seconds: int, look_takes: float, keep_time: bool, seed: int = 7
) -> tuple[list[datetime], int]:
    """Simulate workers firing an every-second schedule; return the ticks fired and missed.

    The schedule row is shared (what the store's compare-and-set does); each worker looks
    at ``now``, then its look takes up to ``look_takes`` seconds, then it waits: to the
    next tick plus jitter (``keep_time``), or a fixed interval (the old loop).
    """
    rng = random.Random(seed)
    interval = 1.0
    schedule = Schedule("beat", Cron("* * * * * *"), "ping", {})
    start = _utc(2026, 1, 1, 12, 0)
    row = start + timedelta(seconds=1)  # next_run_at as stored
    looks = [start + timedelta(seconds=rng.random()) for _ in range(workers)]
    fired: list[datetime] = []
    missed = 0
    end = start + timedelta(seconds=seconds)
    while (now := min(looks)) < end:
        worker = looks.index(now)
        if row <= now:
            firing = plan_schedule(
                schedule,
                next_run_at=row,
                now=now,
                min_grace=check_grace(interval) if keep_time else 0.0,
            )
            fired.extend(firing.ticks)
            missed += firing.missed
            row = firing.next_run_at
        done = now + timedelta(seconds=rng.uniform(0.0, look_takes))
        if keep_time:
            wait = next_check([row], now=done, interval=interval, jitter=rng.uniform(0, 0.05))
        else:
            wait = interval
        looks[worker] = done + timedelta(seconds=wait)
    return fired, missed


@pytest.mark.parametrize("workers", [1, 5])
def test_workers_keeping_to_the_clock_fire_every_tick_once_and_miss_none(workers: int) -> None:
    # Looks that take up to 0.9 s (a loaded machine): still every tick, on time.
    fired, missed = _cron_cluster(workers, seconds=600, look_takes=0.9, keep_time=True)
    assert missed == 0
    assert len(fired) == len(set(fired))
    expected = [_utc(2026, 1, 1, 12, 0) + timedelta(seconds=s) for s in range(1, 600)]
    assert sorted(fired)[: len(expected)] == expected


def test_a_worker_waiting_a_fixed_interval_after_each_look_drifts_into_missing_ticks() -> None:
    # The old loop: look, take a while, sleep the interval. The looks fall behind the
    # clock until each tick is seen past its grace (half a second) and skipped.
    fired, missed = _cron_cluster(1, seconds=600, look_takes=0.2, keep_time=False)
    assert missed > 100  # 335 of 599 with this seed
    assert len(fired) + missed == 599


def test_a_stall_shorter_than_the_check_grace_fires_late_and_a_longer_outage_skips() -> None:
    schedule = Schedule("beat", Cron("* * * * * *"), "ping", {})
    tick = _utc(2026, 1, 1, 12, 0)
    grace = check_grace(1.0)
    stalled = plan_schedule(
        schedule, next_run_at=tick, now=tick + timedelta(seconds=1.5), min_grace=grace
    )
    assert stalled.ticks == (tick, tick + timedelta(seconds=1)) and stalled.missed == 0
    down = plan_schedule(
        schedule, next_run_at=tick, now=tick + timedelta(seconds=10.5), min_grace=grace
    )
    # Ticks later than the grace (5 s) are skipped; the later ones fire, late.
    assert down.ticks == tuple(tick + timedelta(seconds=s) for s in range(6, 11))
    assert down.missed == 6
    assert down.next_run_at == tick + timedelta(seconds=11)
