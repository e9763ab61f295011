"""Long polls served by one poll loop per process, not one query per client per tick.

Each request that waits for a job to end registers a future; a single task reads every
job being waited for in one query per tick and resolves the futures of those that ended.
A thousand clients long-polling cost the database one small query per tick.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from conveyor.app.client import Conveyor
from conveyor.core.model import Job

log = logging.getLogger("conveyor.web")


class _LoopWaiters:
    """The waiters of one event loop."""

    def __init__(self) -> None:
        self.waiting: dict[str, list[asyncio.Future[Job]]] = {}
        self.latest: dict[str, Job] = {}
        self.task: asyncio.Task[None] | None = None


class JobWaiters:
    """Wait for jobs to become terminal, with one shared query per ``tick`` seconds."""

    def __init__(self, app: Conveyor, *, tick: float) -> None:
        self.app = app
        self.tick = tick
        self.polls = 0  # queries made, for tests and metrics
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaiters] = (
            weakref.WeakKeyDictionary()
        )

    async def wait(self, job_id: str, timeout: float) -> Job | None:
        """Return the job once it is terminal, or its latest state seen after ``timeout``.

        None means no poll ran meanwhile (a very short timeout): read the job yourself.
        """
        loop = asyncio.get_running_loop()
        here = self._loops.get(loop)
        if here is None:
            here = self._loops[loop] = _LoopWaiters()
        future: asyncio.Future[Job] = loop.create_future()
        here.waiting.setdefault(job_id, []).append(future)
        if here.task is None or here.task.done():
            here.task = loop.create_task(self._poll(here), name="conveyor-api-waiters")
        try:
            async with asyncio.timeout(timeout):
                return await future
        except TimeoutError:
            return here.latest.get(job_id)
        finally:
            futures = here.waiting.get(job_id)
            if futures is not None and future in futures:
                futures.remove(future)
                if not futures:
                    del here.waiting[job_id]
            if job_id not in here.waiting:
                here.latest.pop(job_id, None)

    async def _poll(self, here: _LoopWaiters) -> None:
        while here.waiting:
            await asyncio.sleep(self.tick)
            ids = list(here.waiting)
            if not ids:
                break
            try:
                handles = await self.app.ops.get_many(ids)
            except Exception:
                # A database hiccup: the waiters keep waiting, the next tick tries again.
                log.warning("long-poll read failed; retrying next tick", exc_info=True)
                continue
            self.polls += 1
            for handle in handles:
                job = handle.record
                if job.id not in here.waiting:
                    continue
                here.latest[job.id] = job
                if job.terminal:
                    for future in here.waiting.pop(job.id, []):
                        if not future.done():
                            future.set_result(job)
