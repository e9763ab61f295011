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
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Batches at least this large pause the collector; a small one makes few objects.
PAUSE_FROM = 100

_lock = threading.Lock()
_paused = 0  # calls inside a pause
_ours = False  # whether this module turned the collector off (and so turns it back on)


@contextmanager
def collector_paused(size: int) -> Iterator[None]:
    """Hold the cyclic garbage collector off while a batch of ``size`` jobs is submitted
    (smaller than :data:`PAUSE_FROM`: leave it alone)."""
    global _paused, _ours
    if size < PAUSE_FROM:
        yield
        return
    with _lock:
        if _paused == 0:
            _ours = gc.isenabled()
            if _ours:
                gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _ours:
                _ours = False
                gc.enable()
