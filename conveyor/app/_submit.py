"""Submit validation, for the :class:`~conveyor.Conveyor` facade: a submission checked
against its job type and turned into the :class:`~conveyor.core.model.NewJob` the store
takes, payloads of large batches validated a type at a time, and dependency cycles among
jobs submitted together refused before anything is stored."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from itertools import islice
from typing import cast

from conveyor.app.handles import Submission
from conveyor.app.registry import JobOptions, JobType, Registry, check_queue, optional_seconds
from conveyor.core.ids import check_job_id, local, new_id, new_ids, qualify
from conveyor.core.model import JSON, NewJob, SameJobs, check_run_at
from conveyor.errors import ConfigurationError, InvalidDependency, InvalidPayload


def _run_at(value: datetime | None) -> datetime | None:
    try:
        return check_run_at(value) if value is not None else None
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


# A batch with at least this many jobs of a type validates their payloads in one call.
_VALIDATE_TOGETHER = 16


def payloads_by_type(
    registry: Registry, submissions: Sequence[Submission]
) -> tuple[list[dict[str, JSON] | None], list[str | None]]:
    """The payloads of a large batch, validated a type at a time (None: not yet), and
    their compact JSON texts where the check wrote them (see ``NewJob.payload_text``).

    Only a shortcut: should anything be wrong (an unknown type, a bad payload), nothing is
    validated here and :func:`new_job` checks each job in order, raising for the first
    bad one as it always did.
    """
    payloads: list[dict[str, JSON] | None] = [None] * len(submissions)
    texts: list[str | None] = [None] * len(submissions)
    if len(submissions) < _VALIDATE_TOGETHER:
        return payloads, texts
    by_type: dict[str, list[int]] = {}
    for i, s in enumerate(submissions):
        by_type.setdefault(s.type, []).append(i)
    try:
        for name, where in by_type.items():
            if len(where) >= _VALIDATE_TOGETHER:
                checked, written = registry.get(name).validate_many_text(
                    [submissions[i].payload for i in where]
                )
                for i, payload in zip(where, checked, strict=True):
                    payloads[i] = payload
                for i, text in zip(where, written, strict=True):
                    texts[i] = text
    except Exception:  # whatever it is, the checks one by one raise it in order
        return [None] * len(submissions), [None] * len(submissions)
    return payloads, texts


# NewJob's fields from queue to backoff_cap, as it takes them by position: queue,
# priority, run_at, delay, max_attempts, timeout, lease, backoff_base, backoff_cap.
_Fields = tuple[str, int, datetime | None, float, int, float | None, float | None, float, float]


def new_jobs(
    registry: Registry,
    submissions: Sequence[Submission],
    now: float,
    traceparent: str | None,
    submitted_by: str,
    ids: Iterator[str] | None = None,
) -> list[NewJob]:
    """The jobs ``submissions`` describe, checked as :func:`new_job` checks each, with the
    work they share done once: payloads validated a type at a time, the new ids made
    together, and the options of a type's jobs that set none of their own read once.

    ``ids``: the new ids of a larger batch that ``submissions`` are part of, taken in
    order for the jobs without a client id (by default, made here)."""
    payloads, texts = payloads_by_type(registry, submissions)
    if ids is None:
        fresh = sum(1 for s in submissions if s.id is None)
        ids = iter(new_ids(now, fresh) if fresh > 1 else [new_id(now)] * fresh)
    defaults: dict[str, _Fields] = {}  # by type name, for this batch (see _defaults)
    jobs = []
    for s, payload, text in zip(submissions, payloads, texts, strict=True):
        fields = None
        if _no_options(s):
            fields = defaults.get(s.type)
            if fields is None:
                fields = defaults[s.type] = _defaults(registry.get(s.type))
        if fields is not None and payload is not None and _own_name(s):
            # Its payload checked already, its options its type's: what new_job would
            # make of it, without new_job's checks, which cannot fail for it.
            job = _built(next(ids), s.type, payload, fields, s.unique_key, s.concurrency_key,
                         traceparent, submitted_by)  # fmt: skip
        else:
            job_id = next(ids) if s.id is None else None
            job = new_job(registry, s, now, traceparent, submitted_by, payload, job_id, fields)
        if text is not None:  # the text of job.payload itself, as the batch's check wrote it
            job.payload_text = text
        jobs.append(job)
    return jobs


def streamed_jobs(
    registry: Registry,
    submissions: Sequence[Submission],
    now: float,
    traceparent: str | None,
    submitted_by: str,
    ids: Iterator[str] | None = None,
) -> Sequence[NewJob]:
    """:func:`new_jobs` for a chunk of a streamed batch (app/_stream.py): when they are
    one type's :func:`plain` jobs, their payloads checked together (as
    :func:`payloads_by_type` checks them), the jobs as one :class:`SameJobs` (a
    :class:`NewJob` made per job only if read), else new_jobs's. ``ids`` as there."""
    if not submissions or not _all_plain(submissions, submissions[0].type):
        return new_jobs(registry, submissions, now, traceparent, submitted_by, ids)
    first = submissions[0]
    try:
        job_type = registry.get(first.type)
        checked, texts = job_type.validate_many_text([s.payload for s in submissions])
    except Exception:  # whatever it is, new_jobs raises it for the first bad job, in order
        return new_jobs(registry, submissions, now, traceparent, submitted_by, ids)
    if None in texts:  # checked one by one, a text not written: new_jobs writes it
        return new_jobs(registry, submissions, now, traceparent, submitted_by, ids)
    written = cast(list[str], texts)  # none of them None (above)
    n = len(submissions)
    job_ids = new_ids(now, n) if ids is None else list(islice(ids, n))
    fields = _defaults(job_type)
    template = _built(job_ids[0], first.type, checked[0], fields, first.unique_key,
                      first.concurrency_key, traceparent, submitted_by)  # fmt: skip
    template.payload_text = written[0]
    return SameJobs(template, job_ids, checked, written)


