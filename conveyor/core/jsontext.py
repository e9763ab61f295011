"""Compact JSON text, written the way ``json.dumps(value, separators=(",", ":"))`` writes it,
and read back.

``json.dumps`` with arguments builds a new encoder object on every call, which costs more
than encoding a small payload; the submit path encodes each payload twice (the check that
it is JSON, the text the store writes), so these call the C encoder directly. The output
is byte for byte that of ``json.dumps`` with the same options. :func:`loads` reads such
text with the C scanner alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

try:
    from json.encoder import c_make_encoder  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - CPython always has it
    c_make_encoder = None


def _default(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _encoder(allow_nan: bool) -> Callable[[Any], str]:
    if c_make_encoder is None:  # pragma: no cover

        def slow(value: Any) -> str:
            return json.dumps(value, separators=(",", ":"), allow_nan=allow_nan)

        return slow

    def encode(value: Any) -> str:
        # A fresh markers dict each time: it is how the encoder refuses circular values.
        make = c_make_encoder(
            {}, _default, encode_basestring_ascii, None, ":", ",", False, False, allow_nan
        )
        return "".join(make(value, 0))

    return encode


# compact(value): json.dumps(value, separators=(",", ":")).
compact = _encoder(allow_nan=True)
# strict_compact(value): the same, refusing NaN and infinities with ValueError.
strict_compact = _encoder(allow_nan=False)


def strict_compact_each(values: list[Any]) -> list[str]:
    """``[strict_compact(v) for v in values]``, with one encoder for them all: a batch's
    payloads are encoded for about what encoding their list once costs, where building an
    encoder per value costs more than encoding a small one.

    One encoder may serve several values in turn: its markers (the values being encoded,
    to refuse circular ones) are empty again after each value it encoded. On an error
    (ValueError, TypeError) nothing is returned, and the encoder is dropped.
    """
    if c_make_encoder is None:  # pragma: no cover
        return [strict_compact(v) for v in values]
    make = c_make_encoder(
        {}, _default, encode_basestring_ascii, None, ":", ",", False, False, False
    )
    join = "".join
    return [join(make(v, 0)) for v in values]


def plain_text(value: dict[Any, Any]) -> bool:
    """Whether a flat mapping holds only what every store writes faithfully as it is:
    ASCII string keys and values without NUL, finite floats, ints, booleans and None.

    A quick test for the common payload; False means "look closer", not "refused".
    """
    for key, item in value.items():
        if type(key) is not str or not key.isascii() or "\x00" in key:
            return False
        kind = type(item)
        if kind is str:
            if not item.isascii() or "\x00" in item:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is not int and kind is not bool and item is not None:
            return False
    return True


_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads(text: str) -> Any:
    """``json.loads`` for documents conveyor wrote itself, in half the time.

    ``json.loads`` wraps the C scanner in two regular-expression matches for the
    whitespace around the document (and, given bytes, guesses their encoding first); the
    payloads, states and results conveyor stores have none. Text that is not one whole
    document is left to ``json.loads``, which reads it (or raises) as it always did.
    """
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)
