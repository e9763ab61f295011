"""Module paths that moved when conveyor's layers became packages (CHANGELOG.md).

Paths the documentation gave users keep working: ``import conveyor.logs`` imports
:mod:`conveyor.observe.logs` and returns it under both names. Internal modules that moved
fail with a message naming their new home, instead of a bare ModuleNotFoundError.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

# Old path -> new path, for paths users were told about: they keep working.
ALIASES = {
    "conveyor.client": "conveyor.app.client",
    "conveyor.context": "conveyor.worker.context",
    "conveyor.hooks": "conveyor.observe.hooks",
    "conveyor.logs": "conveyor.observe.logs",
    "conveyor.metrics": "conveyor.observe.metrics",
}

# Old path -> new path, for internal modules: importing the old path fails, naming the new.
MOVED = {
    "conveyor._blocking": "conveyor.app.blocking",
    "conveyor._console": "conveyor.cli._console",
    "conveyor._handles": "conveyor.app.handles",
    "conveyor._host": "conveyor.worker._host",
    "conveyor._isolation": "conveyor.worker._isolation",
    "conveyor._leases": "conveyor.app.locks",
    "conveyor._registry": "conveyor.app.registry",
    "conveyor._resource": "conveyor.web._resource",
    "conveyor._scoped": "conveyor.app.tenants",
    "conveyor._tenants": "conveyor.app.tenants",
    "conveyor._tokens": "conveyor.app._tokens",
    "conveyor._tracing": "conveyor.observe.tracing",
    "conveyor._trees": "conveyor.app._trees",
    "conveyor.maintenance": "conveyor.worker._maintenance",
    "conveyor.remote": "conveyor.cli._remote",
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Consulted only after the normal finders found nothing (it is last on the path)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in ALIASES:
            return importlib.machinery.ModuleSpec(fullname, self)
        if fullname in MOVED:
            raise ModuleNotFoundError(
                f"{fullname} moved to {MOVED[fullname]} (an internal module; import public "
                "names from conveyor)",
                name=fullname,
            )
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns what sys.modules holds under the old name once this
        # returns: the module at its new path, so both names give the same objects.
        sys.modules[module.__name__] = importlib.import_module(ALIASES[module.__name__])


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
