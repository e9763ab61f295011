"""The worker's hot path: claim order and leases, settles fenced by their token, heartbeats
and checkpoints, on every backend."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Progress, Settlement
from conveyor.store import Lease, Store
from tests.helpers import FakeClock, new
from tests.store.common import claim
from tests.store.recording import create_store


async def test_claim_order_is_priority_then_run_at_then_id(store: Store, clock: FakeClock) -> None:
    await store.submit([new("c", priority=5)])
    await store.submit([new("b", priority=0)])
    await store.submit([new("a", priority=0)])
    await store.submit([new("z", priority=-1)])
    claimed = await claim(store, limit=3)
    assert sorted(j.id for j in claimed) == ["a", "b", "z"]
    assert [j.id for j in await claim(store)] == ["c"]


async def test_claim_respects_run_at_queues_and_pauses(store: Store, clock: FakeClock) -> None:
    await store.submit([new("later", delay=60), new("other", queue="media"), new("now")])
    assert [j.id for j in await claim(store)] == ["now"]
    await store.set_paused("media", True)
    assert await claim(store, queues=("media",)) == []
    await store.set_paused("media", False)
    assert [j.id for j in await claim(store, queues=("media",))] == ["other"]
    clock.advance(61)
    assert [j.id for j in await claim(store)] == ["later"]


async def test_a_claim_over_several_queues_takes_claim_order_across_them(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("m1", queue="media", priority=1), new("d1", priority=2)])
    await store.submit([new("m0", queue="media", priority=0), new("e0", queue="email")])
    await store.submit([new("d0", priority=0), new("later", queue="media", delay=60)])
    await store.set_paused("email", True)
    both = ("default", "media", "email")
    assert sorted(j.id for j in await claim(store, limit=3, queues=both)) == ["d0", "m0", "m1"]
    assert [j.id for j in await claim(store, queues=both)] == ["d1"]
    await store.set_paused("email", False)
    clock.advance(61)
    assert sorted(j.id for j in await claim(store, queues=both)) == ["e0", "later"]


async def test_claims_over_a_long_or_repeating_list_of_queues_take_claim_order_too(
    store: Store,
) -> None:
    await store.submit([new("q3-b", queue="q3", priority=1), new("q3-a", queue="q3")])
    await store.submit([new("q17", queue="q17", priority=0), new("d", priority=2)])
    many = (*(f"q{n}" for n in range(20)), "default")  # past the per-queue union
    assert sorted(j.id for j in await claim(store, limit=2, queues=many)) == ["q17", "q3-a"]
    twice = ("q3", "default", "q3", "default")
    assert [j.id for j in await claim(store, limit=1, queues=twice)] == ["q3-b"]
    assert [j.id for j in await claim(store, queues=twice)] == ["d"]


async def test_a_batch_mixing_plain_successes_with_other_ends_settles_each_as_alone(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new(x) for x in ("plain", "result", "ref", "retry", "fail", "back")])
    jobs = {j.id: j for j in await claim(store)}
    ok, failed = Outcome.SUCCEEDED, Outcome.FAILED

    def end(job_id: str, status: Status, outcome: Outcome | None, **kw: object) -> Settlement:
        return Settlement(job_id, jobs[job_id].lease_token, status, outcome, **kw)  # type: ignore[arg-type]

    refused = await store.settle(
        [
            end("plain", Status.SUCCEEDED, ok),
            end("result", Status.SUCCEEDED, ok, result={"n": [1, "two"]}),
            end("ref", Status.SUCCEEDED, ok, result_ref="s3://x", progress=Progress(2, 2)),
            end("retry", Status.QUEUED, failed, error="boom", retry_delay=5),
            end("fail", Status.FAILED, failed, error="bad", traceback="tb"),
            end("back", Status.QUEUED, None),
        ]
    )
    assert refused == []
    got = {j.id: j for j in await store.get_many(list(jobs))}
    assert got["plain"].status is Status.SUCCEEDED and got["plain"].result is None
    assert got["result"].result == {"n": [1, "two"]} and got["result"].finished_at is not None
    assert got["ref"].result_ref == "s3://x" and got["ref"].progress == Progress(2, 2)
    assert got["retry"].status is Status.QUEUED and got["retry"].error == "boom"
    assert got["fail"].status is Status.FAILED and got["fail"].error == "bad"
    assert got["back"].status is Status.QUEUED and got["back"].attempt == 0
    assert [a.outcome for a in await store.attempts("plain")] == [ok]
    assert [a.outcome for a in await store.attempts("result")] == [ok]
    assert await store.attempts("back") == []
    stale = Settlement("plain", jobs["plain"].lease_token, Status.SUCCEEDED, ok)
    assert await store.settle([stale]) == ["plain"]  # settled once only


async def test_claim_sets_lease_token_and_attempt(store: Store, clock: FakeClock) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    assert job.status is Status.RUNNING
    assert job.attempt == 1
    assert job.lease_owner == "w1"
    assert job.lease_token >= 1
    assert job.lease_expires_at is not None
    assert job.lease_expires_at.timestamp() == pytest.approx(clock.now + 30, abs=0.01)


async def test_settle_is_fenced_by_the_token(store: Store) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    stale = Settlement("a", job.lease_token - 1, Status.SUCCEEDED, Outcome.SUCCEEDED, result=1)
    assert await store.settle([stale]) == ["a"]
    good = Settlement("a", job.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED, result={"ok": 1})
    assert await store.settle([good]) == []
    assert await store.settle([good]) == ["a"]  # a second completion is refused too
    done = await store.get("a")
    assert done is not None and done.status is Status.SUCCEEDED and done.result == {"ok": 1}
    (attempt,) = await store.attempts("a")
    assert attempt.outcome is Outcome.SUCCEEDED and attempt.worker_id == "w1"


async def test_retry_settlement_requeues_with_delay(store: Store, clock: FakeClock) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    retry = Settlement(
        "a", job.lease_token, Status.QUEUED, Outcome.FAILED, error="boom", retry_delay=10
    )
    assert await store.settle([retry]) == []
    assert await claim(store) == []
    clock.advance(11)
    (again,) = await claim(store)
    assert again.attempt == 2 and again.lease_token > job.lease_token
    assert again.error == "boom"


async def test_hand_back_does_not_spend_an_attempt(store: Store) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    await store.settle([Settlement("a", job.lease_token, Status.QUEUED, None)])
    back = await store.get("a")
    assert back is not None and back.status is Status.QUEUED and back.attempt == 0
    assert await store.attempts("a") == []


async def test_heartbeat_renews_reports_lost_and_writes_progress(
    store: Store, clock: FakeClock
) -> None:
    await store.submit([new("a"), new("b")])
    a, b = sorted(await claim(store), key=lambda j: j.id)
    clock.advance(20)
    beat = await store.heartbeat(
        worker_id="w1",
        leases=[Lease("a", a.lease_token), Lease("b", b.lease_token + 7)],
        lease=30,
        progress={Lease("a", a.lease_token): Progress(3, 10, "three")},
    )
    assert beat.lost == {"b"}
    renewed = await store.get("a")
    assert renewed is not None and renewed.lease_expires_at is not None
    assert renewed.lease_expires_at.timestamp() == pytest.approx(clock.now + 30, abs=0.01)
    assert renewed.progress == Progress(3, 10, "three")


async def test_checkpoint_is_fenced(store: Store) -> None:
    await store.submit([new("a")])
    (job,) = await claim(store)
    assert await store.checkpoint(Lease("a", job.lease_token), {"frame": 10})
    assert not await store.checkpoint(Lease("a", job.lease_token + 1), {"frame": 99})
    saved = await store.get("a")
    assert saved is not None and saved.state == {"frame": 10}


async def test_concurrent_claims_never_share_a_job(
    db_url: str, store: Store, clock: FakeClock
) -> None:
    await store.submit([new(f"j{i:04d}") for i in range(1000)])
    stores = [create_store(db_url, clock=clock) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in stores))
    claimed: list[str] = []

    async def drain(s: Store, name: str) -> None:
        while batch := await s.claim(worker_id=name, queues=["default"], limit=7, lease=30):
            claimed.extend(j.id for j in batch)

    try:
        await asyncio.gather(*(drain(s, f"w{i}") for i, s in enumerate(stores)))
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert sorted(claimed) == [f"j{i:04d}" for i in range(1000)]


async def test_a_settle_retried_after_its_answer_was_lost_is_told_from_lost_leases(
    store: Store,
) -> None:
    # A database restart can lose a settle's answer after its commit: the worker's retry
    # is refused for those jobs, whose results are recorded, not lost (worker/_completer.py).
    from conveyor.worker._completer import recorded_before
    from conveyor.worker._leases import Run

    await store.submit([new("recorded"), new("taken")])
    jobs = {job.id: job for job in await claim(store)}
    first = Settlement(
        "recorded", jobs["recorded"].lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED
    )
    assert await store.settle([first]) == []  # the try whose answer was lost
    stale = jobs["taken"].lease_token - 1  # a lease that really is gone
    retry = [first, Settlement("taken", stale, Status.SUCCEEDED, Outcome.SUCCEEDED)]
    refused = set(await store.settle(retry))
    assert refused == {"recorded", "taken"}
    batch = [(Run(jobs[s.job_id], 30.0, 0.0), s) for s in retry]
    assert await recorded_before(store, batch, refused) == {"recorded"}
