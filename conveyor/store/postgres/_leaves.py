"""Settling the children of a tree in one round trip (issue #12).

A job with a parent used to leave the plain settle (one pipelined round trip) for the
store's full settle: a second transaction of several round trips, which held the row of
its root's counts locked from its update to its commit, across those round trips. A big
fan-out's children then settled at half the rate of independent jobs.

Most children are leaves: a parent, but no jobs below them, no cancel asked for and no
pending dependents. ``settle_leaves`` (queries.sql) settles those, with the plain jobs
of the batch, and carries their ends to the counts of every ancestor in one statement,
sent with BEGIN, the lock and COMMIT in one pipeline: the counts rows are held for the
commit only. A store that met no tree's job lately keeps the plain settle alone
(``settle_plain_only``), and sends what it leaves here (:meth:`PostgresStore.settle`).
Deciding a parent is rare (its last child ended): the statement returns the parents
whose counts show nothing unfinished, and the store decides them afterwards in a
transaction of its own that locks their counts and reads them again
(``scripts.finish_listed``). Of two children that end last at once, the one whose update
of the counts comes second sees zero: the row lock orders them. A parent ends only from
``waiting`` (``finish_waiting``), so it ends once, whoever decides; a parent still
running decides from its counts when its own handler returns; and a worker that dies
between the commit and the decision leaves a waiting parent with nothing unfinished
below it, which the maintenance sweep (``finish_parents``) ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row

from conveyor.core.model import Settlement
from conveyor.store.postgres._codec import Q, settle_params, settle_plain

# After a settle met jobs of a tree, the following settles use settle_leaves instead of
# the plain settle for this long: a store that settles no tree's jobs pays nothing for it.
TREE_SECONDS = 10.0


@dataclass
class LeafSettle:
    """What a settle's first transaction did: the ids refused, the settlements left for
    the full settle, the parents that may now be decided, and whether it met jobs of a
    tree (or with dependents: any job the plain settle leaves)."""

    refused: list[str] = field(default_factory=list)
    rest: list[Settlement] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    tree: bool = False


class TreeSettles:
    """Whether this store settled jobs of a tree lately (then leaves ride with the plain
    settle's round trip)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen_at: float | None = None

    def recent(self) -> bool:
        return self._seen_at is not None and self._clock() - self._seen_at < TREE_SECONDS

    def saw(self, tree: bool) -> None:
        """Note a settle, and whether it met jobs of a tree."""
        if tree:
            self._seen_at = self._clock()


def settle_plain_only(
    conn: psycopg.Connection[Any], settlements: Sequence[Settlement], now: datetime | None
) -> LeafSettle:
    """The plain settle alone (``_codec.settle_plain``), for a store that met no tree lately."""
    return LeafSettle(*settle_plain(conn, settlements, now))


def settle_with_leaves(
    conn: psycopg.Connection[Any], settlements: Sequence[Settlement], now: datetime | None
) -> LeafSettle:
    """Settle plain jobs and leaf children in one round trip; leave the rest to the
    store's full settle.

    BEGIN, the lock, the settle and COMMIT are sent at once (a pipeline), as in
    ``settle_plain``: the rows of counts stay locked for the commit only.
    """
    params = settle_params(settlements, now, False)
    try:
        with conn.pipeline() as pipeline, conn.cursor(row_factory=tuple_row) as cursor:
            conn.execute("BEGIN")
            conn.execute(Q["lock_settling"], {"ids": params["ids"]})
            cursor.execute(Q["settle_leaves"], params)
            conn.execute("COMMIT")
            pipeline.sync()
            rows = cursor.fetchall()
    except BaseException:
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()
        raise
    by_kind: dict[str, set[str]] = {"settled": set(), "leaf": set(), "kept": set(), "done": set()}
    for kind, job_id in rows:
        by_kind[kind].add(job_id)
    answered = by_kind["settled"] | by_kind["leaf"] | by_kind["kept"]
    return LeafSettle(
        refused=[s.job_id for s in settlements if s.job_id not in answered],
        rest=[s for s in settlements if s.job_id in by_kind["kept"]],
        done=sorted(by_kind["done"]),
        tree=bool(by_kind["leaf"] or by_kind["kept"]),
    )