def _all_plain(submissions: Sequence[Submission], name: str) -> bool:
    """Whether every submission is a :func:`plain` one of type ``name``."""
    return all(s.type == name and plain(s) for s in submissions)


def plain(s: Submission) -> bool:
    """Whether a submission sets nothing but its type and payload (the common submit)."""
    return _no_options(s) and _own_name(s) and s.unique_key is None and s.concurrency_key is None


def plain_job(
    registry: Registry,
    name: str,
    payload: Mapping[str, JSON],
    now: float,
    traceparent: str | None,
    submitted_by: str,
) -> NewJob:
    """The job of a :func:`plain` submission of type ``name``, as :func:`new_job` makes
    it, with the type's options read once for all its jobs (the common submit, made once
    per job: a batch's machinery would cost more than the job)."""
    job_type = registry.get(name)
    checked, text = job_type.validate_text(payload)
    fields = _defaults(job_type)
    job = _built(new_id(now), name, checked, fields, None, None, traceparent, submitted_by)
    job.payload_text = text
    return job


def _no_options(s: Submission) -> bool:
    """Whether a submission leaves every option to its type."""
    return (
        s.queue is None
        and s.max_attempts is None
        and s.priority is None
        and s.timeout is None
        and s.delay is None
        and s.run_at is None
    )


def _own_name(s: Submission) -> bool:
    """Whether a submission's job is stored under a new id with nothing to qualify: no
    client id, no tenant, no jobs it waits for."""
    return s.id is None and s.tenant is None and not s.depends_on


def _built(
    job_id: str,
    name: str,
    payload: dict[str, JSON],
    fields: _Fields,
    unique_key: str | None,
    concurrency_key: str | None,
    traceparent: str | None,
    submitted_by: str,
) -> NewJob:
    """The job of a submission of type ``name`` that :func:`_own_name` holds for, its
    payload checked and its options settled (by position: by keyword, the call costs
    more than the rest of the job's making)."""
    return NewJob(job_id, name, payload, *fields, None, unique_key, concurrency_key,
                  (), None, None, None, None, traceparent, 0, submitted_by)  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _defaults(job_type: JobType) -> _Fields:
    """The fields of a type's jobs that set no options of their own, read once per
    registered type (whose options never change; a type is its own key, by identity,
    kept while cached)."""
    return _settle(job_type.options, _NO_OPTIONS)


