"""The scripts' shared ground: the types of a script and its steps, the dialect a backend
supplies, the drivers that run a script, and the store's clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypeVar

from conveyor.core.lifecycle import (
    Status,
)
from conveyor.core.model import (
    JSON,
    Job,
    NewJob,
)
from conveyor.store.protocol import (
    Submitted,
)

T = TypeVar("T")
Row = Mapping[str, Any]
Step = tuple[str, dict[str, Any]]
Script = Generator[Step, list[Any], T]
# A job that ended: its id, its parent's id and its status.
Ended = tuple[str, str | None, Status]


class Dialect(Protocol):
    """What a backend tells the scripts about its values, and how it inserts jobs."""

    def time(self, value: Any) -> datetime | None:
        """Read a stored time (None stays None)."""

    def json(self, value: Any) -> JSON:
        """Read a stored JSON document."""

    def strings(self, value: Any) -> tuple[str, ...]:
        """Read a stored list of strings."""

    def job(self, row: Row) -> Job:
        """Read a row of conveyor_jobs."""

    def submit(self, jobs: Sequence[NewJob]) -> Script[list[Submitted]]:
        """Insert jobs as the backend's submit does, in the script's transaction."""


def drive(script: Script[T], execute: Callable[[str, dict[str, Any]], list[Any]]) -> T:
    """Run a script to its end, running each step with ``execute``; return its result."""
    try:
        step = next(script)
        while True:
            step = script.send(execute(*step))
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(
    script: Script[T], execute: Callable[[str, dict[str, Any]], Awaitable[list[Any]]]
) -> T:
    """Run a script to its end, awaiting ``execute`` for each step; return its result."""
    try:
        step = next(script)
        while True:
            step = script.send(await execute(*step))
    except StopIteration as done:
        result: T = done.value
        return result


def _time(dialect: Dialect, value: Any, what: str) -> datetime:
    moment = dialect.time(value)
    if moment is None:
        raise RuntimeError(f"the database returned no {what}")
    return moment


def now(dialect: Dialect) -> Script[datetime]:
    """Return the store's clock: the pinned time, or the database's."""
    (row,) = yield "now", {}
    return _time(dialect, row["now"], "time")
