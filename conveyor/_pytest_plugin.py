"""The ``conveyor_tester`` pytest fixture (a pytest plugin installed with conveyor).

It needs pytest-asyncio: without it the fixture is simply not defined.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from conveyor.app.client import Conveyor
from conveyor.testing import JobTester

if importlib.util.find_spec("pytest_asyncio") is not None:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def conveyor_tester() -> AsyncIterator[Callable[..., Awaitable[JobTester]]]:
        """Make a :class:`~conveyor.testing.JobTester` for an application:
        ``jobs = await conveyor_tester(app)`` (or ``conveyor_tester(app, database=URL)``);
        every tester made is closed after the test."""
        made: list[JobTester] = []

        async def make(app: Conveyor, database: str | None = None, **kw: Any) -> JobTester:
            tester = await JobTester(app, database, **kw).__aenter__()
            made.append(tester)
            return tester

        yield make
        for tester in reversed(made):
            await tester.close()
