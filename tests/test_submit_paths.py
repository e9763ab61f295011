"""The submit path's shortcuts give the answers of the long way round: payloads checked
a type at a time in a large batch, the C JSON encoder, the quick plain-payload test."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from conveyor import Conveyor, JobContext, Submission
from conveyor.app.registry import json_text_problem
from conveyor.core.jsontext import compact, loads, plain_text, strict_compact, strict_compact_each
from conveyor.core.lifecycle import Status
from conveyor.core.model import Job, NewJob
from conveyor.errors import ConfigurationError, InvalidPayload

VALUES = [
    {"t": 1.0},
    {"a": [1, "x\u00e9", None, True, {"b": 2.5}], "c": "\u2603"},
    {"q": 'quote " and back\\slash', "n": -3, "big": 2**70},
    [],
    "text",
    None,
    {"": 0, "nested": {"deep": [[1], [2.0]]}},
]


@pytest.mark.parametrize("value", VALUES)
def test_compact_writes_what_json_dumps_writes(value: object) -> None:
    assert compact(value) == json.dumps(value, separators=(",", ":"))
    assert strict_compact(value) == compact(value)


def test_strict_compact_refuses_what_json_dumps_refuses() -> None:
    for bad in ({"x": math.nan}, [math.inf]):
        with pytest.raises(ValueError):
            strict_compact(bad)
        assert compact(bad) == json.dumps(bad, separators=(",", ":"))
    with pytest.raises(TypeError):
        compact({"x": object()})
    circular: list[object] = []
    circular.append(circular)
    with pytest.raises(ValueError):
        compact(circular)


@pytest.mark.parametrize(
    "payload",
    [
        {"a": "plain", "b": 1, "c": 2.5, "d": True, "e": None},
        {"a": "nul\x00"},
        {"a": "\ud800"},
        {"a": math.nan},
        {"a": -math.inf},
        {"nul\x00key": 1},
        {"a": "é"},
        {"a": [1]},
        {1: "int key"},
    ],
)
def test_plain_text_never_passes_what_the_full_check_refuses(payload: dict[object, object]) -> None:
    if plain_text(payload):
        assert json_text_problem(payload) is None


@pytest.fixture
def app(tmp_path: Path) -> Conveyor:
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")

    @app.job(name="typed")
    async def typed(
        ctx: JobContext, n: int, x: float = 0.0, s: str = "", tags: list[str] | None = None
    ) -> None: ...

    @app.job(name="bare")
    async def bare(ctx: JobContext) -> None: ...

    return app


def test_a_large_batch_validates_its_payloads_as_one_at_a_time_does(app: Conveyor) -> None:
    payloads: list[dict[str, object]] = [
        {"n": i, "x": i, "s": f"é{i}", "tags": ["a", str(i)]} if i % 2 else {"n": str(i)}
        for i in range(40)
    ]
    batch = [Submission("typed", p) for p in payloads] + [Submission("bare", {})] * 20
    prepared = app.prepare(batch)
    one_by_one = [app.prepare([s])[0] for s in batch]
    assert [j.payload for j in prepared] == [j.payload for j in one_by_one]
    assert prepared[0].payload == {"n": 0} and prepared[1].payload["x"] == 1.0


def test_each_payload_s_text_rides_along_to_the_store(app: Conveyor) -> None:
    """The check's JSON text of each payload rides along (NewJob.payload_text) so that a
    store writes it rather than encoding the payload again: a large batch's, checked a
    type at a time, a payload checked one by one, a job submitted alone. It is the
    payload's own text, and a copy with another payload does not keep it."""
    payloads = [{"n": i, "s": f"a\t{i}\n", "x": i / 3} for i in range(40)]
    prepared = app.prepare([Submission("typed", p) for p in payloads])
    assert all(j.payload_text == compact(j.payload) for j in prepared)
    # Not flat plain data: checked one by one, each writing its own text.
    odd = app.prepare([Submission("typed", {"n": i, "s": "é"}) for i in range(20)])
    assert all(j.payload_text == compact(j.payload) == f'{{"n":{i},"s":"\\u00e9"}}'
               for i, j in enumerate(odd))  # fmt: skip
    changed = dataclasses.replace(prepared[0], payload={"n": -1})
    assert changed.payload_text is None and changed == dataclasses.replace(
        prepared[0], payload={"n": -1}
    )
    alone = app.prepare([Submission("typed", {"n": 1})])[0]
    assert alone.payload_text == compact(alone.payload) == '{"n":1}'
    assert strict_compact_each([p for p in payloads]) == [compact(p) for p in payloads]
    with pytest.raises(ValueError):
        strict_compact_each([{"n": 1}, {"x": math.nan}])


