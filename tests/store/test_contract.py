"""The contract itself: every backend has every operation, and the contract calls each.

The modules beside this one run unchanged against every backend (a real SQLite file, a
real PostgreSQL database), with the store's clock pinned so lease expiry is deterministic.
Each store they use records the operations invoked on it (recording.py); a run of the
whole contract fails if some operation was never invoked on a backend that ran.
"""

from __future__ import annotations

import inspect

from conveyor.store import Store
from tests.store.recording import OPERATIONS, Recording, missing, unwrapped


def test_the_store_implements_the_whole_protocol_with_the_same_parameters(store: Store) -> None:
    backend = type(unwrapped(store))
    for name in sorted(OPERATIONS):
        ours = getattr(backend, name, None)
        assert ours is not None, f"{backend.__name__} has no {name}()"
        expected = list(inspect.signature(getattr(Store, name)).parameters)
        assert list(inspect.signature(ours).parameters) == expected, name


async def test_the_recorder_notes_operations_invoked_not_attributes_read(store: Store) -> None:
    seen: set[str] = set()
    spy = Recording(unwrapped(store), seen)
    _ = spy.get_many  # read, not invoked
    assert seen == set()
    assert await spy.get_many([]) == []
    assert seen == {"get_many"}


def test_an_operation_never_invoked_is_named_by_backend() -> None:
    """The end-of-run check, fed what a contract missing two operations would record."""
    assert "wait_for_jobs" in OPERATIONS and "open" in OPERATIONS
    some = OPERATIONS - {"wait_for_jobs", "record_audit"}
    assert missing({"sqlite": OPERATIONS, "postgres": some}) == {
        "postgres": ["record_audit", "wait_for_jobs"]
    }
    assert missing({"sqlite": OPERATIONS, "postgres": set()}) == {}  # it ran nothing
