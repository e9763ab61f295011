"""PostgreSQL's settle: a worker's batch in one round trip where it can, the rest in one
transaction that carries each end on to its parent and dependents.

A batch first takes the plain settle (``settle_plain``, or ``settle_leaves`` once the store
met trees lately): BEGIN, a lock, one UPDATE and COMMIT sent at once, a pipeline, so the
transaction's locks never wait for this process. What it leaves (jobs whose end reaches
another job, or that need deciding from their children) takes the full settle
(:meth:`Settles.settle_in`), where the shared script ``after_settle`` carries the ends on.

The children of a tree settle in that one round trip too. A job with a parent used to
leave the plain settle for the full settle: a second transaction of several round trips,
which held the row of its root's counts locked from its update to its commit, across
those round trips. A big fan-out's children then settled at half the rate of independent
jobs.

Most children are leaves: a parent, but no jobs below them, no cancel asked for and no
pending dependents. ``settle_leaves`` (queries.sql) settles those, with the plain jobs
of the batch, and carries their ends to the counts of every ancestor in one statement,
sent with BEGIN, the lock and COMMIT in one pipeline: the counts rows are held for the
commit only. A store that met no tree's job lately keeps the plain settle alone
(``settle_plain_only``), and sends what it leaves here (:meth:`Settles.settle`).
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
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, tuple_row

from conveyor.core.lifecycle import Status
from conveyor.core.model import Settlement
from conveyor.store import scripts
from conveyor.store._rows import STATUS
from conveyor.store.postgres._codec import Q, as_float, number_array, run_script, text_array
from conveyor.store.postgres._dialect import DIALECT
from conveyor.store.scripts import dumps

T = TypeVar("T")
SyncConnection = psycopg.Connection[DictRow]


class Transaction(Protocol):
    """The store's way to run work in one transaction on its threads (see
    :meth:`PostgresStore._transaction`)."""

    async def __call__(self, work: Callable[[SyncConnection], T], *, atomic: bool = True) -> T: ...


def settle_params(
    settlements: Sequence[Settlement], now: datetime | None, decided: bool
) -> dict[str, Any]:
    """A settle's parameters: a column of the batch in each array (see ``text_array``)."""
    return {
        "now": now,
        "decided": decided,
        "ids": text_array([s.job_id for s in settlements]),
        "tokens": number_array([s.token for s in settlements]),
        "statuses": text_array([s.status.value for s in settlements]),
        "outcomes": text_array([s.outcome.value if s.outcome else None for s in settlements]),
        "results": text_array([dumps(s.result) for s in settlements]),
        "result_refs": text_array([s.result_ref for s in settlements]),
        "errors": text_array([s.error for s in settlements]),
        "tracebacks": text_array([s.traceback for s in settlements]),
        "retry_delays": number_array([float(s.retry_delay) for s in settlements]),
        "done": number_array([float(s.progress.done) if s.progress else None for s in settlements]),
        "total": number_array(
            [as_float(s.progress.total) if s.progress else None for s in settlements]
        ),
        "message": text_array([s.progress.message if s.progress else None for s in settlements]),
    }


def settle_plain(
    conn: psycopg.Connection[Any], settlements: Sequence[Settlement], now: datetime | None
) -> tuple[list[str], list[Settlement]]:
    """Settle the jobs whose end reaches no other job, in one round trip.

    BEGIN, the lock, the settle and COMMIT are sent at once (a pipeline), so the
    transaction's locks never wait for this process. Returns the ids refused and the
    settlements left for the store's transactional settle: jobs with a parent, children
    or pending dependents, still running.
    """
    rows = _pipelined(conn, "settle_plain", settle_params(settlements, now, False))
    plain = {job_id for job_id, is_plain in rows if is_plain}
    kept = {job_id for job_id, is_plain in rows if not is_plain}
    refused = [s.job_id for s in settlements if s.job_id not in plain and s.job_id not in kept]
    return refused, [s for s in settlements if s.job_id in kept]


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
    """The plain settle alone (``settle_plain``), for a store that met no tree lately."""
    return LeafSettle(*settle_plain(conn, settlements, now))


