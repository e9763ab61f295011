"""Pages of jobs over HTTP: limited in bytes as well as in jobs, with signed cursors.

A page stops before ``max_page_bytes`` of JSON (always holding at least one job), and is
read from the database a few jobs at a time, so that a page of big jobs never sits in the
server's memory whole. Its ``next`` cursor is signed with a secret of the database
(HMAC-SHA256), so a client can only send back cursors this API handed out: a crafted one
is a 422 that says nothing about which jobs exist.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from conveyor.app.client import Conveyor
from conveyor.app.handles import JobPage, encode_cursor
from conveyor.errors import ConfigurationError
from conveyor.web._resource import job_resource
from conveyor.web._responses import jobs_prefix

_MAC_CHARS = 32  # base64url characters of the signature kept (192 bits)
_FIRST_CHUNK = 4  # jobs read first; later reads are sized by the bytes seen so far
_MAX_CHUNK = 200

Fetch = Callable[[str | None, int], Awaitable[JobPage]]


class CursorSigner:
    """Sign and check list cursors with a secret made by the database's migrations (or
    ``key``), so that every server of one database accepts the others' cursors."""

    def __init__(self, app: Conveyor, key: bytes | None) -> None:
        self.app = app
        self.key = key

    async def _key(self) -> bytes:
        if self.key is None:
            secret = await (await self.app.store()).server_secret("cursor")
            if secret is None:
                raise ConfigurationError("the database has no cursor secret: run its migrations")
            self.key = secret.encode()
        return self.key

    def _mac(self, key: bytes, scope: str, cursor: str) -> str:
        digest = hmac.new(key, f"{scope}\x00{cursor}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode()[:_MAC_CHARS]

    async def sign(self, cursor: str, scope: str) -> str:
        """``cursor``, signed for the tenant (or admin) ``scope``."""
        return f"{cursor}.{self._mac(await self._key(), scope, cursor)}"

    async def open(self, signed: str | None, scope: str) -> str | None:
        """The cursor inside ``signed``; ConfigurationError (422) unless this API signed it
        for ``scope``."""
        if signed is None:
            return None
        cursor, _, mac = signed.rpartition(".")
        expected = self._mac(await self._key(), scope, cursor)
        if not cursor or not hmac.compare_digest(mac.encode(), expected.encode()):
            raise ConfigurationError(
                "cursor is not one this server handed out: use the `next` of the previous "
                "page with the same token, or leave it out for the first page"
            )
        return cursor


async def page(
    request: Request, fetch: Fetch, *, cursor: str | None, limit: int, scope: str
) -> Response:
    """Answer a page of at most ``limit`` jobs and about ``max_page_bytes`` of JSON, read
    from ``fetch(cursor, n)`` a few jobs at a time; ``next`` and ``Link`` point on."""
    signer: CursorSigner = request.app.state.cursors
    budget: int = request.app.state.options.max_page_bytes
    prefix = jobs_prefix(request)
    parts: list[bytes] = []
    size = 0
    position = await signer.open(cursor, scope)
    following: str | None = None
    chunk = min(limit, _FIRST_CHUNK)
    while True:
        found = await fetch(position, chunk)
        for handle in found.jobs:
            body = json.dumps(job_resource(handle.record, prefix), separators=(",", ":"))
            encoded = body.encode()
            if parts and size + len(encoded) > budget:
                return await _answer(request, signer, parts, following, scope)
            parts.append(encoded)
            size += len(encoded)
            following = encode_cursor(handle.record)
        if found.next is None:
            return await _answer(request, signer, parts, None, scope)
        position = following = found.next
        if len(parts) >= limit:
            return await _answer(request, signer, parts, following, scope)
        average = max(1, size // len(parts))
        room = max(1, (budget - size) // average)
        chunk = max(1, min(limit - len(parts), room, _MAX_CHUNK))


async def _answer(
    request: Request, signer: CursorSigner, parts: list[bytes], cursor: str | None, scope: str
) -> Response:
    headers: dict[str, str] = {}
    following: Any = None
    if cursor is not None:
        signed = await signer.sign(cursor, scope)
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"]
        following = f"{request.url.path}?{urlencode([*query, ('cursor', signed)])}"
        headers["Link"] = f'<{following}>; rel="next"'
    body = b'{"jobs":[' + b",".join(parts) + b'],"next":' + json.dumps(following).encode() + b"}"
    parts.clear()
    return Response(body, media_type="application/json", headers=headers)
