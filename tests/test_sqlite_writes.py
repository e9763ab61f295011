"""The SQLite store's group commit: writes asked together share one transaction, and
one that fails leaves nothing behind without undoing the others (store/sqlite/_writer.py)."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator

import pytest

from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement
from conveyor.errors import ConveyorError
from conveyor.store.sqlite import SQLiteStore
from conveyor.store.sqlite._connection import WAL_SIZE_LIMIT
from tests.helpers import new


@pytest.fixture
async def store(tmp_path: pathlib.Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(str(tmp_path / "writes.db"))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def _counts(store: SQLiteStore) -> tuple[int, int]:
    writer = store._writer
    assert writer is not None
    return writer.groups, writer.writes


async def test_a_settle_and_the_next_claim_asked_together_commit_once(store: SQLiteStore) -> None:
    await store.submit([new(f"j{n}") for n in range(4)])
    first = await store.claim(worker_id="w", queues=["default"], limit=2, lease=30)
    groups, writes = _counts(store)
    ends = [Settlement(j.id, j.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED) for j in first]
    refused, second = await asyncio.gather(
        store.settle(ends),
        store.claim(worker_id="w", queues=["default"], limit=2, lease=30),
    )
    assert refused == [] and len(second) == 2
    assert _counts(store) == (groups + 1, writes + 2)
    assert {j.id for j in first} | {j.id for j in second} == {"j0", "j1", "j2", "j3"}
    for job in first:
        done = await store.get(job.id)
        assert done is not None and done.status is Status.SUCCEEDED
    # Awaited one after the other, writes are transactions of their own.
    await store.submit([new("x")])
    await store.submit([new("y")])
    assert _counts(store) == (groups + 3, writes + 4)


async def test_a_write_that_fails_in_a_group_leaves_nothing_and_the_others_commit(
    store: SQLiteStore,
) -> None:
    groups, _ = _counts(store)
    # The second job of the first submit depends on a job that does not exist: the submit
    # fails after its first job was inserted, and must leave neither.
    failing = store.submit([new("first", depends_on=()), new("second", depends_on=("nope",))])
    results = await asyncio.gather(failing, store.submit([new("other")]), return_exceptions=True)
    assert isinstance(results[0], ConveyorError)
    assert _counts(store)[0] == groups + 1  # one transaction for both
    assert await store.get("first") is None and await store.get("second") is None
    other = await store.get("other")
    assert other is not None and other.status is Status.QUEUED


async def test_the_file_holds_every_acknowledged_write_of_a_group(
    store: SQLiteStore, tmp_path: pathlib.Path
) -> None:
    await asyncio.gather(*(store.submit([new(f"g{n}")]) for n in range(20)))
    # Another connection (as another process would) sees all twenty.
    with sqlite3.connect(tmp_path / "writes.db") as other:
        (count,) = other.execute("SELECT count(*) FROM conveyor_jobs").fetchone()
    assert count == 20


async def test_a_write_waits_for_the_lock_another_process_holds_then_commits(
    store: SQLiteStore, tmp_path: pathlib.Path
) -> None:
    """A write asked while another connection holds the write lock waits for it (the
    busy timeout) and commits once it is let go."""
    other = sqlite3.connect(tmp_path / "writes.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    write = asyncio.ensure_future(store.submit([new("waited")]))
    await asyncio.sleep(0.3)
    assert not write.done(), "the write did not wait for the lock"
    other.execute("COMMIT")
    other.close()
    await asyncio.wait_for(write, 10)
    assert [j.id for j in await store.get_many(["waited"])] == ["waited"]


async def test_the_write_ahead_log_shrinks_back_after_a_burst(
    store: SQLiteStore, tmp_path: pathlib.Path
) -> None:
    """Issue #30 item 10: SQLite never shrinks the -wal file itself; without
    journal_size_limit it kept the size of the largest burst for good."""
    wal = tmp_path / "writes.db-wal"
    # A reader holding an old snapshot keeps checkpoints from starting the log over, so
    # a burst of writes meanwhile grows the log by its whole size.
    reader = sqlite3.connect(tmp_path / "writes.db", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM conveyor_jobs").fetchall()
    payload = {"text": "x" * 10_000}
    for batch in range(40):
        await store.submit([new(f"b{batch}-{i}", payload=payload) for i in range(50)])
    burst = wal.stat().st_size
    assert burst > 2 * WAL_SIZE_LIMIT
    reader.execute("ROLLBACK")
    reader.close()
    # A commit past 1000 pages of log checkpoints it; the next write starts it over.
    for i in range(20):
        await store.submit([new(f"after-{i}")])
        if wal.stat().st_size <= WAL_SIZE_LIMIT:
            break
    assert wal.stat().st_size <= WAL_SIZE_LIMIT, f"the log kept {wal.stat().st_size} bytes"
    assert await store.get("b39-49") is not None and await store.get(f"after-{i}") is not None


async def test_a_small_submit_skips_the_hand_off_only_while_the_stores_thread_is_idle(
    store: SQLiteStore,
) -> None:
    """Issue 31: a submit of a few jobs runs on the event loop's thread, saving the two
    cross-thread wake-ups, unless the store's thread is busy; writes of the same turn
    still share one transaction, wherever it runs."""
    loop_thread = threading.get_ident()
    ran_on: list[int] = []

    def record(conn: sqlite3.Connection) -> None:
        ran_on.append(threading.get_ident())

    await store._write(record, here=True)
    await store._write(record)  # claims, settles and the rest: always on the store's thread
    assert ran_on[0] == loop_thread and ran_on[1] != loop_thread
    groups, writes = _counts(store)
    results = await asyncio.gather(*(store.submit([new(f"s{n}")]) for n in range(10)))
    assert all(r[0].created for r in results)
    assert _counts(store) == (groups + 1, writes + 10)
    # While the store's thread runs something, a small write goes there, after it.
    executor = store._executor
    assert executor is not None
    release = threading.Event()
    holding = asyncio.get_running_loop().run_in_executor(executor, release.wait, 10)
    while not executor.busy.locked():  # until the store's thread has started it
        await asyncio.sleep(0.001)
    later = asyncio.ensure_future(store._write(record, here=True))
    for _ in range(3):  # its first step, then the end of its turn: the thread is busy
        await asyncio.sleep(0)
    assert not later.done()
    release.set()
    await holding
    await asyncio.wait_for(later, 10)
    assert ran_on[2] != loop_thread


async def test_a_task_submitting_one_job_after_another_writes_each_on_the_spot(
    store: SQLiteStore, tmp_path: pathlib.Path
) -> None:
    """Issue 31: a small write of the task that asked the last one, with nothing queued,
    commits in the caller's own step of the loop (no turn of the loop waited for); writes
    of other tasks in one turn still share a transaction, and a file another connection
    holds locked sends the write the usual way, which waits for the lock."""
    loop = asyncio.get_running_loop()
    await store.submit([new("first")])  # noted as the last to ask
    groups, writes = _counts(store)
    turns: list[int] = []
    loop.call_soon(turns.append, 1)
    await store.submit([new("second")])
    assert turns == [], "the submit waited for a turn of the loop"
    await store.submit([new("third")])
    assert _counts(store) == (groups + 2, writes + 2)  # a transaction each, committed
    with sqlite3.connect(tmp_path / "writes.db") as other:
        (count,) = other.execute("SELECT count(*) FROM conveyor_jobs").fetchone()
    assert count == 3
    # Other tasks asking in one turn share one transaction, as before.
    await asyncio.gather(*(store.submit([new(f"c{n}")]) for n in range(10)))
    assert _counts(store) == (groups + 3, writes + 12)
    # The same task again while another connection holds the write lock: its write goes
    # the usual way, which waits for the lock, and commits once it is let go.
    locked, asked = asyncio.Event(), asyncio.Event()

    async def one_after_another() -> None:
        await store.submit([new("mine-1")])
        await store.submit([new("mine-2")])  # on the spot
        await locked.wait()
        asked.set()
        await store.submit([new("mine-3")])

    submitter = asyncio.ensure_future(one_after_another())
    other = sqlite3.connect(tmp_path / "writes.db", isolation_level=None)
    try:
        while not await store.get("mine-2"):
            await asyncio.sleep(0.001)
        other.execute("BEGIN IMMEDIATE")
        locked.set()
        await asked.wait()
        await asyncio.sleep(0.3)
        assert not submitter.done(), "the write did not wait for the lock"
    finally:
        other.execute("COMMIT")
        other.close()
    await asyncio.wait_for(submitter, 10)
    assert await store.get("mine-3") is not None


async def test_a_job_submitted_on_the_spot_is_one_statement_that_commits_by_itself(
    store: SQLiteStore, tmp_path: pathlib.Path
) -> None:
    """Issue 31: on the spot, a job without dependencies is one INSERT sent outside any
    transaction (SQLite commits it by itself: no BEGIN and COMMIT sent around it), from a
    task and from a blocking caller (submit_now) alike; one whose id is taken writes
    nothing that way and the usual transaction returns the job holding it."""
    conn = store._conn
    assert conn is not None
    await store.submit([new("first")])  # noted as the last to ask
    sent: list[str] = []
    conn.set_trace_callback(sent.append)
    try:
        [second] = await store.submit([new("second")])
        done_now = await asyncio.to_thread(store.submit_now, [new("third")])
        spot = list(sent)
        again = await store.submit([new("second", payload={"other": 1})])
    finally:
        conn.set_trace_callback(None)
    assert second.created and second.job.id == "second"
    assert done_now is not None and done_now[0].created
    assert [statement.split()[0] for statement in spot] == ["INSERT", "INSERT"], spot
    with sqlite3.connect(tmp_path / "writes.db") as other:
        ids = {r[0] for r in other.execute("SELECT id FROM conveyor_jobs")}
    assert ids == {"first", "second", "third"}  # committed, seen by another connection
    # The taken id: the one statement inserts nothing, then a transaction finds the job.
    assert not again[0].created and again[0].job.payload == second.job.payload
    assert "BEGIN IMMEDIATE" in sent[len(spot) :]


async def test_a_run_of_writes_on_the_spot_still_gives_the_loop_its_turns(
    store: SQLiteStore,
) -> None:
    """Writes on the spot return without a turn of the loop; a task submitting one job
    after another for a while must still let the loop's other tasks (a worker's
    heartbeats) run now and then, not only once it is done."""
    ticks = 0
    running = True

    async def ticker() -> None:
        nonlocal ticks
        while running:
            ticks += 1
            await asyncio.sleep(0)

    ticking = asyncio.ensure_future(ticker())
    await store.submit([new("first")])  # noted as the last to ask: the rest on the spot
    before, groups = ticks, _counts(store)[0]
    end = time.monotonic() + 0.3
    n = 0
    while time.monotonic() < end or n < 2:
        await store.submit([new(f"run-{n}")])
        n += 1
    during = ticks - before
    running = False
    await ticking
    assert _counts(store)[0] == groups + n  # a transaction each
    assert during > 0, f"{n} submits over 0.3 s gave the loop no turn"


async def test_after_a_write_on_the_loops_thread_the_stores_thread_still_waits_for_the_lock(
    store: SQLiteStore, tmp_path: pathlib.Path
) -> None:
    """The loop's thread begins with no busy timeout (it must never wait for another
    process there); the store's thread puts the timeout back before its next write."""
    await store.submit([new("on-the-loop")])
    other = sqlite3.connect(tmp_path / "writes.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        claim = asyncio.ensure_future(
            store.claim(worker_id="w", queues=["default"], limit=5, lease=30)
        )
        await asyncio.sleep(0.3)
        assert not claim.done(), "the claim did not wait for the lock"
    finally:
        other.execute("COMMIT")
        other.close()
    claimed = await asyncio.wait_for(claim, 10)
    assert [j.id for j in claimed] == ["on-the-loop"]
