"""Reading job rows, shared by both stores: which columns make a Job, picked by position.

A claim turns up to ``concurrency`` rows into Jobs many times a second; picking the
columns by position with one ``itemgetter`` costs a fraction of a look-up by name per
column (sqlite3.Row compares every column name in turn, a dict row is built per row).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

from conveyor.core.lifecycle import Status

# The columns a Job is read from, in the order each store's _job_of takes them.
JOB_COLUMNS = (
    "id", "type", "queue", "tenant", "payload", "status", "priority", "attempt",
    "max_attempts", "run_at", "created_at", "timeout", "lease_seconds", "backoff_base",
    "backoff_cap", "progress_done", "progress_total", "progress_message", "state", "result",
    "result_ref", "error", "parent_id", "root_id", "depends_on", "unique_key",
    "concurrency_key", "retry_of", "started_at", "finished_at", "lease_owner",
    "lease_expires_at", "lease_token", "cancel_requested", "trace_context", "retry_count",
    "retried_by", "submitted_by",
)  # fmt: skip

# A status by its stored value, without going through Enum's call.
STATUS = {s.value: s for s in Status}


@functools.lru_cache(maxsize=32)
def job_picker(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """Pick the job columns, in JOB_COLUMNS order, out of a row whose columns are ``names``."""
    index = {name: i for i, name in enumerate(names)}
    return operator.itemgetter(*(index[c] for c in JOB_COLUMNS))
