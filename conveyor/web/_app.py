"""Building the API: options, state, middleware, the routes and the OpenAPI document."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI
from starlette.responses import Response

from conveyor.app.client import Conveyor
from conveyor.errors import ConfigurationError
from conveyor.web import _openapi
from conveyor.web._api import router
from conveyor.web._docs import install_docs, install_openapi_route
from conveyor.web._guards import LongPollLimits, SecurityHeaders
from conveyor.web._limits import BodyLimit
from conveyor.web._metrics import ApiMetrics, MetricsMiddleware
from conveyor.web._pages import CursorSigner
from conveyor.web._problems import install_handlers
from conveyor.web._shares import FairShare, Shares
from conveyor.web._waiters import JobWaiters


@dataclass(frozen=True, slots=True)
class ApiOptions:
    """Settings of the REST API, validated when built."""

    max_body_bytes: int = 1024 * 1024  # a request body over this is refused with 413
    max_depth: int = 32  # JSON nested deeper than this is refused with 422
    max_batch: int = 1000  # jobs in one list body
    max_wait: float = 60.0  # the longest ?wait= a long poll may ask for, in seconds
    wait_tick: float = 0.1  # how often the shared long-poll loop reads waited-for jobs
    title: str = "conveyor"
    dashboard: bool = True  # serve the dashboard at /ui (docs/dashboard.md)
    docs: bool = True  # serve Swagger UI at /docs (its assets from the package, no CDN)
    max_page_bytes: int = 4 * 1024 * 1024  # a page of jobs stops before this many bytes
    max_long_polls: int = 1000  # requests waiting at once for jobs to end (?wait=): 429 over
    max_long_polls_per_token: int = 20  # the same, per API token
    db_timeout: float = 0.5  # checking a token or health: 503 if the database is slower
    cursor_key: bytes | None = None  # signs list cursors; None: the database's own secret
    max_requests_per_tenant: int = 8  # requests of one tenant in progress at once: 429 over

    def __post_init__(self) -> None:
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ConfigurationError("max_body_bytes must be an integer of at least 1024")
        if not isinstance(self.max_depth, int) or not 2 <= self.max_depth <= 1000:
            raise ConfigurationError("max_depth must be between 2 and 1000")
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise ConfigurationError("max_batch must be at least 1")
        if not 0 < self.max_wait <= 3600:
            raise ConfigurationError("max_wait must be between 0 and 3600 seconds")
        if not 0.005 <= self.wait_tick <= 10:
            raise ConfigurationError("wait_tick must be between 0.005 and 10 seconds")
        if not isinstance(self.max_page_bytes, int) or self.max_page_bytes < 64 * 1024:
            raise ConfigurationError("max_page_bytes must be an integer of at least 65536")
        for name in ("max_long_polls", "max_long_polls_per_token", "max_requests_per_tenant"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigurationError(f"{name} must be an integer of at least 0")
        if not 0.05 <= self.db_timeout <= 60:
            raise ConfigurationError("db_timeout must be between 0.05 and 60 seconds")
        if self.cursor_key is not None and len(self.cursor_key) < 16:
            raise ConfigurationError("cursor_key must be at least 16 bytes")


@functools.cache
def _favicon_bytes() -> bytes:
    return resources.files("conveyor.web.ui").joinpath("static/favicon.ico").read_bytes()


async def favicon() -> Response:
    """The icon a browser asks every site for (the dashboard's, also at /ui/static)."""
    return Response(
        _favicon_bytes(),
        media_type="image/x-icon",
        headers={"Cache-Control": "public, max-age=86400"},
    )


def create_api(app: Conveyor, *, options: ApiOptions | None = None) -> FastAPI:
    """Return the REST API of ``app`` as an ASGI application (FastAPI).

    Serve it with ``conveyor serve`` or any ASGI server, or mount it in an application:
    ``main.mount("/conveyor", create_api(app))``; links and ``Location`` headers then
    carry the mount's prefix.
    """
    opts = options or ApiOptions()
    api = FastAPI(
        title=opts.title,
        version="1",
        summary="Submit durable background jobs and follow them to their end.",
        description=_openapi.DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # served below, behind a token
    )
    # The routes are module-level: everything they need of this API is in its state.
    api.state.conveyor = app
    api.state.options = opts
    api.state.waiters = JobWaiters(app, tick=opts.wait_tick)
    api.state.metrics = metrics = ApiMetrics()
    api.state.long_polls = LongPollLimits(
        total=opts.max_long_polls, per_token=opts.max_long_polls_per_token
    )
    api.state.cursors = CursorSigner(app, opts.cursor_key)
    install_handlers(api)
    api.add_middleware(BodyLimit, max_bytes=opts.max_body_bytes)
    api.state.shares = shares = Shares(opts.max_requests_per_tenant)
    api.add_middleware(FairShare, shares=shares)
    api.add_middleware(MetricsMiddleware, metrics=metrics)
    api.add_middleware(SecurityHeaders)
    api.include_router(router)
    api.add_api_route("/favicon.ico", favicon, methods=["GET"], include_in_schema=False)
    _openapi.install(api, app, opts)
    install_openapi_route(api)
    if opts.docs:
        install_docs(api)
    if opts.dashboard:
        from conveyor.web.ui import create_dashboard

        api.mount("/ui", create_dashboard(app), name="dashboard")
    return api
