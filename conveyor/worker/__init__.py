"""The worker: claims jobs, runs their handlers, and reports how each attempt ended.

``from conveyor.worker import Worker, WorkerOptions`` (also importable from ``conveyor``).
The package is split as River splits its worker:

- ``options``: :class:`WorkerOptions`, how a worker runs;
- ``_worker``: :class:`Worker`, which puts the parts together and runs them;
- ``_producer``: claims due jobs into free slots and starts their handlers;
- ``_executor``: runs one attempt (async, in a thread or in a child process) and decides
  its settlement; ``_threads`` holds the threads of sync handlers, ``_isolation`` the
  child processes, ``_port`` a running job's way back to the worker;
- ``_completer``: records settlements in batches and logs each outcome;
- ``_leases`` and ``_heartbeat``: the job leases a worker holds, renewed from a thread of
  their own;
- ``_maintenance``: the duties every worker runs (rescue, cron, pruning);
- ``context``: :class:`~conveyor.JobContext`, what a handler gets;
- ``_host``: what a worker needs from the application it runs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor.worker._worker import Worker, run_worker
    from conveyor.worker.options import WorkerOptions

# Loaded when first used (PEP 562): a handler importing ``conveyor.worker.context`` does
# not load the worker's machinery.
_EXPORTS = {
    "Worker": "conveyor.worker._worker",
    "WorkerOptions": "conveyor.worker.options",
    "run_worker": "conveyor.worker._worker",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor.worker' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = ["Worker", "WorkerOptions", "run_worker"]
