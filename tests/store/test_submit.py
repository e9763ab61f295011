"""Submitting jobs: ids, unique keys, batches and every field as written, on every backend."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.core.jsontext import strict_compact
from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement
from conveyor.store import JobPageQuery, Store
from tests.helpers import FakeClock, new
from tests.store.common import claim


async def test_submit_then_same_id_returns_the_existing_job(store: Store) -> None:
    first = await store.submit([new("a")])
    again = await store.submit([new("a", payload={"n": 2})])
    assert first[0].created and not again[0].created
    assert again[0].job.payload == {"n": 1}
    assert (await store.get("a")).status is Status.QUEUED  # type: ignore[union-attr]


async def test_bulk_submit_is_one_transaction(store: Store) -> None:
    results = await store.submit([new(f"j{i}") for i in range(100)])
    assert all(r.created for r in results)
    assert len(await store.page_jobs(JobPageQuery(limit=500))) == 100


async def test_unique_key_returns_the_active_job(store: Store) -> None:
    a = await store.submit([new("a", unique_key="k")])
    b = await store.submit([new("b", unique_key="k")])
    assert b[0].job.id == "a" and not b[0].created
    assert a[0].created


async def test_a_batch_returns_each_job_as_stored_and_existing_ids_as_found(
    store: Store,
) -> None:
    await store.submit([new("old", payload={"n": 0})])
    batch = [
        new("a", payload={"n": 1}, priority=3, delay=5.0),
        new("old", payload={"n": 2}),
        new("b", unique_key="k"),
        new("a", payload={"n": 3}),
        new("c", unique_key="k"),
    ]
    results = await store.submit(batch)
    assert [(r.job.id, r.created) for r in results] == [
        ("a", True),
        ("old", False),
        ("b", True),
        ("a", False),
        ("b", False),
    ]
    # What a submit returns is what a read returns, field for field.
    for r in results:
        assert r.job == await store.get(r.job.id)
    assert results[1].job.payload == {"n": 0} and results[3].job.payload == {"n": 1}


async def test_a_large_batch_is_stored_as_submitted_and_taken_ids_are_found(
    store: Store, clock: FakeClock
) -> None:
    """Large batches may take a faster path (PostgreSQL: COPY); what they store and return,
    and how a taken id is answered, are the same as for a small batch."""
    at = datetime(2031, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    batch = [
        new(
            f"j{i:03}",
            payload={"n": i, "text": "é\u2603"},
            priority=i % 3,
            delay=float(i % 5),
            run_at=at if i % 7 == 0 else None,
            tenant="acme" if i % 2 else None,
            concurrency_key="k" if i % 4 == 0 else None,
            timeout=2.5 if i % 6 == 0 else None,
            lease=9.0 if i % 8 == 0 else None,
            state={"resume": i} if i % 9 == 0 else None,
            trace_context="00-" + "1" * 32 + "-" + "2" * 16 + "-01" if i % 10 == 0 else None,
        )
        for i in range(200)
    ]
    first = await store.submit(batch)
    assert all(r.created for r in first)
    for r in first:
        assert r.job == await store.get(r.job.id)
    again = await store.submit([new("fresh"), *batch[:60], new("j000", payload={"n": -1})])
    assert again[0].created and not any(r.created for r in again[1:])
    assert [r.job for r in again[1:61]] == [r.job for r in first[:60]]
    assert again[61].job.payload == first[0].job.payload
    twice = await store.submit([new(f"d{i}") for i in range(100)] + [new("d0")])
    assert all(r.created for r in twice[:100]) and not twice[100].created


async def test_a_batch_of_any_size_is_all_created_or_answered_as_found(store: Store) -> None:
    """A batch goes in as several statements (SQLite: 512, 256, ... rows): a taken id in
    its last one still finds the job holding it, and the jobs before it are created once."""
    batch = [new(f"p{i:04}", payload={"n": i}) for i in range(777)]
    first = await store.submit(batch)
    assert all(r.created for r in first) and len(first) == 777
    assert [r.job.id for r in first] == [j.id for j in batch]
    for r in first[::97]:
        assert r.job == await store.get(r.job.id)
    more = [new(f"q{i:04}", payload={"n": i}) for i in range(700)] + [new("p0776")]
    again = await store.submit(more)
    assert all(r.created for r in again[:700]) and not again[700].created
    assert again[700].job == first[776].job
    assert again[3].job == await store.get("q0003")


_AWKWARD = "tab\there, line\nbreak, cr\r, back\\slash \\N \\. é\u2603"


def _awkward_job(i: int, at: datetime) -> object:
    """A job with every optional field set, and text that COPY's format must escape."""
    return new(
        f"w{i:03}",
        type=f"type {_AWKWARD}",
        queue=f"queue {_AWKWARD}",
        payload={"text": _AWKWARD, "quote": '"\\"', "n": i, "f": 0.1 * i, "l": [None, True]},
        priority=-i,
        delay=1.5 if i % 2 else 0.0,
        run_at=at if i % 3 == 0 else None,
        max_attempts=7,
        timeout=2.5,
        lease=9.0,
        backoff_base=0.5,
        backoff_cap=60.0,
        concurrency_key=f"key {_AWKWARD}",
        state={"resume": _AWKWARD},
        trace_context="00-" + "1" * 32 + "-" + "2" * 16 + "-01",
        submitted_by=f"token:{_AWKWARD}",
    )


