"""Time-sortable job ids: 48 bits of milliseconds and 80 random bits, in Crockford base32."""

from __future__ import annotations

import os
import re

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
# Two digits at a time: every 10-bit value's pair of digits.
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
_SHIFTS = range(120, -1, -10)  # 13 pairs: 130 bits, the top two always zero


def new_id(now: float) -> str:
    """Return a new 26-character id that sorts by ``now`` (seconds since the epoch).

    >>> len(new_id(0.0))
    26
    >>> new_id(1.0) < new_id(2.0)
    True
    """
    value = (int(now * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    return encode(value)


def encode(value: int) -> str:
    """The 26 base32 digits of a 128-bit ``value``, most significant first.

    >>> encode(0)
    '00000000000000000000000000'
    >>> encode(2**128 - 1)
    '7zzzzzzzzzzzzzzzzzzzzzzzzz'
    """
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


# The ids a client may choose for its jobs (docs/api.md): URL-safe without escaping, no
# '/' (a job's URL is /jobs/{id}), no whitespace, no control characters.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$"
_CLIENT_ID = re.compile(ID_PATTERN)


def check_job_id(value: object) -> str:
    """Return a client-chosen job id, or raise ValueError saying what one looks like.

    >>> check_job_id("invoice-42.pdf")
    'invoice-42.pdf'
    >>> check_job_id("a/b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: a job id is 1 to 200 letters, digits and . _ : @ + = - ... not 'a/b'
    """
    if not isinstance(value, str) or not _CLIENT_ID.fullmatch(value):
        shown = (
            repr(value)
            if not isinstance(value, str) or len(value) <= 60
            else repr(value[:60]) + "..."
        )
        raise ValueError(
            "a job id is 1 to 200 letters, digits and . _ : @ + = - starting with a letter or "
            f"digit (no '/', spaces or control characters), not {shown}"
        )
    return value
