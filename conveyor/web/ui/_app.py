"""Building the dashboard: options, state, templates and the error pages."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

from conveyor.app.client import Conveyor
from conveyor.errors import ConfigurationError, ConveyorError
from conveyor.store.protocol import MinuteStats, QueueInfo
from conveyor.web._pages import CursorSigner
from conveyor.web._problems import status_of
from conveyor.web.ui import _routes
from conveyor.web.ui._session import Sessions


@dataclass(frozen=True, slots=True)
class DashboardOptions:
    """Settings of the dashboard, validated when built."""

    session_ttl: float = 8 * 3600.0  # a session ends this many seconds after sign-in
    refresh: float = 2.0  # how often live parts of a page refresh, in seconds (0: never)
    page_size: int = 50  # jobs per page
    counts_max_age: float = 30.0  # the overview's jobs per queue and status: at most this old

    def __post_init__(self) -> None:
        if not 60 <= self.session_ttl <= 30 * 86_400:
            raise ConfigurationError("session_ttl must be between 60 seconds and 30 days")
        if not (self.refresh == 0 or 0.1 <= self.refresh <= 3600):
            raise ConfigurationError("refresh must be 0 (never) or between 0.1 and 3600 seconds")
        if not 0 <= self.counts_max_age <= 3600:
            raise ConfigurationError("counts_max_age must be between 0 and 3600 seconds")
        if not 1 <= self.page_size <= 1000:
            raise ConfigurationError("page_size must be between 1 and 1000")


def create_dashboard(app: Conveyor, *, options: DashboardOptions | None = None) -> FastAPI:
    """Return the dashboard of ``app`` as an ASGI application, to mount where it fits:
    ``main.mount("/ui", create_dashboard(app))`` (``conveyor serve`` mounts it at /ui)."""
    opts = options or DashboardOptions()
    ui = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    ui.state.conveyor = app
    ui.state.options = opts
    ui.state.sessions = Sessions(opts.session_ttl)
    ui.state.cursors = CursorSigner(app, None)
    ui.state.queue_counts = _routes.Cached[list[QueueInfo]](opts.counts_max_age)
    ui.state.day_stats = _routes.Cached[list[MinuteStats]](min(60.0, opts.counts_max_age))
    ui.mount("/static", StaticFiles(packages=[("conveyor.web.ui", "static")]), name="static")
    ui.include_router(_routes.router)

    async def on_conveyor(request: Request, exc: Exception) -> Response:
        return _routes.error_page(request, status_of(exc), str(exc))

    async def on_http(request: Request, exc: Exception) -> Response:
        code = exc.status_code if isinstance(exc, StarletteHTTPException) else 500
        detail = exc.detail if isinstance(exc, StarletteHTTPException) else "server error"
        return _routes.error_page(request, code, str(detail))

    async def on_sign_in(request: Request, exc: Exception) -> Response:
        return _routes.to_sign_in(request)

    ui.add_exception_handler(ConveyorError, on_conveyor)
    ui.add_exception_handler(StarletteHTTPException, on_http)
    ui.add_exception_handler(_routes.SignInFirst, on_sign_in)
    return ui
