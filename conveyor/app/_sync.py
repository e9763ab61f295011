"""``app.sync``: the application's coroutine methods, blocking (:class:`~.blocking.Blocking`),
with a submit that skips the trips between threads where the store allows it.

A blocking call runs its coroutine on the portal's event loop and waits for it: a trip
there and one back, and on SQLite the store's own thread's on top. A submit of a few jobs
instead is checked and written right on the caller's thread (the store's ``submit_now``)
where the portal's store is open and can do that at once: on SQLite, when its thread is
idle and no other connection writes; on PostgreSQL, one job as one statement on a
connection of the store's transaction pool, or any few in the transaction of the
application's own blocking connection (``connection=``, a Django view's) once that
connection is known to be on the store's database. Otherwise, and for what it does not
cover (a tenant's jobs, whose limit is counted in the store), it is the usual blocking
call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conveyor.app import blocking
from conveyor.app.handles import JobDefinition, JobHandle, Submission
from conveyor.core.model import JSON
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
            handles = self._at_once([submission], options.get("connection"))
            if handles is not None:
                return handles[0]
        handle: JobHandle = blocking.run(self._app.submit(type, payload, **options))
        return handle

    def submit_many(
        self, submissions: Sequence[Submission], *, connection: Any = None
    ) -> list[JobHandle]:
        """Blocking :meth:`Conveyor.submit_many`."""
        handles = self._at_once(submissions, connection)
        if handles is not None:
            return handles
        done: list[JobHandle] = blocking.run(
            self._app.submit_many(submissions, connection=connection)
        )
        return done

    def _at_once(
        self, submissions: Sequence[Submission], connection: Any = None
    ) -> list[JobHandle] | None:
        """The submit on this thread (in ``connection``'s transaction if given), or None
        (nothing written): ask the portal."""
        if not 0 < len(submissions) <= _AT_ONCE or any(s.tenant for s in submissions):
            return None
        portal = blocking.portal_loop()
        store = self._app._stores.get(portal) if portal is not None else None
        submit_now: Callable[..., list[Submitted] | None] | None = getattr(
            store, "submit_now", None
        )
        if submit_now is None:
            return None
        app = self._app
        with tracing.submit_span(submissions):
            new_jobs = app.prepare(submissions)
            results = submit_now(new_jobs, connection=connection)
        if results is None:
            return None
        return app.handles(new_jobs, results)
