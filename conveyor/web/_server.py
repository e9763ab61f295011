"""The HTTP server of ``conveyor serve``: uvicorn with the limits a public server needs.

uvicorn times a connection out only between two requests (its keep-alive timeout): a
client that connects and sends nothing, or trickles a request's head or body a byte at a
time, keeps its connection (and a file descriptor) for ever. :class:`GuardedH11` adds a
deadline to every request: from its first byte (or from the connection's start) the whole
request, head and body, must arrive within ``request_timeout`` seconds, or the connection
is closed. Connections beyond ``max_connections`` are closed as soon as they are accepted.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from conveyor.errors import ConfigurationError

log = logging.getLogger("conveyor.web")


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """Connection limits of ``conveyor serve`` (docs/security.md lists them)."""

    request_timeout: float = 10.0  # a request's head and body must arrive within this
    keep_alive: float = 5.0  # an idle kept-alive connection is closed after this
    max_connections: int = 1000  # open connections; more are closed when accepted
    max_header_bytes: int = 16 * 1024  # a request head larger than this is a 400
    backlog: int = 512  # connections the kernel queues before they are accepted
    forwarded_allow_ips: str | None = None  # trust X-Forwarded-* from these addresses

    def __post_init__(self) -> None:
        if not 0.5 <= self.request_timeout <= 3600:
            raise ConfigurationError("request timeout must be between 0.5 and 3600 seconds")
        if not 0.1 <= self.keep_alive <= 3600:
            raise ConfigurationError("keep-alive timeout must be between 0.1 and 3600 seconds")
        if not 1 <= self.max_connections <= 1_000_000:
            raise ConfigurationError("max connections must be between 1 and 1000000")
        if not 1024 <= self.max_header_bytes <= 1024 * 1024:
            raise ConfigurationError("max header bytes must be between 1024 and 1048576")
        if not 1 <= self.backlog <= 65535:
            raise ConfigurationError("backlog must be between 1 and 65535")


class GuardedConfig(uvicorn.Config):
    """uvicorn's configuration, carrying the limits :class:`GuardedH11` enforces."""

    def __init__(self, app: Any, *, limits: ServerLimits, **kwargs: Any) -> None:
        self.limits = limits
        trusted = limits.forwarded_allow_ips
        super().__init__(
            app,
            http=GuardedH11,
            timeout_keep_alive=max(1, round(limits.keep_alive)),
            # Connections over the cap are closed when accepted (GuardedH11): every open
            # one is served, so uvicorn's own cap (503 to all at the cap) stays off.
            backlog=limits.backlog,
            h11_max_incomplete_event_size=limits.max_header_bytes,
            # X-Forwarded-For/-Proto are believed only from the proxies named.
            proxy_headers=trusted is not None,
            forwarded_allow_ips=trusted or "",
            server_header=False,
            **kwargs,
        )
        self.timeout_keep_alive = limits.keep_alive  # type: ignore[assignment]


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request, and a cap on
    connections."""

    def __init__(self, config: uvicorn.Config, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        limits = getattr(config, "limits", None) or ServerLimits()
        self.request_timeout = limits.request_timeout
        self.max_connections = limits.max_connections
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            log.warning("over %d open connections: closing a new one", self.max_connections)
            self.transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        self._check()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._check()

    def _check(self) -> None:
        """Keep the deadline while a request is still arriving; drop it once it is in."""
        state = self.conn.their_state
        if state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
            self._disarm()
        elif state is h11.IDLE and self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # answering; the next request's deadline starts with its byte

    def _arm(self) -> None:
        self._disarm()
        self.deadline = self.loop.call_later(self.request_timeout, self._expired)

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _expired(self) -> None:
        self.deadline = None
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state in (h11.IDLE, h11.SEND_BODY):
            log.info(
                "closing a connection from %s: no whole request within %gs",
                self.client[0] if self.client else "?",
                self.request_timeout,
            )
            self.transport.close()