_NO_OPTIONS = Submission(type="", payload={})


def new_job(
    registry: Registry,
    s: Submission,
    now: float,
    traceparent: str | None,
    submitted_by: str,
    payload: dict[str, JSON] | None = None,
    job_id: str | None = None,
    fields: _Fields | None = None,
) -> NewJob:
    """The job ``s`` describes, checked against its type and with the type's defaults
    (``payload``: its payload, validated already; ``job_id``: the new id for a submission
    without one; ``fields``: its options, settled already)."""
    job_type = registry.get(s.type)
    text = None
    if payload is None:
        payload, text = job_type.validate_text(s.payload)
    if s.id is not None:
        try:
            check_job_id(local(s.tenant, s.id))
        except ValueError as exc:
            raise InvalidPayload(s.type, str(exc)) from None
    queue, priority, run_at, delay, max_attempts, timeout, lease, base, cap = fields or _settle(
        job_type.options, s
    )
    depends_on: tuple[str, ...] = ()
    if s.tenant is None and s.depends_on == ():
        # Nothing to qualify: a new id or a checked client id holds no '/'.
        job_id = s.id or job_id or new_id(now)
    else:
        job_id, depends_on = _stored_names(s, s.id or job_id or new_id(now))
    job = NewJob(
        id=job_id,
        type=s.type,
        payload=payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        timeout=timeout,
        lease=lease,
        backoff_base=base,
        backoff_cap=cap,
        tenant=s.tenant,
        unique_key=s.unique_key,
        concurrency_key=s.concurrency_key,
        depends_on=depends_on,
        trace_context=traceparent,
        submitted_by=submitted_by,
    )
    job.payload_text = text  # the text of job.payload itself (None: not written here)
    return job


def _settle(options: JobOptions, s: Submission) -> _Fields:
    """A submission's options, checked, with its type's where it sets none."""
    queue = s.queue if s.queue is not None else options.queue
    check_queue(queue)
    max_attempts = s.max_attempts if s.max_attempts is not None else options.max_attempts
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be at least 1, not {max_attempts!r}")
    priority = s.priority if s.priority is not None else options.priority
    if not isinstance(priority, int):
        raise ConfigurationError(f"priority must be an integer, not {priority!r}")
    timeout = optional_seconds(s.timeout, "timeout")
    delay = optional_seconds(s.delay, "delay") or 0.0
    backoff = options.backoff
    return (
        queue,
        priority,
        _run_at(s.run_at),
        delay,
        max_attempts,
        timeout if timeout is not None else options.timeout,
        options.lease,
        backoff.base,
        backoff.cap,
    )


def _stored_names(s: Submission, job_id: str) -> tuple[str, tuple[str, ...]]:
    """A job's stored id and those of the jobs it waits for, qualified with its tenant,
    so that names never reach into another tenant (core/ids.py)."""
    try:
        depends_on = tuple(qualify(s.tenant, d) for d in _dependency_ids(s.depends_on))
        return qualify(s.tenant, job_id), depends_on
    except ValueError as exc:
        raise InvalidPayload(s.type, str(exc)) from None


def _dependency_ids(value: Sequence[str]) -> tuple[str, ...]:
    if isinstance(value, str) or not all(isinstance(v, str) and v for v in value):
        raise InvalidDependency("depends_on takes a list of job ids, e.g. depends_on=[a.id, b.id]")
    return tuple(dict.fromkeys(value))


def check_acyclic(jobs: Sequence[NewJob]) -> None:
    """Refuse dependency cycles among jobs submitted together (or a job on itself).

    Jobs already stored cannot be part of a cycle: they cannot depend on a job that does
    not exist yet.
    """
    edges = {job.id: [d for d in job.depends_on] for job in jobs if job.depends_on}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        if state.get(node) == 2 or node not in edges:
            return
        if state.get(node) == 1:
            cycle = " -> ".join([*path[path.index(node) :], node])
            raise InvalidDependency(f"dependency cycle: {cycle}; a job cannot wait for itself")
        state[node] = 1
        for upstream in edges[node]:
            visit(upstream, [*path, node])
        state[node] = 2

    for node in edges:
        visit(node, [])
