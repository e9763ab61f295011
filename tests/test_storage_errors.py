"""Storage failures reach users as conveyor's errors and exit codes, never as a driver's
exception or a traceback, and the store works again once the cause is gone.

The full disk is real: a small tmpfs mounted for the test (this needs root, as in the
project's test container; elsewhere these tests are skipped, saying why).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conveyor import Status
from conveyor.errors import DatabaseUnavailable, StorageError
from conveyor.store import Store, create_store
from tests.helpers import eventually, new
from tests.processes import FAST, ROOT, WorkerProcesses


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB file system of its own (tmpfs), unmounted at the end of the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture
async def store_on_small_disk(small_disk: Path) -> AsyncIterator[Store]:
    s = create_store(f"sqlite:///{small_disk / 'conveyor.db'}")
    await s.open()
    yield s
    await s.close()


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file; return it (delete it to free the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    try:
        while True:  # the last partial block
            os.write(fd, b"\0" * 512)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler


BIG = {"text": "x" * 500_000}  # more than the write-ahead log has room for


async def test_a_full_disk_is_a_storage_error_and_writes_work_again_once_space_is_freed(
    store_on_small_disk: Store, small_disk: Path
) -> None:
    store = store_on_small_disk
    await store.submit([new("before")])
    filler = fill(small_disk)
    for attempt in range(3):  # the same error each time: nothing left half done
        with pytest.raises(StorageError, match=r"is full.*free space") as caught:
            await store.submit([new(f"big-{attempt}", payload=BIG)])
        assert isinstance(caught.value, DatabaseUnavailable)  # exit code 4, HTTP 503
    assert (await store.get("before")) is not None, "reads still work on a full disk"
    assert await store.get("big-0") is None

    filler.unlink()
    # The log regrows into the freed space: big writes, many small ones, a claim.
    await store.submit([new("after", payload=BIG)])
    await store.submit([new(f"small-{i}") for i in range(200)])
    claimed = await store.claim(worker_id="w", queues=["default"], limit=500, lease=30)
    assert len(claimed) == 202
    after = await store.get("after")
    assert after is not None and after.payload == BIG


async def test_a_full_disk_gives_back_the_write_ahead_logs_space(small_disk: Path) -> None:
    """Issue #30 item 10: the log had filled the disk, and the store could not write again
    until someone freed more than the next write needed: SQLite appends to the log, and
    keeps its size, until a checkpoint starts it over."""
    url = f"sqlite:///{small_disk / 'conveyor.db'}"
    store = create_store(url)
    await store.open()
    await store.submit([new(f"j{i}", payload={"text": "x" * 3000}) for i in range(250)])
    assert len(await store.claim(worker_id="w", queues=["default"], limit=250, lease=600)) == 250
    await store.close()  # the last connection to close checkpoints the log and removes it
    store = create_store(url)
    await store.open()
    try:
        wal = small_disk / "conveyor.db-wal"
        # Rewrites of rows already in the file, which no index entry follows (a running
        # job's cancel is a request): the log grows, the database's pages stay as many,
        # so that a checkpoint needs no space the full disk does not have.
        for i in range(250):
            await store.cancel(f"j{i}", reason="not needed")
        grown = wal.stat().st_size
        assert grown > 300_000
        filler = fill(small_disk)
        os.truncate(filler, filler.stat().st_size - 64 * 1024)  # a sliver, as an rm may give
        with pytest.raises(StorageError, match=r"is full"):
            await store.submit([new("big", payload=BIG)])
        assert wal.stat().st_size < grown / 10, "the log was checkpointed and truncated"
        await store.submit([new("big", payload=BIG)])  # with no more space freed
        cancelled = await store.get("j249")
        assert cancelled is not None and cancelled.cancel_requested
    finally:
        await store.close()


APP = """
from conveyor import Conveyor

app = Conveyor()


@app.job()
async def keep(ctx, text: str) -> None:
    return None
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=f"{cwd}{os.pathsep}{ROOT}", COLUMNS="1000")
    command = [sys.executable, "-m", "conveyor", *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


async def test_submit_on_a_full_disk_exits_4_with_one_line_and_no_traceback(
    store_on_small_disk: Store, small_disk: Path, tmp_path: Path
) -> None:
    (tmp_path / "fullapp.py").write_text(textwrap.dedent(APP))
    url = f"sqlite:///{small_disk / 'conveyor.db'}"
    await store_on_small_disk.submit([new("before")])  # the store stays open meanwhile
    filler = fill(small_disk)
    payload = '{"text": "%s"}' % ("x" * 100_000)
    args = ("submit", "keep", "--app", "fullapp:app", "--database-url", url, "-p", payload)
    failed = await asyncio.to_thread(_cli, *args, cwd=tmp_path)
    assert failed.returncode == 4, failed.stderr
    assert "Traceback" not in failed.stderr
    lines = [line for line in failed.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "is full" in lines[0] and "free space" in lines[0], lines

    filler.unlink()
    done = await asyncio.to_thread(_cli, *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "submitted" in done.stdout


async def test_a_write_lock_held_past_the_busy_timeout_is_a_storage_error(
    store_on_small_disk: Store, small_disk: Path
) -> None:
    store = store_on_small_disk
    # The store waits 30 s for a lock; a short wait keeps the test short. This is the
    # busy timeout SQLite itself enforces, set on the store's own connection.
    await store._run(lambda conn: conn.execute("PRAGMA busy_timeout = 200"))  # type: ignore[attr-defined]
    holder = await asyncio.to_thread(_hold_write_lock, small_disk / "conveyor.db")
    try:
        with pytest.raises(StorageError, match=r"locked.*busy timeout"):
            await store.submit([new("a")])
    finally:
        await asyncio.to_thread(holder.rollback)
        await asyncio.to_thread(holder.close)
    await store.submit([new("a")])
    assert (await store.get("a")) is not None


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    return conn


@pytest.mark.processes
async def test_a_worker_rides_out_a_full_disk_and_runs_the_jobs_once_space_is_back(
    store_on_small_disk: Store, small_disk: Path, tmp_path: Path
) -> None:
    store = store_on_small_disk
    url = f"sqlite:///{small_disk / 'conveyor.db'}"
    workers = WorkerProcesses(url, tmp_path / "runs.log", tmp_path)
    try:
        worker = workers.start(*FAST)
        await workers.wait_registered()
        # Due in a moment: the worker's claims come while the disk is full.
        jobs = [new(f"j{i}", type="noop", payload={"i": i}, delay=1.0) for i in range(20)]
        await store.submit(jobs)
        filler = fill(small_disk)
        await eventually(lambda: _logged(workers, "cannot claim jobs"), timeout=30)
        assert await store.get("j0") is not None and workers.records() == []

        filler.unlink()
        await eventually(lambda: _all_succeeded(store, [j.id for j in jobs]), timeout=30)
        assert worker.poll() is None, "the worker kept running"
        assert set(workers.runs_per_job().values()) == {1}
        log = workers.log(0)
        assert "is full" in log and "Traceback" not in log, log
    finally:
        workers.stop_all()


async def _logged(workers: WorkerProcesses, text: str) -> bool:
    return text in workers.log(0)


async def _all_succeeded(store: Store, job_ids: list[str]) -> bool:
    jobs = await store.get_many(job_ids)
    return len(jobs) == len(job_ids) and all(j.status is Status.SUCCEEDED for j in jobs)
