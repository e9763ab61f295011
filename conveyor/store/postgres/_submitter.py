"""Which way a submit goes on PostgreSQL: each the cheapest that keeps its guarantees.

- One job without dependencies is one autocommit ``INSERT`` (``submit_one``): through
  the one-job lane (``_lane.py``) from async code, on a connection of the store's
  transaction pool on the caller's own thread from a blocking caller (``app.sync``).
- A batch whose jobs have no ids, unique keys or dependencies is one ``COPY``, checked
  chunk by chunk while the server inserts (``_submit.copy_chunks``); any other batch,
  and a job whose id or unique key turns out taken, takes the general steps
  (``_submit.submit_steps``) in one transaction.
- On an application's own connection the jobs join its transaction
  (``_submit.ApplicationSubmits``).

The store's operations only name these ways (:class:`Submitter`); the statements and the
steps are in ``_submit.py``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from conveyor.core.model import NewJob
from conveyor.store.postgres._connection import retrying
from conveyor.store.postgres._errors import translated
from conveyor.store.postgres._lane import OneJobSubmits
from conveyor.store.postgres._submit import (
    ApplicationSubmits,
    copy_chunks,
    copy_slices,
    copyable,
    submit_one_now,
    submit_steps,
)
from conveyor.store.protocol import Inserted, Submitted
from conveyor.store.scripts import Script

SyncConnection = psycopg.Connection[Any]
Steps = Callable[[], Script[list[Submitted]]]


class Submitter:
    """The submits of one store, each sent the way the module's docstring says.

    It is handed the store's ways to run things: ``read`` runs steps in autocommit on
    the event loop, ``script`` in one transaction off it, ``transaction`` a function on
    a transaction thread's connection; ``tx_pool`` is the pool of those connections
    (None while the store is closed), ``now`` the store's pinned time or None, ``where``
    the database's description for error messages.
    """

    def __init__(
        self,
        *,
        lane: OneJobSubmits,
        on_application: ApplicationSubmits,
        read: Callable[[Steps], Awaitable[list[Submitted]]],
        script: Callable[[Steps], Awaitable[list[Submitted]]],
        transaction: Callable[..., Awaitable[Any]],
        tx_pool: Callable[[], ConnectionPool[SyncConnection] | None],
        now: Callable[[], datetime | None],
        where: Callable[[], str],
    ) -> None:
        self._lane = lane
        self._on_application = on_application
        self._read = read
        self._script = script
        self._transaction = transaction
        self._tx_pool = tx_pool
        self._now = now
        self._where = where

    async def submit(
        self, jobs: Sequence[NewJob], connection: object | None = None
    ) -> list[Submitted]:
        """Insert jobs in one transaction, on the store's connections or in
        ``connection``'s transaction (see :meth:`PostgresStore.submit`)."""
        if not jobs:
            return []
        if connection is not None:
            return await self._on_application.submit(connection, jobs, self._now())
        # New steps for each try: a retry after a lost connection starts over.
        if len(jobs) == 1 and not jobs[0].depends_on:
            # One job is one autocommit INSERT, one round trip. Should its id or unique
            # key be taken, it writes nothing and the general steps that follow (their
            # INSERT again a no-op) find the holder.
            one = await self._lane.submit(jobs[0], self._now())
            if one is not None:
                return [one]
            return await self._read(lambda: submit_steps(jobs, None))
        # COPY, unless an id is taken (None): then the INSERT below returns its job.
        if copyable(jobs) and (copied := await self.copy_prepared(copy_slices(jobs))):
            return copied.submitted()
        return await self._script(lambda: submit_steps(jobs, None))

    def submit_now(
        self, jobs: Sequence[NewJob], connection: object | None = None
    ) -> list[Submitted] | None:
        """:meth:`submit` on the calling thread, one without an event loop, or None with
        nothing written (see :meth:`PostgresStore.submit_now`)."""
        if not jobs:
            return None
        if connection is not None:
            return self._on_application.submit_now(connection, jobs, self._now())
        pool = self._tx_pool()
        if pool is None or len(jobs) != 1 or jobs[0].depends_on:
            return None
        job, now = jobs[0], self._now()
        with translated(self._where):
            one = retrying(pool, lambda conn: submit_one_now(conn, job, now))
        return None if one is None else [one]

    async def copy_prepared(self, chunks: Iterable[Sequence[NewJob]]) -> Inserted | None:
        """One COPY of ``chunks``, or None if an id was taken (see
        :meth:`PostgresStore.copy_prepared`)."""
        inserted: Inserted | None = await self._transaction(
            lambda conn: copy_chunks(conn, chunks, self._now()), atomic=False
        )
        return inserted
