"""Guards of the API against hostile or careless clients: security headers on every answer,
caps on long polls, and a deadline on reaching the database."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conveyor.errors import DatabaseUnavailable
from conveyor.web._problems import RETRY_AFTER, ProblemError

T = TypeVar("T")

_API_POLICY = b"default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
# Pages (the dashboard, /docs) load their scripts and styles from this server only.
_PAGE_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    b"img-src 'self' data:; font-src 'self'; connect-src 'self'; frame-ancestors 'none'; "
    b"base-uri 'none'; form-action 'self'"
)
_COMMON = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]
_HSTS = (b"strict-transport-security", b"max-age=31536000")


class SecurityHeaders:
    """ASGI middleware: every answer says not to sniff, frame or leak its address, and
    carries a content security policy (a strict one for JSON, one for the pages)."""

    def __init__(self, app: ASGIApp, pages: tuple[str, ...] = ("/ui", "/docs")) -> None:
        self.app = app
        self.pages = pages

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))[len(str(scope.get("root_path", ""))) :]
        page = any(path == p or path.startswith(p + "/") for p in self.pages)
        policy = _PAGE_POLICY if page else _API_POLICY
        https = scope.get("scheme") == "https"

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                extra = [*_COMMON, (b"content-security-policy", policy)]
                if https:
                    extra.append(_HSTS)
                headers.extend(h for h in extra if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


class LongPollLimits:
    """Caps on the requests waiting at once for a job to end: per token, and in all."""

    def __init__(self, *, total: int, per_token: int) -> None:
        self.total = total
        self.per_token = per_token
        self.waiting: Counter[str] = Counter()

    @asynccontextmanager
    async def slot(self, token_id: str) -> AsyncIterator[None]:
        """Hold a long-poll slot of ``token_id`` while waiting; 429 when none is free."""
        if self.waiting[token_id] >= self.per_token:
            raise ProblemError(
                429,
                f"this token already has {self.per_token} requests waiting for jobs to end "
                "(?wait=); wait for one of them to answer, or poll without ?wait",
                headers={"Retry-After": RETRY_AFTER},
            )
        if self.waiting.total() >= self.total:
            raise ProblemError(
                429,
                f"the server already has {self.total} requests waiting for jobs to end "
                "(?wait=); try again shortly, or poll without ?wait",
                headers={"Retry-After": RETRY_AFTER},
            )
        self.waiting[token_id] += 1
        try:
            yield
        finally:
            self.waiting[token_id] -= 1
            if self.waiting[token_id] <= 0:
                del self.waiting[token_id]


async def within(seconds: float, work: Awaitable[T], what: str) -> T:
    """Await a read of the database for at most ``seconds``; DatabaseUnavailable after.

    Only reads go through here: cancelling one changes nothing stored.
    """
    try:
        async with asyncio.timeout(seconds):
            return await work
    except TimeoutError:
        raise DatabaseUnavailable(
            f"the database did not answer {what} within {seconds:g}s: it is down, "
            "unreachable or overloaded; try again shortly"
        ) from None
