"""How the shared scripts read PostgreSQL's values and insert jobs (their :class:`Dialect`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.core.model import JSON, Job, NewJob
from conveyor.store.postgres._codec import job_of_row, utc
from conveyor.store.postgres._submit import submit_steps
from conveyor.store.protocol import Submitted
from conveyor.store.scripts import Row, Script


class PostgresDialect:
    """How the shared scripts read PostgreSQL's values and insert jobs."""

    def time(self, value: datetime | None) -> datetime | None:
        return utc(value)

    def json(self, value: JSON) -> JSON:
        return value

    def strings(self, value: Any) -> tuple[str, ...]:
        return tuple(value)

    def job(self, row: Row) -> Job:
        return job_of_row(row)

    def submit(self, jobs: Sequence[NewJob]) -> Script[list[Submitted]]:
        return submit_steps(jobs, None)


DIALECT = PostgresDialect()
