"""The state a worker's parts share: :class:`WorkerBase`, and how far its shutdown has gone.

A :class:`~conveyor.worker.Worker` is put together from three parts, as River splits its
worker: the producer (``_producer.py``: claims jobs into free slots and starts them), the
executor (``_executor.py``: runs one attempt of a handler and decides its settlement) and
the completer (``_completer.py``: records settlements in batches). They run on one event
loop and share the state declared here; each part declares here what it calls in another,
so that the seams between them are written down in one place.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.app.registry import JobType
    from conveyor.core.lifecycle import Event
    from conveyor.core.model import JSON, Outcome, Settlement
    from conveyor.observe.hooks import Hooks
    from conveyor.observe.metrics import Metrics
    from conveyor.store import Store, WorkerStore
    from conveyor.worker._host import WorkerHost
    from conveyor.worker._leases import Interrupt, Leases, Run
    from conveyor.worker._threads import HandlerThreads
    from conveyor.worker.options import WorkerOptions

log = logging.getLogger("conveyor.worker")


class _Phase(IntEnum):
    """How far the worker's shutdown has gone; it only ever moves forward."""

    RUNNING = 0  # claiming
    STOPPING = 1  # no new claims; running handlers finish, or are handed back after grace
    DRAINED = 2  # no handler runs: the settle loop ends once the results are recorded
    GAVE_UP = 3  # results the database would not take were dropped: the settle loop ends


class WorkerBase:
    """What the producer, the executor and the completer of one worker share."""

    app: WorkerHost
    options: WorkerOptions
    id: str
    queues: tuple[str, ...]
    types: tuple[str, ...]  # the job types it has handlers for, the only ones it claims
    leases: Leases
    processed: int
    _active: int  # handlers running, slots taken
    _outbox: list[tuple[Run, Settlement]]  # settlements waiting for the completer
    _phase: _Phase
    _wakeup: asyncio.Event  # claim again: a slot freed, a job is due, a stop
    _settle_ready: asyncio.Event
    _idle: asyncio.Event  # no handler runs
    _stop_requested: asyncio.Event
    _maintenance_stop: asyncio.Event
    _store: Store | None
    _loop: asyncio.AbstractEventLoop | None
    _threads: HandlerThreads
    _metrics: Metrics | None
    _hooks: Hooks
    _traced: bool  # whether attempts get spans (asked once per claim)
    _limited: list[JobType]  # the types with flow control of their own

    def _advance(self, phase: _Phase) -> None:
        self._phase = max(self._phase, phase)

    # -- the seams: each part calls these in another --------------------------------------

    async def _execute(self, run: Run, job_type: JobType | None, store: WorkerStore) -> None:
        """Run one attempt and hand its settlement to the completer (the executor)."""
        raise NotImplementedError

    def _settlement(
        self,
        run: Run,
        event: Event,
        outcome: Outcome | None,
        *,
        result: JSON = None,
        result_ref: str | None = None,
        error: str | None = None,
    ) -> Settlement:
        """The settlement of ``run`` for ``event`` (the executor)."""
        raise NotImplementedError

    def _finish(self, run: Run, settlement: Settlement | None) -> None:
        """Free ``run``'s slot and queue its settlement for the completer (the executor)."""
        raise NotImplementedError

    def _on_cancel_requested(self, job_ids: Iterable[str]) -> None:
        """Interrupt the runs of jobs whose cancel was requested (the worker)."""
        raise NotImplementedError

    def _interrupt(self, run: Run, kind: Interrupt, reason: str) -> None:
        """Stop a run for ``kind`` (the executor)."""
        raise NotImplementedError

    def _lose(self, run: Run) -> None:
        """Stop a run whose lease is gone and drop its result (the executor)."""
        raise NotImplementedError

    def _lost(self, run: Run, why: str = "lease lost; its result is dropped") -> None:
        """Log a run's result as dropped (the completer)."""
        raise NotImplementedError
