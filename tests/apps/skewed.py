"""The process-test application, on a machine whose clock is off by
CONVEYOR_TEST_CLOCK_OFFSET seconds: ``time.time`` is shifted for the whole process."""

from __future__ import annotations

import os
import time

_real_time = time.time
_offset = float(os.environ.get("CONVEYOR_TEST_CLOCK_OFFSET", "0"))
time.time = lambda: _real_time() + _offset

from tests.apps.procs import app  # noqa: E402

__all__ = ["app"]