def test_a_new_job_stored_is_its_every_field_and_the_store_s_status_and_times() -> None:
    at = datetime(2031, 1, 2, tzinfo=UTC)
    given = {f.name: f"v{i}" for i, f in enumerate(dataclasses.fields(NewJob)) if f.init}
    job = NewJob(**given)  # type: ignore[arg-type]
    stored = job.stored(Status.QUEUED, at, at)
    for name, value in given.items():
        if name not in ("run_at", "delay"):
            assert getattr(stored, name) == value, name
    assert (stored.status, stored.run_at, stored.created_at) == (Status.QUEUED, at, at)
    assert (stored.attempt, stored.progress, stored.result, stored.lease_token) == (
        0,
        None,
        None,
        0,
    )
    assert (stored.cancel_requested, stored.retried_by, stored.below) == (False, None, None)


def test_a_large_batch_takes_options_as_one_at_a_time_does(app: Conveyor) -> None:
    def submission(i: int) -> Submission:
        n = {"n": i}
        return [
            Submission("typed", n),
            Submission("typed", n, queue="other", priority=3),
            Submission("typed", n, max_attempts=7, timeout="2m", delay=5),
            Submission("typed", n, id=f"mine-{i}", unique_key=f"k{i}", concurrency_key="c"),
        ][i % 4]

    batch = [submission(i) for i in range(40)]
    prepared = app.prepare(batch)
    one_by_one = [app.prepare([s])[0] for s in batch]
    fresh = [j.id for j, s in zip(prepared, batch, strict=True) if s.id is None]
    assert len(set(fresh)) == len(fresh) == 30
    same = [dataclasses.replace(j, id="") for j in prepared]
    assert same == [dataclasses.replace(j, id="") for j in one_by_one]
    assert [j.id for j in prepared][3::4] == [f"mine-{i}" for i in range(3, 40, 4)]


def test_a_large_batch_refuses_bad_options_as_one_at_a_time_does(app: Conveyor) -> None:
    batch = [Submission("typed", {"n": i}) for i in range(30)]
    batch[9] = Submission("typed", {"n": 9}, max_attempts=0)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        app.prepare(batch)
    batch[9] = Submission("typed", {"n": 9}, priority=1.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="priority"):
        app.prepare(batch)


@pytest.mark.parametrize(
    "bad",
    [{"n": "not a number"}, {"n": 1, "s": "nul\x00"}, {"n": 1, "x": math.nan}, {"x": 1.0}, []],
)
def test_a_large_batch_refuses_its_first_bad_payload_as_one_at_a_time_does(
    app: Conveyor, bad: object
) -> None:
    batch = [Submission("typed", {"n": i}) for i in range(30)]
    batch[7] = Submission("typed", bad)  # type: ignore[arg-type]
    batch[20] = Submission("typed", {"n": "also bad"})
    with pytest.raises(InvalidPayload) as together:
        app.prepare(batch)
    with pytest.raises(InvalidPayload) as alone:
        app.prepare([batch[7]])
    assert str(together.value) == str(alone.value)


def test_loads_reads_what_json_loads_reads_and_refuses_what_it_refuses() -> None:
    for text in ('{"a":[1,2.5,"x",null,true]}', "[]", '"s"', "3", ' {"padded": 1} \n'):
        assert loads(text) == json.loads(text)
    for bad in ("{} x", "", "{", "[1,]"):
        with pytest.raises(json.JSONDecodeError):
            loads(bad)


def test_a_large_submit_holds_the_collector_off_and_puts_it_back_as_it_was() -> None:
    """Concurrent large submits pause the cyclic collector together, the last one out
    turns it back on, and a collector the application had turned off stays off."""
    from conveyor.app._gcpause import PAUSE_FROM, collector_paused

    assert gc.isenabled()
    with collector_paused(PAUSE_FROM - 1):
        assert gc.isenabled()  # a small batch leaves it alone
    first, second = collector_paused(PAUSE_FROM), collector_paused(PAUSE_FROM)
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the other is still inside
    second.__exit__(None, None, None)
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused(PAUSE_FROM):
        raise RuntimeError("a failed submit")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused(PAUSE_FROM):
            pass
        assert not gc.isenabled()  # the application's choice stands
    finally:
        gc.enable()


