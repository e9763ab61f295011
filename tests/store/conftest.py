"""The store contract's ``store``: the one every test gets, recording what it is asked."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from conveyor.store import Store
from tests.helpers import FakeClock
from tests.store.recording import create_store


@pytest.fixture
async def store(db_url: str, clock: FakeClock | None) -> AsyncIterator[Store]:
    """An open store on a fresh database, on the ``clock`` fixture's time, recording the
    operations invoked on it (tests/store/recording.py)."""
    s = create_store(db_url, clock=clock)
    await s.open()
    yield s
    await s.close()
