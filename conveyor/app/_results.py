"""A store's submit results as handles, for the :class:`~conveyor.Conveyor` facade: the
jobs it created or found (an id reused for another job refused), or the jobs it inserted
as they were submitted (:class:`~conveyor.store.Inserted`, whose handles make their
records when first read); each job created counted once in the metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import attrgetter

from conveyor.app.handles import InsertedHandle, JobHandle, JobSource
from conveyor.core.model import NewJob, SameJobs
from conveyor.errors import IdempotencyConflict
from conveyor.observe.metrics import Metrics
from conveyor.store.protocol import Inserted, Submitted


def submitted_handles(
    app: JobSource, metrics: Metrics, new_jobs: Sequence[NewJob], results: Sequence[Submitted]
) -> list[JobHandle]:
    """Handles on the jobs of a store's submit results, refusing an id reused differently
    (:class:`~conveyor.errors.IdempotencyConflict`); the jobs created counted in
    ``metrics``, once per type and queue."""
    handles = []
    created: dict[tuple[str, str], int] = {}
    try:
        for new, submitted in zip(new_jobs, results, strict=True):
            job = submitted.job
            same_id = not submitted.created and job.id == new.id
            if same_id and (job.type != new.type or job.payload != new.payload):
                raise IdempotencyConflict(
                    f"job {new.id!r} exists with another type or payload; "
                    "use a new id for a different job"
                )
            handles.append(JobHandle(app, job))
            if submitted.created:
                key = (job.type, job.queue)
                created[key] = created.get(key, 0) + 1
    finally:
        # Counted once per type and queue, not once per job.
        for (job_type, queue), n in created.items():
            metrics.of(job_type, queue).submitted.inc(n)
    return handles


def inserted_handles(app: JobSource, metrics: Metrics, inserted: Inserted) -> list[JobHandle]:
    """Handles on the jobs a store has just inserted (all of them new), each job's record
    made when first read, and the jobs counted as submitted in ``metrics``."""
    # Counted once per type and queue, not once per job.
    counts: Counter[tuple[str, str]] = Counter()
    handles: list[JobHandle] = []
    run_at, creation = iter(inserted.run_at), inserted.creation
    for chunk in inserted.chunks:
        if isinstance(chunk, SameJobs):
            counts[chunk.template.type, chunk.template.queue] += len(chunk)
        else:
            counts.update(map(_type_and_queue, chunk))
        offset = len(handles)
        handles += [
            InsertedHandle(app, chunk, i, next(run_at), creation, offset + i)
            for i in range(len(chunk))
        ]
    for (job_type, queue), n in counts.items():
        metrics.of(job_type, queue).submitted.inc(n)
    return handles


def inserted_handle(app: JobSource, metrics: Metrics, inserted: Inserted) -> JobHandle:
    """:func:`inserted_handles` of one job inserted alone (the common submit), without a
    batch's loops."""
    jobs = inserted.chunks[0]
    job = jobs[0]
    metrics.of(job.type, job.queue).submitted.inc(1)
    return InsertedHandle(app, jobs, 0, inserted.run_at[0], inserted.creation, 0)


_type_and_queue = attrgetter("type", "queue")
