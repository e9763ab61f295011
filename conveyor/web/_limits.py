"""Refuse request bodies over a size limit while reading them, before they fill memory."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.web._problems import ProblemError, send_problem


class BodyTooLarge(ProblemError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is over the limit of {limit} bytes: send less (submit large "
            "inputs by reference, e.g. a URL or a path, not inline)",
        )


class BodyLimit:
    """ASGI middleware: a declared ``Content-Length`` over the limit is refused before any
    byte is read, and a body that grows past it while streaming is cut off at the limit."""

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
                    detail = BodyTooLarge(self.max_bytes).detail
                    await send_problem(send, 413, detail, scope.get("path"))
                    return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited, send)
