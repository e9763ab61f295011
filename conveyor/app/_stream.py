"""A large batch prepared a chunk at a time while the store writes it (PostgreSQL's COPY).

``submit_many`` checks a whole batch (``prepare``), then the store sends it, then the
server inserts it: with the client's checks and the server's inserts one after the other,
the server waits while the client checks. For a batch of plain jobs (no ids, unique keys,
dependencies or tenants, on conveyor's own connection) the store can instead ask for
the jobs a chunk at a time inside its one COPY: each chunk is checked as the server inserts
the one before. The COPY is one statement in one transaction, so a bad payload further on
stores nothing, and the error raised is the first bad job's, as ``prepare`` raises it.
The COPY returns what it inserted as one record (:class:`~conveyor.store.Inserted`), and
the batch's handles make their jobs' records when first read (:func:`inserted_handles`).

SQLite's store takes the same chunks (``SQLiteStore.copy_prepared``), prepared before its
one transaction rather than inside it (one writer: other processes' writes would wait
on the checks), for the rest: a chunk of one type's jobs bound without a job made for
each, and one :class:`~conveyor.store.Inserted` for the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from conveyor.app._results import inserted_handles, submitted_handles
from conveyor.app._submit import streamed_jobs
from conveyor.app.handles import JobHandle, JobSource, Submission
from conveyor.app.registry import Registry
from conveyor.core.ids import new_ids_when_asked
from conveyor.core.model import NewJob
from conveyor.observe import tracing
from conveyor.observe.metrics import Metrics
from conveyor.store.protocol import Inserted, Submitted

# Batches at least this large are streamed, in chunks of this many jobs.
STREAM_FROM = 400
CHUNK = 200


def streamable(submissions: Sequence[Submission], connection: Any) -> bool:
    """Whether a batch may be prepared as its COPY asks for it: large, on conveyor's own
    connection, and of jobs the COPY takes and no tenant's limit applies to."""
    if connection is not None or len(submissions) < STREAM_FROM:
        return False
    for s in submissions:
        if s.id is not None or s.unique_key is not None or s.tenant is not None or s.depends_on:
            return False
    return True


class PreparedChunks:
    """A batch's jobs, prepared a chunk at a time as they are asked for (on the store's
    thread), each chunk once: a second pass (the COPY again after a lost connection)
    gives the same jobs, ids included."""

    def __init__(
        self,
        submissions: Sequence[Submission],
        prepare: Callable[[Sequence[Submission]], Sequence[NewJob]],
    ) -> None:
        self._submissions = submissions
        self._prepare = prepare
        self._chunks: list[Sequence[NewJob]] = []

    def __iter__(self) -> Iterator[Sequence[NewJob]]:
        for i in range(len(self._submissions) // CHUNK + 1):
            if i < len(self._chunks):
                chunk = self._chunks[i]
            else:
                part = self._submissions[i * CHUNK : (i + 1) * CHUNK]
                if not part:
                    return
                chunk = self._prepare(part)
                self._chunks.append(chunk)
            yield chunk

    def jobs(self) -> list[NewJob]:
        """Every job of the batch (those not asked for yet prepared now)."""
        for _ in self:
            pass
        return [job for chunk in self._chunks for job in chunk]


async def submit_streamed(
    store: object,
    submissions: Sequence[Submission],
    prepare: Callable[[Sequence[Submission]], Sequence[NewJob]],
) -> Inserted | tuple[list[NewJob], list[Submitted]] | None:
    """Submit a :func:`streamable` batch prepared a chunk at a time by ``store``'s COPY
    (None: ``store`` cannot: submit it the usual way). Returns what the COPY inserted, or,
    should an id be taken, the jobs and the results of the usual submit."""
    copy_prepared = getattr(store, "copy_prepared", None)
    if copy_prepared is None:
        return None
    chunks = PreparedChunks(submissions, prepare)
    inserted: Inserted | None = await copy_prepared(chunks)
    if inserted is None:  # an id was taken, nothing stored: the usual way finds its job
        jobs = chunks.jobs()
        return jobs, await store.submit(jobs)  # type: ignore[attr-defined]
    return inserted


async def submit_large(
    app: JobSource,
    metrics: Metrics,
    store: object,
    registry: Registry,
    submissions: Sequence[Submission],
    now: float,
) -> list[JobHandle] | None:
    """Submit a :func:`streamable` batch of ``registry``'s types, submitted at ``now``, by
    ``store``'s COPY (:func:`submit_streamed`) and return the handles on its jobs (their
    creations counted in ``metrics``); None when ``store`` cannot stream it."""
    parent = tracing.current_traceparent()
    # The batch's ids made together, in order (see new_ids), and taken by its chunks in
    # turn (each prepared once, in order); none made if the store does not stream
    # (SQLite: the usual way makes them).
    ids = new_ids_when_asked(now, len(submissions))
    streamed = await submit_streamed(
        store,
        submissions,
        lambda part: streamed_jobs(registry, part, now, parent, "local", ids),
    )
    if isinstance(streamed, Inserted):
        return inserted_handles(app, metrics, streamed)
    if streamed is not None:
        return submitted_handles(app, metrics, *streamed)
    return None
