"""Which store operations the contract actually calls: a recording proxy, and the check.

Every store the contract tests use is wrapped in :class:`Recording`, which notes each
protocol operation invoked, by backend. At the end of a run that ran the whole contract
(tests/conftest.py), every operation of :class:`~conveyor.store.Store` must have been
invoked on every backend that ran: a backend that passes the contract implements the
whole seam, and an operation no test calls fails the run by name.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from conveyor import store as _store
from conveyor.store import Store

# Every operation of the protocol, by name: each is defined in one of its roles.
ROLES = tuple(r for r in Store.__mro__[1:] if r.__module__ == Store.__module__)
OPERATIONS = frozenset(
    name
    for role in ROLES
    for name, method in vars(role).items()
    if inspect.isfunction(method) and not name.startswith("_")
)

# What this process saw invoked: backend -> operation names.
SEEN: dict[str, set[str]] = {}


class Recording:
    """A store that notes each protocol operation invoked on it, then calls it."""

    def __init__(self, store: Store, seen: set[str]) -> None:
        self._store = store
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if name not in OPERATIONS:
            return value
        seen = self._seen

        def invoke(*args: Any, **kwargs: Any) -> Any:
            seen.add(name)
            return value(*args, **kwargs)

        return invoke


def recorded(store: Store, backend: str) -> Store:
    """``store``, recording the operations invoked on it under ``backend``."""
    return cast(Store, Recording(store, SEEN.setdefault(backend, set())))


def create_store(
    url: str, *, clock: Callable[[], float] | None = None, migrate: bool = True
) -> Store:
    """:func:`conveyor.store.create_store`, recording the operations invoked on the store
    under its backend's name (``sqlite``, ``postgres``)."""
    store = _store.create_store(url, clock=clock, migrate=migrate)
    return recorded(store, "sqlite" if url.startswith("sqlite") else "postgres")


def unwrapped(store: Store) -> Store:
    """The backend's own store behind a recording one."""
    return store._store if isinstance(store, Recording) else store


def missing(seen: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
    """The operations never invoked, by backend (backends that ran nothing are left out)."""
    gaps = {backend: sorted(OPERATIONS - set(ops)) for backend, ops in seen.items() if ops}
    return {backend: ops for backend, ops in gaps.items() if ops}


def ran_whole_contract(config: pytest.Config) -> bool:
    """Whether this run selected the whole contract: its folder (or one above it) with no
    test filtered out. A run of some of its tests proves nothing either way."""
    option = config.option
    if option.keyword or option.markexpr or getattr(option, "lf", False):
        return False
    for partial in ("deselect", "ignore", "ignore_glob", "exitfirst"):
        if getattr(option, partial, None):
            return False
    contract = Path(__file__).parent.resolve()
    for arg in config.args:
        path = (Path(config.invocation_params.dir) / arg).resolve()
        if "::" not in arg and path.is_dir() and contract.is_relative_to(path):
            return True
    return False


class ContractCheck:
    """The end-of-run check, in the process that sees every test's end (the xdist
    controller, or the only process): merges what each process recorded."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.seen: dict[str, set[str]] = {}
        self.xdist_worker = hasattr(config, "workerinput")

    def merge(self, seen: Mapping[str, Collection[str]]) -> None:
        for backend, ops in seen.items():
            self.seen.setdefault(backend, set()).update(ops)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        self.merge(getattr(node, "workeroutput", {}).get("store_operations", {}))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.xdist_worker:
            output = cast(dict[str, Any], self.config.workeroutput)  # type: ignore[attr-defined]
            output["store_operations"] = {b: sorted(ops) for b, ops in SEEN.items()}
            return
        self.merge(SEEN)
        if exitstatus != 0 or not ran_whole_contract(self.config):
            return
        # A backend left out of CONVEYOR_TEST_BACKENDS ran only its own tests, if any.
        selected = os.environ.get("CONVEYOR_TEST_BACKENDS", "sqlite,postgres").split(",")
        gaps = missing({b: ops for b, ops in self.seen.items() if b in selected})
        if gaps:
            report: Callable[[str], None] = print
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.ensure_newline()
                report = reporter.write_line
            for backend, ops in gaps.items():
                report(f"the store contract (tests/store) never calls on {backend}: {ops}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