@pytest.mark.parametrize("size", [1, 120])
async def test_every_field_is_stored_as_submitted_one_job_or_a_large_batch(
    store: Store, clock: FakeClock, size: int
) -> None:
    """One job and a large batch take their own fast paths (one prepared INSERT; on
    PostgreSQL, COPY text): each stores every field as given, awkward text included, and
    returns the job as a read returns it."""
    at = datetime(2031, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    jobs = [_awkward_job(i, at) for i in range(size)]
    results = await store.submit(jobs)  # type: ignore[arg-type]
    assert all(r.created for r in results)
    for job, r in zip(jobs, results, strict=True):
        read = await store.get(r.job.id)
        assert r.job == read
        assert read is not None and read.status is Status.QUEUED
        for field in ("type", "queue", "payload", "priority", "max_attempts", "timeout"):
            assert getattr(read, field) == getattr(job, field), field
        assert (read.lease, read.backoff_base, read.backoff_cap) == (9.0, 0.5, 60.0)
        assert (read.concurrency_key, read.state) == (job.concurrency_key, job.state)  # type: ignore[attr-defined]
        assert read.trace_context == job.trace_context  # type: ignore[attr-defined]
        assert read.submitted_by == job.submitted_by  # type: ignore[attr-defined]
        # A delay counts from the submit, the batch's first job's creation (on SQLite,
        # each job of a batch is created a microsecond after the one before it).
        submitted_at = results[0].job.created_at
        expected_run_at = job.run_at or submitted_at + timedelta(seconds=job.delay)  # type: ignore[attr-defined]
        assert read.run_at == expected_run_at


@pytest.mark.parametrize("size", [1, 120])
async def test_payloads_that_carry_their_text_are_stored_as_that_text_says(
    store: Store, size: int
) -> None:
    """The client's check hands each payload's JSON text along (NewJob.payload_text): a
    store that writes it (SQLite's inserts, PostgreSQL's COPY) stores the payload it is
    the text of, awkward text included, one job or a large batch."""
    at = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)
    jobs = [_awkward_job(i, at) for i in range(size)]
    for job in jobs:
        job.payload_text = strict_compact(job.payload)  # type: ignore[attr-defined]
    results = await store.submit(jobs)  # type: ignore[arg-type]
    for job, r in zip(jobs, results, strict=True):
        assert r.job == await store.get(r.job.id)
        assert r.job.payload == job.payload  # type: ignore[attr-defined]


async def test_get_many_returns_the_jobs_that_exist(store: Store) -> None:
    await store.submit([new("a"), new("b"), new("c")])
    found = await store.get_many(["c", "missing", "a"])
    assert sorted(j.id for j in found) == ["a", "c"]
    assert await store.get_many([]) == []


async def test_payloads_and_results_come_back_exactly_as_written(store: Store) -> None:
    payload = {"z": 1, "a": [1.0, 1e300, "\u0000", "\u00e9\U0001f600"], "m": {"y": None, "b": True}}
    result = {"out": [0.1, -0.0, 2**53], "s": "x" * 10_000}
    (submitted,) = await store.submit([new("a", payload=payload)])
    job = await store.get("a")
    assert job is not None
    assert json.dumps(job.payload) == json.dumps(payload)
    assert json.dumps(submitted.job.payload) == json.dumps(payload)
    (running,) = await claim(store)
    done = Settlement("a", running.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED, result=result)
    await store.settle([done])
    finished = await store.get("a")
    assert finished is not None and json.dumps(finished.result) == json.dumps(result)
