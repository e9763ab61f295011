"""Parsing of human durations such as ``"30s"``, ``"15m"`` or ``"1h30m"``."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")

Duration = float | int | str | timedelta


def seconds(value: Duration) -> float:
    """Return a duration in seconds from a number, a ``timedelta`` or a string like ``"1h30m"``.

    >>> seconds("1h30m")
    5400.0
    >>> seconds(2.5)
    2.5
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: use seconds or a string like '30s'")
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not text:
            raise ValueError("invalid duration '': use a number of seconds or e.g. '30s', '15m'")
        try:
            return _nonnegative(float(text), value)
        except ValueError:
            pass
        pos = 0
        result = 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            result += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if pos != len(text) or pos == 0:
            raise ValueError(
                f"invalid duration {value!r}: use a number of seconds or units ms, s, m, h, d "
                "such as '500ms', '30s', '1h30m'"
            )
    else:
        raise ValueError(f"invalid duration {value!r}: use seconds or a string like '30s'")
    return _nonnegative(result, value)


def _nonnegative(result: float, original: object) -> float:
    if result < 0:
        raise ValueError(f"invalid duration {original!r}: must not be negative")
    return result
