"""The store operations that are one shared script on every backend, delegated once.

Each backend inherits them and supplies three ways to run a script (each given a function
that makes the script, so that a backend that retries a transaction starts it afresh):
``_script`` in one writing transaction, ``_read`` outside any transaction, and
``_statement`` for a script of one writing statement (SQLite: under the write lock, as any
write; PostgreSQL: in autocommit, one round trip).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TypeVar

from conveyor.core.cron import Schedule
from conveyor.core.model import Job, NewJob
from conveyor.store import scripts
from conveyor.store.protocol import Lease, LeaseRecord, Retention, ScheduleInfo, Submitted
from conveyor.store.scripts import Dialect, Script

T = TypeVar("T")


class ScriptedOps(ABC):
    """The store operations whose every step is a shared script (store/scripts/)."""

    dialect: Dialect

    @abstractmethod
    async def _script(self, make: Callable[[], Script[T]]) -> T:
        """Run the script ``make`` returns in one writing transaction."""

    @abstractmethod
    async def _read(self, make: Callable[[], Script[T]]) -> T:
        """Run a script of reads outside any transaction."""

    @abstractmethod
    async def _statement(self, make: Callable[[], Script[T]]) -> T:
        """Run a script of one writing statement, a transaction on its own."""

    # -- jobs ---------------------------------------------------------------------------

    async def get(self, job_id: str) -> Job | None:
        return await self._read(partial(scripts.get_with_counts, self.dialect, job_id))

    async def cancel(self, job_id: str, *, reason: str) -> Job | None:
        return await self._script(partial(scripts.cancel, self.dialect, job_id, reason))

    async def retry(self, job_id: str, new: NewJob) -> Job | None:
        return await self._script(partial(scripts.retry, self.dialect, job_id, new))

    async def retry_many(self, retries: Sequence[tuple[str, NewJob]]) -> list[Job]:
        return await self._script(partial(scripts.retry_many, self.dialect, retries))

    async def spawn(
        self,
        lease: Lease,
        jobs: Sequence[NewJob],
        callbacks: Mapping[str, NewJob] | None = None,
    ) -> list[Submitted] | None:
        return await self._script(partial(scripts.spawn, self.dialect, lease, jobs, callbacks))

    # -- maintenance --------------------------------------------------------------------

    async def finish_parents(self, *, limit: int) -> list[str]:
        return await self._script(partial(scripts.finish_parents, self.dialect, limit))

    async def prune(self, retention: Retention, *, limit: int) -> int:
        return await self._script(partial(scripts.prune, retention, limit))

    # -- schedules ----------------------------------------------------------------------

    async def sync_schedules(self, schedules: Sequence[Schedule]) -> None:
        await self._script(partial(scripts.sync_schedules, self.dialect, schedules))

    async def fire_schedules(self, *, limit: int, min_grace: float = 0.0) -> list[str]:
        return await self._script(partial(scripts.fire_schedules, self.dialect, limit, min_grace))

    async def schedules(self) -> list[ScheduleInfo]:
        return await self._read(partial(scripts.schedules, self.dialect))

    async def set_schedule_enabled(self, name: str, enabled: bool) -> ScheduleInfo | None:
        return await self._script(
            partial(scripts.set_schedule_enabled, self.dialect, name, enabled)
        )

    async def run_schedule(self, name: str) -> Job | None:
        return await self._script(partial(scripts.run_schedule, self.dialect, name))

    # -- named leases -------------------------------------------------------------------

    async def acquire_lease(self, name: str, *, owner: str, ttl: float) -> LeaseRecord:
        return await self._script(partial(scripts.acquire_lease, self.dialect, name, owner, ttl))

    async def renew_lease(self, name: str, *, token: int, ttl: float) -> datetime | None:
        return await self._statement(partial(scripts.renew_lease, self.dialect, name, token, ttl))

    async def release_lease(self, name: str, *, token: int) -> bool:
        return await self._script(partial(scripts.release_lease, name, token))

    async def lease_history(self, name: str) -> list[LeaseRecord]:
        return await self._read(partial(scripts.lease_history, self.dialect, name))
