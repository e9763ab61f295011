"""The pure core: state machine table, retry policy, durations, ids."""

from __future__ import annotations

import doctest
import importlib

import pytest

from conveyor.core import durations, ids, lifecycle, model, retry
from conveyor.core.lifecycle import TRANSITIONS, Event, IllegalTransition, Status, transition
from conveyor.core.model import Outcome, after_failure
from conveyor.core.retry import Backoff, backoff_delay


@pytest.mark.parametrize("module", [durations, ids, lifecycle, model, retry])
def test_doctests(module: object) -> None:
    result = doctest.testmod(importlib.import_module(module.__name__))  # type: ignore[attr-defined]
    assert result.attempted > 0
    assert result.failed == 0


def test_every_status_and_event_pair_is_either_in_the_table_or_illegal() -> None:
    for status in Status:
        for event in Event:
            if (status, event) in TRANSITIONS:
                assert transition(status, event) is TRANSITIONS[(status, event)]
            else:
                with pytest.raises(IllegalTransition):
                    transition(status, event)


def test_terminal_statuses_have_no_way_out() -> None:
    for (source, _event) in TRANSITIONS:
        assert not source.terminal


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
    common = {"job_id": "j", "token": 1, "max_attempts": 3, "error": "x", "backoff_base": 1,
              "backoff_cap": 10, "jitter": 0.5, "outcome": Outcome.FAILED}
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
