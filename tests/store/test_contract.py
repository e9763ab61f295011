"""The contract itself: every backend has every operation, and the contract calls each.

The modules beside this one run unchanged against every backend (a real SQLite file, a
real PostgreSQL database), with the store's clock pinned so lease expiry is deterministic.
Each store they use records the operations invoked on it (recording.py); a run of the
whole contract fails if some operation was never invoked on a backend that ran.
"""

from __future__ import annotations

import inspect
from typing import Protocol

from conveyor.store import Store, protocol
from tests.store.recording import OPERATIONS, ROLES, Recording, missing, unwrapped


def test_the_store_implements_the_whole_protocol_with_the_same_parameters(store: Store) -> None:
    backend = type(unwrapped(store))
    for name in sorted(OPERATIONS):
        ours = getattr(backend, name, None)
        assert ours is not None, f"{backend.__name__} has no {name}()"
        expected = list(inspect.signature(getattr(Store, name)).parameters)
        assert list(inspect.signature(ours).parameters) == expected, name


def test_each_operation_belongs_to_one_role_and_store_is_their_union() -> None:
    """Store adds nothing of its own: an operation is added to the role that needs it,
    once, and callers typed against a role see only that role's operations."""
    own = [n for n, m in vars(Store).items() if inspect.isfunction(m) and n[0] != "_"]
    assert own == []
    defined = [
        name
        for role in ROLES
        for name, method in vars(role).items()
        if inspect.isfunction(method) and not name.startswith("_")
    ]
    assert sorted(defined) == sorted(set(defined)), "an operation is in two roles"
    assert {r.__name__ for r in ROLES} == {
        "StoreLifecycle", "Clock", "JobReads", "SubmitStore", "WorkerStore",
        "MaintenanceStore", "ReadStore", "OperatorStore", "LockStore", "TokenStore",
    }  # fmt: skip
    protocols = {
        c
        for c in vars(protocol).values()
        if isinstance(c, type) and c.__module__ == protocol.__name__ and Protocol in c.__bases__
    }
    assert protocols - {Store} == set(ROLES), "a role Store does not include"


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
