"""Refuse request bodies over a size limit while reading them, before they fill memory."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.web._problems import ProblemError, send_problem

# After refusing a body, the rest of it is read and thrown away (never kept) up to this
# many bytes, so that the client, still sending, gets to read the 413 rather than a reset
# connection. A client that announces more than this is answered at once.
_DRAIN_LIMIT = 64 * 1024 * 1024


class BodyTooLarge(ProblemError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is over the limit of {limit} bytes: send less (submit large "
            "inputs by reference, e.g. a URL or a path, not inline)",
        )


class BodyLimit:
    """ASGI middleware: a declared ``Content-Length`` over the limit is refused before the
    body is used, and a body that grows past it while streaming is cut off at the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    if declared <= _DRAIN_LIMIT:
                        await _drain(receive, 0)
                    detail = BodyTooLarge(self.max_bytes).detail
                    await send_problem(send, 413, detail, scope.get("path"))
                    return
        received = 0
        more = True
        exceeded = False

        async def limited() -> Message:
            nonlocal received, more, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                more = bool(message.get("more_body", False))
                if received > self.max_bytes:
                    exceeded = True
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def sending(message: Message) -> None:
            nonlocal more
            if message["type"] == "http.response.start" and exceeded and more:
                more = False
                await _drain(receive, received)
            await send(message)

        await self.app(scope, limited, sending)


async def _drain(receive: Receive, already: int) -> None:
    """Read and discard the rest of a request body, up to the drain limit."""
    total = already
    while total <= _DRAIN_LIMIT:
        message = await receive()
        if message["type"] != "http.request":
            return
        total += len(message.get("body", b""))
        if not message.get("more_body", False):
            return
