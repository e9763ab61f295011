"""A large plain batch is prepared a chunk at a time (app/_stream.py), inside its one COPY on
PostgreSQL and before its one transaction on SQLite: it must give the answers of the usual
way, on every backend, and a bad payload anywhere in it stores nothing."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from conveyor import Conveyor, InvalidPayload, JobContext, JobHandle, Status, Submission
from conveyor.app import _stream
from conveyor.app._stream import PreparedChunks, streamable
from conveyor.app._submit import new_jobs, streamed_jobs
from conveyor.core.model import SameJobs


def _typed(app: Conveyor) -> None:
    @app.job(name="typed", max_attempts=4)
    async def typed(ctx: JobContext, n: int, t: float = 0.0) -> None: ...


async def _count(app: Conveyor) -> int:
    return len((await app.page_jobs(limit=1000, type="typed")).jobs)


async def test_a_large_batch_is_stored_whole_with_its_handles_in_order(app: Conveyor) -> None:
    _typed(app)
    await app.submit("typed", {"n": -1})  # the store is open: the streamed way applies
    store = await app.store()
    copy_prepared = getattr(store, "copy_prepared", None)
    streamed: list[int] = []
    if copy_prepared is not None:  # every store's, today

        async def spy(chunks: PreparedChunks) -> Any:
            streamed.append(1)
            return await copy_prepared(chunks)

        store.copy_prepared = spy  # type: ignore[attr-defined]
    batch = [Submission("typed", {"n": i, "t": i / 7}, priority=i % 3) for i in range(950)]
    handles = await app.submit_many(batch)
    assert streamed == ([1] if copy_prepared is not None else [])
    assert [h.record.payload for h in handles] == [{"n": i, "t": i / 7} for i in range(950)]
    # The batch's ids made together, in order: its rows enter the indexes on the id in order.
    ids = [h.id for h in handles]
    assert len(set(ids)) == 950 and ids == sorted(ids)
    for h in handles[::97]:
        stored = (await app.get(h.id)).record
        assert stored == h.record and stored.priority == stored.payload["n"] % 3
        assert stored.max_attempts == 4
    assert await _count(app) == 951


async def test_a_large_batch_s_handles_read_refresh_and_count_as_any(app: Conveyor) -> None:
    # On PostgreSQL the COPY's handles make their records when first read (InsertedHandle).
    _typed(app)
    await app.submit("typed", {"n": -1})
    handles = await app.submit_many([Submission("typed", {"n": i}) for i in range(500)])
    assert all(isinstance(h, JobHandle) for h in handles)
    assert [h.id for h in handles] == sorted(h.id for h in handles)
    assert handles[3].status is Status.QUEUED and handles[3].record.payload == {"n": 3}
    await app.cancel(handles[3].id)
    assert (await handles[3].refresh()).status is Status.CANCELLED
    for i in range(4, 500, 50):
        stored = (await app.get(handles[i].id)).record
        assert handles[i].record == stored and stored.payload == {"n": i}
    counted = app.metrics.registry.get_sample_value(
        "conveyor_jobs_submitted_total", {"type": "typed", "queue": "default"}
    )
    assert counted == 501


async def test_a_bad_payload_late_in_the_batch_stores_nothing(app: Conveyor) -> None:
    _typed(app)
    await app.submit("typed", {"n": -1})
    batch = [Submission("typed", {"n": i}) for i in range(900)]
    batch[777] = Submission("typed", {"n": "not a number"})
    with pytest.raises(InvalidPayload, match="n"):
        await app.submit_many(batch)
    assert await _count(app) == 1
    assert len(await app.submit_many(batch[:777])) == 777  # the store still works


async def test_a_streamed_batch_with_a_taken_id_stores_nothing_and_says_so(app: Conveyor) -> None:
    # The store's answer (None) sends the batch the usual way, which finds the job.
    from tests.helpers import new

    _typed(app)
    await app.submit("typed", {"n": -1}, id="taken")
    store = await app.store()
    chunks = [[new(f"fresh-{i}", type="typed", payload={"n": i}) for i in range(3)]]
    chunks.append([new("taken", type="typed", payload={"n": 9})])
    assert await store.copy_prepared(chunks) is None  # type: ignore[attr-defined]
    assert await _count(app) == 1
    inserted = await store.copy_prepared(chunks[:1])  # type: ignore[attr-defined]
    assert inserted is not None and len(inserted.run_at) == 3
    assert [s.job.id for s in inserted.submitted()] == ["fresh-0", "fresh-1", "fresh-2"]
    assert await _count(app) == 4


def test_a_retried_copy_gets_the_same_jobs_again() -> None:
    made: list[int] = []

    def prepare(part: Any) -> list[Any]:
        made.append(len(part))
        return [object() for _ in part]

    chunks = PreparedChunks([Submission("typed", {"n": i}) for i in range(450)], prepare)
    first = [job for chunk in chunks for job in chunk]
    again = [job for chunk in chunks for job in chunk]
    assert first == again and len(first) == 450 and made == [200, 200, 50]
    assert chunks.jobs() == first and made == [200, 200, 50]
    half = PreparedChunks([Submission("typed", {"n": i}) for i in range(450)], prepare)
    next(iter(half))
    assert len(half.jobs()) == 450


def test_a_chunk_of_one_type_s_plain_jobs_is_the_jobs_new_jobs_makes(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path / 'unused.db'}")
    _typed(app)

    @app.job(name="other")
    async def other(ctx: JobContext, n: int) -> None: ...

    part = [Submission("typed", {"n": i, "t": i / 3}) for i in range(200)]
    same = streamed_jobs(app.registry, part, 1_700_000_000.0, "00-trace", "local")
    usual = new_jobs(app.registry, part, 1_700_000_000.0, "00-trace", "local")
    assert isinstance(same, SameJobs) and len(same) == 200 and len(set(same.ids)) == 200
    for made, expected in zip(same, usual, strict=True):
        assert made == dataclasses.replace(expected, id=made.id)
        assert made.payload_text == expected.payload_text == same.texts[made.payload["n"]]
    assert same[1:3] == [same[1], same[2]] and same[-1].payload == {"n": 199, "t": 199 / 3}
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert same.stored(5, Status.QUEUED, at, at) == same[5].stored(Status.QUEUED, at, at)
    # Anything else is made the usual way: another type among them, an option of its
    # own, a bad payload.
    for odd in (
        [*part[:100], Submission("other", {"n": 1}), *part[100:]],
        [*part[:100], Submission("typed", {"n": 1}, priority=2), *part[100:]],
    ):
        assert not isinstance(streamed_jobs(app.registry, odd, 0.0, None, "local"), SameJobs)
    with pytest.raises(InvalidPayload, match="n"):
        streamed_jobs(app.registry, [*part, Submission("typed", {"n": "x"})], 0.0, None, "local")


def test_only_plain_large_batches_on_conveyor_s_connection_are_streamed() -> None:
    plain = [Submission("typed", {"n": i}) for i in range(_stream.STREAM_FROM)]
    assert streamable(plain, None)
    assert not streamable(plain[:-1], None)
    assert not streamable(plain, object())
    for odd in (
        Submission("typed", {"n": 0}, id="mine"),
        Submission("typed", {"n": 0}, unique_key="k"),
        Submission("typed", {"n": 0}, tenant="acme"),
        Submission("typed", {"n": 0}, depends_on=("x",)),
    ):
        assert not streamable([*plain, odd], None)
