"""Time-sortable job ids: 48 bits of milliseconds and 80 random bits, in Crockford base32."""

from __future__ import annotations

import os

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def new_id(now: float) -> str:
    """Return a new 26-character id that sorts by ``now`` (seconds since the epoch).

    >>> len(new_id(0.0))
    26
    >>> new_id(1.0) < new_id(2.0)
    True
    """
    value = (int(now * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))
