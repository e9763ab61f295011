"""The cyclic garbage collector held off while a large batch is submitted.

A call of ``submit_many`` with a thousand jobs makes several thousand container objects
(the new jobs, the stored jobs, the handles, the checked payloads) that live for the whole
call. With the collector on, they are scanned by the young collections, promoted, and the
promotions trigger full collections of the process's whole heap: on PostgreSQL's bulk
submit that was about a third of the client's CPU per job (docs/performance.md). None of
these objects is part of a reference cycle: reference counting frees them when the call's
caller drops them, and a collection could find nothing to free among them.

So a large submit pauses the collector for its duration: process-wide, as ``gc.disable``
is; reentrant across concurrent calls (the last one out turns it back on); and never turned
on by conveyor when it was off as the first call began. Objects left to the collector by
other code in the meantime wait a few milliseconds longer; nothing is leaked.

A pause never outlives its first second by being joined: a large submit that begins once
the pause is older than :data:`JOIN_WITHIN` runs without it, so a server taking one bulk
submit after another, overlapping, still gets the collector back between them (joined
without a limit, the pause would last as long as the overlap, which can be for ever).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Batches at least this large pause the collector; a small one makes few objects.
PAUSE_FROM = 100
# A pause may be joined by other large submits only this long (seconds) after it began.
JOIN_WITHIN = 1.0

_lock = threading.Lock()
_paused = 0  # calls inside a pause
_ours = False  # whether this module turned the collector off (and so turns it back on)
_began = 0.0  # when (monotonic) the pause under way began


@contextmanager
def collector_paused(size: int) -> Iterator[None]:
    """Hold the cyclic garbage collector off while a batch of ``size`` jobs is submitted
    (smaller than :data:`PAUSE_FROM`: leave it alone)."""
    global _paused, _ours, _began
    if size < PAUSE_FROM:
        yield
        return
    with _lock:
        now = time.monotonic()
        if _paused and now - _began > JOIN_WITHIN:
            joined = False  # too old to join: it ends when the calls inside it do
        else:
            joined = True
            if _paused == 0:
                _ours = gc.isenabled()
                _began = now
                if _ours:
                    gc.disable()
            _paused += 1
    if not joined:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _ours:
                _ours = False
                gc.enable()