def settle_with_leaves(
    conn: psycopg.Connection[Any], settlements: Sequence[Settlement], now: datetime | None
) -> LeafSettle:
    """Settle plain jobs and leaf children in one round trip; leave the rest to the
    store's full settle.

    BEGIN, the lock, the settle and COMMIT are sent at once (a pipeline), as in
    ``settle_plain``: the rows of counts stay locked for the commit only.
    """
    rows = _pipelined(conn, "settle_leaves", settle_params(settlements, now, False))
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


class Settles:
    """A store's settles, and whether they met jobs of a tree lately."""

    def __init__(self, transaction: Transaction, now: Callable[[], datetime | None]) -> None:
        self._transaction = transaction
        self._now = now
        self._trees = TreeSettles()

    async def settle(self, settlements: Sequence[Settlement]) -> list[str]:
        """Settle a batch; return the ids refused (their lease was lost)."""
        if not settlements:
            return []
        now = self._now()
        # A store that met trees lately settles their leaves with the plain jobs in one
        # round trip; others try the plain settle alone first.
        leaves = self._trees.recent()
        first = settle_with_leaves if leaves else settle_plain_only
        ran = await self._transaction(lambda c: first(c, settlements, now), atomic=False)
        if ran.rest and not leaves:
            refused, rest = ran.refused, ran.rest
            ran = await self._transaction(lambda c: settle_with_leaves(c, rest, now), atomic=False)
            ran.refused[:0] = refused
        self._trees.saw(ran.tree)
        if ran.rest:
            ran.refused += await self._transaction(lambda conn: self.settle_in(conn, ran.rest))
        if ran.done:
            done = ran.done  # a new script for each try: a retried transaction starts over
            await self._transaction(
                lambda conn: self._drive(conn, scripts.finish_listed(DIALECT, done))
            )
        return ran.refused

    def settle_in(self, conn: SyncConnection, settlements: Sequence[Settlement]) -> list[str]:
        """Settle in the caller's transaction; a job's end reaches its parent and dependents.

        A worker's batch comes here only for the jobs its first settle left (see
        :meth:`settle`); a rescue's whole batch does. The settle and the look-up of
        dependents are pipelined, one round trip.
        """
        now = self._now()
        # Queued ones too: a job whose cancel was asked for ends cancelled instead.
        ended = [s.job_id for s in settlements if s.status.terminal or s.status is Status.QUEUED]
        with conn.pipeline():
            settled = conn.execute(Q["settle"], settle_params(settlements, now, False))
            awaited = conn.execute(Q["awaited"], {"ids": ended}) if ended else None
            rows = settled.fetchall()
            # Exact for the jobs deferred below too: the settle locked their rows first.
            upstream = {r["id"] for r in awaited.fetchall()} if awaited else set()
        by_id = {row["id"]: row for row in rows}
        deferred = [s for s in settlements if s.job_id in by_id and by_id[s.job_id]["deferred"]]
        parents: frozenset[str] = frozenset()
        if deferred:
            decided = self._drive(conn, scripts.decide_from_children(DIALECT, deferred))
            params = settle_params(decided, now, True)
            for row in conn.execute(Q["settle"], params).fetchall():
                by_id[row["id"]] = row
            parents = frozenset(d.job_id for d in decided)
        ends = [
            (row["id"], row["parent_id"], STATUS[row["status"]])
            for row in by_id.values()
            if not row["deferred"]
        ]
        if ends:
            carry_on = scripts.after_settle(DIALECT, ends, awaited=upstream, parents=parents)
            self._drive(conn, carry_on)
        return [s.job_id for s in settlements if s.job_id not in by_id]

    def _drive(self, conn: SyncConnection, script: scripts.Script[T]) -> T:
        with conn.cursor() as cursor:
            return run_script(cursor, script, self._now())


def _pipelined(conn: psycopg.Connection[Any], query: str, params: dict[str, Any]) -> list[Any]:
    """Run the settle ``query`` in its own transaction, in one round trip: BEGIN, the lock
    of the settling rows, the settle and COMMIT are sent at once (a pipeline), so the
    transaction's locks never wait for this process. Returns the settle's rows."""
    try:
        with conn.pipeline() as pipeline, conn.cursor(row_factory=tuple_row) as cursor:
            conn.execute("BEGIN")
            conn.execute(Q["lock_settling"], {"ids": params["ids"]})
            cursor.execute(Q[query], params)
            conn.execute("COMMIT")
            pipeline.sync()
            return cursor.fetchall()
    except BaseException:
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()
        raise
