"""Named locks (``app.lease(name, ttl=...)``): one holder at a time, renewed in the
background, with a fencing token that grows with every new holder.

The public names say *lease* (``app.lease``, :class:`NamedLease`, ``LeaseHeld``), as they
always have; inside conveyor a *lease* is a worker's hold on a claimed job
(``worker/_leases.py``) and this application mutex is a *lock*.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from conveyor.app import blocking
from conveyor.errors import ConfigurationError, LeaseHeld
from conveyor.store import LockStore


class NamedLease:
    """A held named lease; see :meth:`Conveyor.lease`."""

    def __init__(
        self, store: Callable[[], Awaitable[LockStore]], name: str, *, ttl: float, owner: str | None
    ) -> None:
        if ttl < 0.3:
            raise ConfigurationError("a lease ttl must be at least 0.3 seconds")
        self._store = store
        self.name = name
        self.ttl = ttl
        self.owner = owner or f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        self.token = 0
        self.expires_at: datetime | None = None
        self._lost = asyncio.Event()
        self._renewer: asyncio.Task[None] | None = None
        self._held = False

    @property
    def lost(self) -> bool:
        """True once the lease could not be renewed: stop acting on its behalf."""
        return self._lost.is_set()

    async def wait_lost(self) -> None:
        """Return when the lease is lost."""
        await self._lost.wait()

    async def acquire(self) -> NamedLease:
        store = await self._store()
        record = await store.acquire_lease(self.name, owner=self.owner, ttl=self.ttl)
        if record.owner != self.owner:
            raise LeaseHeld(self.name, record.owner, record.expires_at)
        self.token, self.expires_at, self._held = record.token, record.expires_at, True
        self._renewer = asyncio.create_task(self._renew(store), name=f"conveyor-lease-{self.name}")
        return self

    async def _renew(self, store: LockStore) -> None:
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                expires = await store.renew_lease(self.name, token=self.token, ttl=self.ttl)
            except Exception:
                # The database may be briefly away: keep trying while the lease can still
                # be valid, and give it up before it could expire unnoticed.
                if time.monotonic() - renewed > self.ttl * 0.8:
                    self._lost.set()
                    return
                continue
            if expires is None:
                self._lost.set()
                return
            renewed, self.expires_at = time.monotonic(), expires

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        if self._held and not self.lost:
            await (await self._store()).release_lease(self.name, token=self.token)
        self._held = False

    async def __aenter__(self) -> NamedLease:
        return await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def __enter__(self) -> NamedLease:
        return blocking.run(self.acquire())

    def __exit__(self, *exc: object) -> None:
        blocking.run(self.release())
