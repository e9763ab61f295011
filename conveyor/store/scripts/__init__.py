"""Transaction scripts shared by both stores, written once and free of any SQL dialect.

A script is a generator: it yields ``(query_name, params)`` steps, receives each step's
rows back, and returns its result. Each backend drives scripts with one runner of its
own, which looks the name up in its ``queries.sql``, encodes the parameters (SQLite:
lists as JSON text, times as epoch seconds; PostgreSQL: native values) and supplies
``now``, the store's clock: so scripts never pass ``now``, and a script that needs the
time in Python asks for it with the ``now`` step. Values read from rows go through the
backend's :class:`Dialect`; values copied from one row into a later step (a compare-and-set
on a stored time) are passed on as read, so no time goes through a float and back.

Scripts run inside one transaction of the runner's choosing: SQLite's store thread
inside ``BEGIN IMMEDIATE``, PostgreSQL's transaction thread (never across an event-loop
hop). Where a dialect needs no statement for a step (SQLite needs no lock: ``BEGIN
IMMEDIATE`` holds the write lock), its ``queries.sql`` names a no-op.

The scripts are split by domain, one module each (trees, callbacks, rescue, submit,
schedules, leases, retention, claim), beside the shared ground (``base``: the types, the
:class:`Dialect`, the drivers) and the rows read and written (``rows``, ``dashboard``).
This package names every public one, so a backend calls ``scripts.cancel`` wherever it lives.
"""

from __future__ import annotations

from conveyor.store.scripts.base import Dialect, Ended, Row, Script, Step, drive, drive_async, now
from conveyor.store.scripts.callbacks import callback_definition, callback_job, fire_callbacks
from conveyor.store.scripts.claim import claim_limited
from conveyor.store.scripts.dashboard import audit_entry, audit_params, minute_stats
from conveyor.store.scripts.leases import acquire_lease, lease_history, release_lease, renew_lease
from conveyor.store.scripts.rescue import rescue_decisions, rescued
from conveyor.store.scripts.retention import FOREVER, prune
from conveyor.store.scripts.rows import (
    attempt,
    dumps,
    health_counts,
    lease_record,
    past_lease,
    queue_infos,
    schedule_info,
    schedule_params,
    token,
    token_params,
    worker_info,
    worker_params,
)
from conveyor.store.scripts.schedules import (
    fire_schedules,
    run_schedule,
    schedules,
    set_schedule_enabled,
    sync_schedules,
)
from conveyor.store.scripts.submit import (
    check_dependencies,
    check_same_tenant,
    job_event,
    retry,
    retry_many,
    spawn,
)
from conveyor.store.scripts.trees import (
    BUCKET,
    COUNTERS,
    Change,
    Known,
    after_settle,
    cancel,
    cascade,
    count_moves,
    counts_by_status,
    decide_from_children,
    finish_listed,
    finish_parent,
    finish_parents,
    get_with_counts,
    lock_counts,
    moves_of,
    tree_counts,
)

__all__ = [
    "BUCKET",
    "COUNTERS",
    "FOREVER",
    "Change",
    "Dialect",
    "Ended",
    "Known",
    "Row",
    "Script",
    "Step",
    "acquire_lease",
    "after_settle",
    "attempt",
    "audit_entry",
    "audit_params",
    "callback_definition",
    "callback_job",
    "cancel",
    "cascade",
    "check_dependencies",
    "check_same_tenant",
    "claim_limited",
    "count_moves",
    "counts_by_status",
    "decide_from_children",
    "drive",
    "drive_async",
    "dumps",
    "finish_listed",
    "finish_parent",
    "finish_parents",
    "fire_callbacks",
    "fire_schedules",
    "get_with_counts",
    "health_counts",
    "job_event",
    "lease_history",
    "lease_record",
    "lock_counts",
    "minute_stats",
    "moves_of",
    "now",
    "past_lease",
    "prune",
    "queue_infos",
    "release_lease",
    "renew_lease",
    "rescue_decisions",
    "rescued",
    "retry",
    "retry_many",
    "run_schedule",
    "schedule_info",
    "schedule_params",
    "schedules",
    "set_schedule_enabled",
    "spawn",
    "sync_schedules",
    "token",
    "token_params",
    "tree_counts",
    "worker_info",
    "worker_params",
]
