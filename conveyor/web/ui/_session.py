"""Dashboard sessions: an API token exchanged for a cookie, and the CSRF and Origin checks.

A session keeps the token it was opened with and authenticates it again on every request,
so a revoked token ends its sessions at once. Sessions live in the serving process's
memory: a restart signs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "conveyor_session"


@dataclass(slots=True)
class Session:
    id: str
    token: str  # the API token signed in with; authenticated again on each request
    csrf: str  # sent back in every form
    expires: float  # time.monotonic() after which the session is over
    flash: list[str] = field(default_factory=list)  # messages for the next page shown


class Sessions:
    """The open sessions of one dashboard."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._open: dict[str, Session] = {}

    def open(self, token: str) -> Session:
        self._sweep()
        session = Session(
            id=secrets.token_urlsafe(32),
            token=token,
            csrf=secrets.token_urlsafe(32),
            expires=time.monotonic() + self.ttl,
        )
        self._open[session.id] = session
        return session

    def find(self, session_id: str | None) -> Session | None:
        session = self._open.get(session_id or "")
        if session is None:
            return None
        if session.expires <= time.monotonic():
            del self._open[session.id]
            return None
        return session

    def close(self, session_id: str | None) -> None:
        self._open.pop(session_id or "", None)

    def _sweep(self) -> None:
        now = time.monotonic()
        for sid in [sid for sid, s in self._open.items() if s.expires <= now]:
            del self._open[sid]


def base_path(request: Request) -> str:
    """Where the dashboard is mounted ("/ui" under ``conveyor serve``)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def set_cookie(request: Request, response: Response, session: Session, ttl: float) -> None:
    response.set_cookie(
        COOKIE,
        session.id,
        max_age=int(ttl),
        path=base_path(request) or "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        COOKIE,
        path=base_path(request) or "/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def same_origin(request: Request) -> bool:
    """Whether a POST comes from a page of this dashboard: its Origin (or, lacking one,
    its Referer) is this server's own. A POST that says neither is refused."""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    origin = request.headers.get("origin")
    if origin is not None:
        return origin == own
    referer = request.headers.get("referer")
    return referer is not None and (referer == own or referer.startswith(own + "/"))


def csrf_ok(session: Session, sent: str | None) -> bool:
    return sent is not None and hmac.compare_digest(session.csrf.encode(), sent.encode())
