"""The client facade and its blocking adapter."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from conveyor import Conveyor, JobContext, Status, Submission, WorkerOptions
from conveyor.app import blocking
from conveyor.core.model import NewJob
from conveyor.errors import InvalidPayload
from conveyor.worker import run_worker
from tests.helpers import running_worker


def test_blocking_adapter_runs_the_same_code_paths(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path / 'c.db'}")

    @app.job()
    def shout(ctx: JobContext, word: str) -> str:
        return word.upper()

    try:
        job = shout.submit_sync(word="hey")
        assert job.status is Status.QUEUED
        assert app.sync.get(job.id).id == job.id

        worker = threading.Thread(
            target=run_worker, args=(app, WorkerOptions(burst=True, poll_interval=0.05))
        )
        worker.start()
        worker.join(30)
        done = job.sync.wait(timeout=10)
        assert done.status is Status.SUCCEEDED and done.result == "HEY"
        assert [j.id for j in app.sync.list_jobs(status=["succeeded"])] == [job.id]
    finally:
        # Python 3.13 warns of a SQLite connection collected unclosed (a ResourceWarning,
        # an error under the suite's filter, raised in whichever test the collector ran).
        app.sync.close()


def test_a_blocking_submit_on_sqlite_is_written_on_the_callers_thread(tmp_path: Path) -> None:
    """Issue 31: app.sync.submit of a few jobs skips the portal's loop and the store's
    thread when the store is open and idle (the clock is read where the work is done);
    what it does not cover goes through the portal, and a locked file is waited for."""
    where: list[int] = []

    def clock() -> float:
        where.append(threading.get_ident())
        return time.time()

    path = tmp_path / "c.db"
    app = Conveyor(f"sqlite:///{path}", clock=clock)

    @app.job()
    def shout(ctx: JobContext, word: str) -> str:
        return word.upper()

    try:
        app.sync.submit("shout", {"word": "open"})  # opens the portal's store
        where.clear()
        job = app.sync.submit(shout, {"word": "hey"}, priority=2)
        more = app.sync.submit_many([Submission("shout", {"word": w}) for w in "ab"])
        assert where and set(where) == {threading.get_ident()}
        assert (
            job.status is Status.QUEUED
            and job.record.priority == 2
            and job.record.payload == {"word": "hey"}
        )
        assert app.sync.get(job.id).id == job.id and len({h.id for h in more}) == 2
        with pytest.raises(InvalidPayload):
            app.sync.submit("shout", {"word": 1.5})
        where.clear()
        tenants = app.sync.submit("shout", {"word": "x"}, tenant="acme")  # through the portal
        assert threading.get_ident() not in where and tenants.status is Status.QUEUED
        # Another connection holds the write lock: the submit goes to the store's thread,
        # which waits for the lock, and commits once it is let go.
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        done: list[object] = []
        submitter = threading.Thread(
            target=lambda: done.append(app.sync.submit("shout", {"word": "waited"}))
        )
        submitter.start()
        store = app._stores[blocking.portal_loop()]  # type: ignore[index]
        while not store._executor.busy.locked():  # type: ignore[attr-defined]
            submitter.join(0.005)  # until the store's thread waits for the lock
        assert not done
        other.execute("COMMIT")
        other.close()
        submitter.join(30)
        assert len(done) == 1 and done[0].status is Status.QUEUED  # type: ignore[attr-defined]
    finally:
        app.sync.close()


async def test_pause_and_resume_a_queue(app: Conveyor) -> None:
    @app.job(queue="media")
    async def encode(ctx: JobContext) -> None:
        return None

    await app.pause("media")
    job = await encode.submit()
    async with running_worker(app):
        await asyncio.sleep(0.3)
        assert (await job.refresh()).status is Status.QUEUED
        queues = {q.name: q for q in await app.queues()}
        assert queues["media"].paused
        await app.resume("media")
        await job.wait(timeout=10)
    assert job.status is Status.SUCCEEDED


async def test_cancel_a_queued_job_and_list_by_status(app: Conveyor) -> None:
    @app.job()
    async def later(ctx: JobContext) -> None:
        return None

    job = await later.submit()
    cancelled = await app.cancel(job.id, reason="changed my mind")
    assert cancelled.status is Status.CANCELLED and cancelled.error == "changed my mind"
    assert [j.id for j in await app.list_jobs(status=["cancelled"])] == [job.id]
    with pytest.raises(Exception, match="known statuses"):
        await app.list_jobs(status=["exploded"])


async def test_job_options_are_validated_when_declared(app: Conveyor) -> None:
    from conveyor import ConfigurationError

    with pytest.raises(ConfigurationError, match="max_attempts"):

        @app.job(max_attempts=0)
        async def never(ctx: JobContext) -> None:
            return None

    with pytest.raises(ConfigurationError, match="duration"):

        @app.job(timeout="soon")
        async def vague(ctx: JobContext) -> None:
            return None

    with pytest.raises(ConfigurationError, match="job context as its first argument"):

        @app.job()
        async def no_ctx() -> None:
            return None


async def test_list_jobs_is_the_first_page_of_page_jobs(app: Conveyor) -> None:
    @app.job()
    async def step(ctx: JobContext) -> None:
        return None

    store = await app.store()
    await store.submit([NewJob(id="root", type="step", payload={})])
    await store.submit(
        [NewJob(id="leaf", type="step", payload={}, parent_id="root", root_id="root")]
    )
    everything = await app.page_jobs(include_children=True, limit=10)
    listed = await app.list_jobs(include_children=True)
    assert [j.id for j in listed] == [j.id for j in everything.jobs]
    assert {j.id for j in everything.jobs} == {"root", "leaf"}
    assert [j.id for j in await app.list_jobs()] == ["root"]  # top-level jobs by default
    assert [j.id for j in await app.list_jobs(top_level=True)] == ["root"]
    assert [j.id for j in await app.children("root")] == ["leaf"]
    assert [j.id for j in await app.tree("root")] == ["root", "leaf"]
