"""``app.sync``: the application's coroutine methods, blocking (:class:`~.blocking.Blocking`),
with a submit that skips the trips between threads where the store allows it.

A blocking call runs its coroutine on the portal's event loop and waits for it: a trip
there and one back, and on SQLite the store's own thread's on top. A submit of a few jobs
on SQLite instead is checked and written right on the caller's thread (the store's
``submit_now``), when the portal's store is open, its thread idle and no other connection
writes; otherwise, and for what it does not cover (another database, a tenant's jobs, whose
limit is counted in the store, or ``connection=``), it is the usual blocking call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.app import blocking
from conveyor.app.handles import JobDefinition, JobHandle, Submission
from conveyor.core.model import JSON, NewJob
from conveyor.observe import tracing
from conveyor.store.protocol import Submitted

if TYPE_CHECKING:
    from conveyor.app.client import Conveyor

# A submit of at most this many jobs may be written on the caller's thread.
_AT_ONCE = 8


class SyncConveyor(blocking.Blocking):
    """What ``app.sync`` returns: every coroutine method of the application, blocking."""

    def __init__(self, app: Conveyor) -> None:
        super().__init__(app)
        self._app = app

    def submit(
        self,
        type: str | JobDefinition[Any, Any],
        payload: Mapping[str, JSON] | None = None,
        **options: Any,
    ) -> JobHandle:
        """Blocking :meth:`Conveyor.submit`."""
        if options.get("connection") is None:
            name = type.name if isinstance(type, JobDefinition) else type
            given = {k: v for k, v in options.items() if k != "connection"}
            given["depends_on"] = tuple(given.get("depends_on", ()))
            try:
                submission = Submission(
                    type=name, payload=payload if payload is not None else {}, **given
                )
            except TypeError:  # an option submit() does not take: it says so itself
                pass
            else:
                handles = self._at_once([submission])
                if handles is not None:
                    return handles[0]
        handle: JobHandle = blocking.run(self._app.submit(type, payload, **options))
        return handle

    def submit_many(
        self, submissions: Sequence[Submission], *, connection: Any = None
    ) -> list[JobHandle]:
        """Blocking :meth:`Conveyor.submit_many`."""
        if connection is None:
            handles = self._at_once(submissions)
            if handles is not None:
                return handles
        done: list[JobHandle] = blocking.run(
            self._app.submit_many(submissions, connection=connection)
        )
        return done

    def _at_once(self, submissions: Sequence[Submission]) -> list[JobHandle] | None:
        """The submit on this thread, or None (nothing written): ask the portal."""
        if not 0 < len(submissions) <= _AT_ONCE or any(s.tenant for s in submissions):
            return None
        portal = blocking.portal_loop()
        store = self._app._stores.get(portal) if portal is not None else None
        submit_now: Callable[[Sequence[NewJob]], list[Submitted] | None] | None = getattr(
            store, "submit_now", None
        )
        if submit_now is None:
            return None
        app = self._app
        with tracing.submit_span(submissions):
            new_jobs = app.prepare(submissions)
            results = submit_now(new_jobs)
        if results is None:
            return None
        return app.handles(new_jobs, results)
