"""A fair share of the server for every tenant: a cap on each one's requests in progress.

Every request that reaches the database takes a connection of one pool (ten by default),
first come, first served: one client's burst of hundreds of requests queued every other
tenant's behind it, past the token check's deadline (``db_timeout``), so they were answered
``503``. This middleware counts the requests in progress per *share* and answers ``429``
with ``Retry-After`` at once, before routing and before any query, to a request that would
take its share over ``max_requests_per_tenant``; the pool then always has room for the
others.

A request's share is read from its headers without the database:

- a bearer token this process has seen valid, with the same secret: its tenant's share
  (the tokens of one tenant share one);
- any other token (made up, mistyped, or not checked yet since this process started):
  one share for all of them, so a flood of invented tokens costs one share, not the pool;
- a dashboard session: its own share; no credentials at all: a share per client address.

The share decides only who waits; whether a token is valid is still checked on every
request against the database. Long polls (``?wait=``) have caps of their own and no share.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import Counter, OrderedDict

from starlette.types import ASGIApp, Receive, Scope, Send

from conveyor.core.auth import split_token
from conveyor.web._problems import PROBLEM_JSON, RETRY_AFTER, problem_body

_UNVERIFIED = "tokens not yet seen valid"
_REMEMBERED = 10_000  # tokens whose tenant is remembered; the least recently seen go first
_FREE_PATHS = ("/health/live",)  # answered without the database


class Shares:
    """The requests in progress per share, and the tokens this process has seen valid."""

    def __init__(self, per_share: int) -> None:
        self.per_share = per_share
        self.busy: Counter[str] = Counter()
        self._valid: OrderedDict[str, tuple[bytes, str]] = OrderedDict()

    def remember(self, presented: str, tenant: str) -> None:
        """Note a token that was just found valid, so its requests count to ``tenant``."""
        parts = split_token(presented)
        if parts is None:
            return
        token_id, secret = parts
        self._valid[token_id] = (_digest(secret), tenant)
        self._valid.move_to_end(token_id)
        while len(self._valid) > _REMEMBERED:
            self._valid.popitem(last=False)

    def share_of(self, scope: Scope) -> str:
        """The share a request counts to, from its headers alone."""
        authorization = cookie = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value
            elif name == b"cookie":
                cookie = value
        scheme, _, presented = authorization.decode("latin-1").partition(" ")
        if scheme.lower() == "bearer" and presented.strip():
            parts = split_token(presented.strip())
            known = self._valid.get(parts[0]) if parts else None
            if parts and known and hmac.compare_digest(known[0], _digest(parts[1])):
                return f"tenant {known[1]!r}"
            return _UNVERIFIED
        if cookie:
            return "session " + hashlib.sha256(cookie).hexdigest()[:16]
        client = scope.get("client")
        return f"client {client[0] if client else '?'}"


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class FairShare:
    """ASGI middleware: at most ``shares.per_share`` requests of one share in progress;
    beyond, ``429`` with ``Retry-After`` at once (0: no cap)."""

    def __init__(self, app: ASGIApp, shares: Shares) -> None:
        self.app = app
        self.shares = shares

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shares = self.shares
        if (
            scope["type"] != "http"
            or shares.per_share == 0
            or b"wait=" in scope.get("query_string", b"")
            or str(scope.get("path", "")).endswith(_FREE_PATHS)
        ):
            await self.app(scope, receive, send)
            return
        share = shares.share_of(scope)
        if shares.busy[share] >= shares.per_share:
            await _refuse(send, share, shares.per_share, str(scope.get("path", "")))
            return
        shares.busy[share] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            shares.busy[share] -= 1
            if shares.busy[share] == 0:
                del shares.busy[share]


async def _refuse(send: Send, share: str, most: int, path: str) -> None:
    detail = (
        f"too many requests at once from {share}: {most} are in progress, the most one "
        "tenant may have (conveyor serve --max-requests-per-tenant); send more once those "
        "are answered"
    )
    body = problem_body(429, detail, path)
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", RETRY_AFTER.encode()),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