def test_a_pause_is_not_joined_once_old_so_overlapping_submits_cannot_hold_it_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server taking one bulk submit after another, each overlapping the last, would
    keep a pause that any of them may join going as long as the overlap lasts."""
    from conveyor.app import _gcpause

    monkeypatch.setattr(_gcpause, "JOIN_WITHIN", 0.0)  # every pause already too old to join
    first = _gcpause.collector_paused(_gcpause.PAUSE_FROM)
    first.__enter__()
    assert not gc.isenabled()
    started = time.monotonic()
    while time.monotonic() == started:  # the pause ages (the clock moves on)
        pass
    late = _gcpause.collector_paused(_gcpause.PAUSE_FROM)
    late.__enter__()  # runs without joining it
    first.__exit__(None, None, None)
    assert gc.isenabled(), "the pause ended with the call that began it"
    late.__exit__(None, None, None)
    assert gc.isenabled()


async def test_submit_many_pauses_the_collector_only_while_it_runs(app: Conveyor) -> None:
    seen: list[bool] = []
    original = app.registry.get

    def get(name: str) -> Any:  # each submit looks its type up
        seen.append(gc.isenabled())
        return original(name)

    app.registry.get = get  # type: ignore[method-assign]
    try:
        await app.submit_many([Submission("typed", {"n": i}) for i in range(200)])
        batch, seen[:] = list(seen), []
        await app.submit_many([Submission("typed", {"n": 1})])
    finally:
        await app.close()
    assert batch and not any(batch), "the batch ran with the collector paused"
    assert seen and all(seen) and gc.isenabled(), "a single job's submit does not pause it"


async def test_a_plain_submit_stores_what_the_long_way_stores(tmp_path: Path) -> None:
    """A submission with nothing but a type and payload takes a shortcut (the type's
    options read once): the job it stores is the one the general way stores (taken here
    by naming the type's own queue), field for field, whether submitted alone or as a
    batch's, with a blocking call too; each type's jobs get that type's options."""
    app = Conveyor(f"sqlite:///{tmp_path / 'p.db'}")

    @app.job(name="opts", queue="q1", priority=3, max_attempts=5, timeout=7, lease=11)
    async def opts(ctx: JobContext, n: int, s: str = "") -> None: ...

    @app.job(name="typed")
    async def typed(ctx: JobContext, n: int) -> None: ...

    try:
        payload = {"n": 1, "s": "é\x01"}
        long = await app.submit("opts", payload, queue="q1")  # an option: the general way
        shorts = [
            await app.submit("opts", payload),
            (await app.submit_many([Submission("opts", payload)] * 20))[19],  # checked together
            await asyncio.to_thread(app.sync.submit, "opts", payload),
        ]
        ignored = {"id", "run_at", "created_at"}

        def fields(job: Job) -> dict[str, object]:
            return {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}

        for short in shorts:
            assert short.record == (await app.get(short.id)).record
            short_fields, long_fields = fields(short.record), fields(long.record)
            for name in ignored:
                del short_fields[name], long_fields[name]
            assert short_fields == long_fields
        first = shorts[0].record
        assert (first.queue, first.priority, first.max_attempts) == ("q1", 3, 5)
        with pytest.raises(InvalidPayload):
            await app.submit("opts", {"n": 1, "s": "nul\x00"})

        default = (await app.submit("typed", {"n": 2})).record
        assert (default.queue, default.priority, default.max_attempts) == ("default", 0, 3)
    finally:
        await app.close()


async def test_every_option_of_submit_takes_it_off_the_plain_path(
    app: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``app.submit`` sends a job that sets nothing but its type and payload the short way
    (``_submit_plain``), which takes no options: an option left out of that test would be
    dropped silently. Each keyword of ``submit`` must send its job the long way, which
    stores the option. A keyword added to ``submit`` fails here until it has a sample."""
    import inspect

    first = await app.submit("typed", {"n": 0})
    samples: dict[str, object] = {
        "id": "chosen-1",
        "queue": "other",
        "priority": 5,
        "run_at": datetime(2030, 1, 1, tzinfo=UTC),
        "delay": 60,
        "max_attempts": 7,
        "timeout": 9,
        "unique_key": "only-one",
        "tenant": "acme",
        "depends_on": [first.id],
        "concurrency_key": "k",
    }
    options = {
        name
        for name, p in inspect.signature(Conveyor.submit).parameters.items()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert options - {"connection"} == set(samples), "give the new keyword a sample here"

    async def refuse(name: str, payload: object) -> None:
        raise AssertionError("a submit with an option took the plain path")

    monkeypatch.setattr(app, "_submit_plain", refuse)
    try:
        for option, value in samples.items():
            handle = await app.submit("typed", {"n": 1}, **{option: value})  # type: ignore[arg-type]
            assert handle.status in (Status.QUEUED, Status.PENDING), option
        with pytest.raises(ConfigurationError, match="PostgreSQL only"):
            await app.submit("typed", {"n": 1}, connection=object())
    finally:
        await app.close()
