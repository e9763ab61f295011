"""Building the API: options, state, middleware, the routes and the OpenAPI document."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import FastAPI

from conveyor.client import Conveyor
from conveyor.errors import ConfigurationError
from conveyor.web import _openapi
from conveyor.web._api import router
from conveyor.web._limits import BodyLimit
from conveyor.web._metrics import ApiMetrics, MetricsMiddleware
from conveyor.web._problems import install_handlers
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
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    # The routes are module-level: everything they need of this API is in its state.
    api.state.conveyor = app
    api.state.options = opts
    api.state.waiters = JobWaiters(app, tick=opts.wait_tick)
    api.state.metrics = metrics = ApiMetrics()
    install_handlers(api)
    api.add_middleware(BodyLimit, max_bytes=opts.max_body_bytes)
    api.add_middleware(MetricsMiddleware, metrics=metrics)
    api.include_router(router)
    _openapi.install(api, app, opts)
    if opts.dashboard:
        from conveyor.web.ui import create_dashboard

        api.mount("/ui", create_dashboard(app), name="dashboard")
    return api
