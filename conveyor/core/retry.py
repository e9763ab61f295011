"""Retry policy: exponential backoff with full jitter, capped.

Pure functions of the attempt number and a random fraction, so the worker, the rescuer
and the tests can all compute the same decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.core.durations import Duration, seconds


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between attempts: ``base * 2**(attempt-1)``, capped at ``cap``, with full jitter."""

    base: float = 1.0
    cap: float = 3600.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff base and cap must not be negative")
        if self.cap < self.base:
            raise ValueError(f"backoff cap ({self.cap}s) must be at least its base ({self.base}s)")

    @classmethod
    def parse(cls, value: Backoff | tuple[Duration, Duration] | Duration) -> Backoff:
        """Build a backoff from ``(base, cap)``, a single base duration, or a Backoff."""
        if isinstance(value, Backoff):
            return value
        if isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError("backoff takes (base, cap), e.g. ('30s', '1h')")
            return cls(seconds(value[0]), seconds(value[1]))
        base = seconds(value)
        return cls(base, max(base, 3600.0))


def backoff_delay(*, attempt: int, base: float, cap: float, jitter: float | bool = True) -> float:
    """Return the delay in seconds before the retry that follows attempt number ``attempt``.

    ``jitter`` is a random fraction in [0, 1) for full jitter, or False for the upper bound.

    >>> backoff_delay(attempt=3, base=30, cap=3600, jitter=False)
    120.0
    >>> backoff_delay(attempt=30, base=30, cap=3600, jitter=False)
    3600.0
    >>> backoff_delay(attempt=3, base=30, cap=3600, jitter=0.5)
    60.0
    """
    exponent = min(max(attempt - 1, 0), 62)
    ceiling = min(float(cap), float(base) * 2.0**exponent)
    if jitter is False:
        return ceiling
    if jitter is True:
        raise ValueError("pass the random fraction itself as jitter, or False for no jitter")
    fraction = float(jitter)
    if not 0.0 <= fraction < 1.0:
        raise ValueError("jitter must be a fraction in [0, 1)")
    return ceiling * fraction


def pause_after_failures(
    failures: int, *, jitter: float, base: float = 0.1, cap: float = 5.0
) -> float:
    """Return how long to wait before trying an infrastructure call again (a claim, a
    settle, a maintenance duty, a reconnection) after ``failures`` failures in a row.

    The pause doubles with each failure from ``2 * base`` up to ``cap``, scaled by a
    factor from 0.5 to 1.5 (``jitter`` is a random fraction in [0, 1)), so that workers
    that lost the database together do not all come back in the same instant.

    >>> pause_after_failures(1, jitter=0.5)
    0.2
    >>> pause_after_failures(10, jitter=0.5)
    5.0
    >>> pause_after_failures(3, jitter=0.0, base=0.2, cap=10.0)
    0.8
    """
    if not 0.0 <= jitter < 1.0:
        raise ValueError("jitter must be a fraction in [0, 1)")
    exponent = min(max(failures, 0), 62)
    return min(cap, base * 2.0**exponent) * (0.5 + jitter)


def should_retry(*, attempt: int, max_attempts: int) -> bool:
    """Return whether another attempt may follow attempt number ``attempt``.

    >>> should_retry(attempt=2, max_attempts=3)
    True
    >>> should_retry(attempt=3, max_attempts=3)
    False
    """
    return attempt < max_attempts


def retry_limit_note(*, limit: int, first_id: str) -> str:
    """The note a failed job's error ends with once its chain has had the ``limit``
    manual retries its type allows.

    >>> retry_limit_note(limit=2, first_id="j1")
    'retry limit reached (2 manual retries of j1)'
    """
    return f"retry limit reached ({limit} manual retries of {first_id})"
