"""``conveyor serve``: the REST API and the dashboard, under uvicorn."""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from conveyor.cli._common import (
    EXIT_USAGE,
    app_from,
    apply_tenant_limits,
    fail,
    log_format_option,
    run_command,
    setup_logging,
    tenant_limit_option,
    url_option,
)
from conveyor.errors import ConfigurationError

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor.app.client import Conveyor
    from conveyor.worker import WorkerOptions

# -- serve -----------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _limit_options(command: Callable[..., None]) -> Callable[..., None]:
    """The limits of ``conveyor serve``, each with its default (docs/security.md)."""
    limits = [
        ("--max-body", 1024 * 1024, int, "Largest request body, in bytes (413 above it)."),
        ("--max-page-bytes", 4 * 1024 * 1024, int, "A page of jobs stops before this many bytes."),
        ("--request-timeout", 10.0, float, "Seconds for a request's head and body to arrive."),
        ("--keep-alive-timeout", 5.0, float, "Seconds an idle kept-alive connection stays open."),
        ("--max-connections", 1000, int, "Open connections; more are closed (503 at the cap)."),
        ("--backlog", 512, int, "Connections the kernel queues before they are accepted."),
        ("--max-long-polls", 1000, int, "Requests waiting (?wait=) at once; 429 above it."),
        ("--max-long-polls-per-token", 20, int, "Requests waiting (?wait=) at once per token."),
        ("--db-timeout", 0.5, float, "Seconds to check a token or health; 503 when slower."),
        (
            "--max-requests-per-tenant",
            8,
            int,
            "Requests of one tenant in progress at once; 429 above it (0: no cap).",
        ),
    ]
    for flag, default, kind, text in reversed(limits):
        command = click.option(flag, default=default, type=kind, show_default=True, help=text)(
            command
        )
    command = click.option(
        "--forwarded-allow-ips",
        default=None,
        envvar="CONVEYOR_FORWARDED_ALLOW_IPS",
        help="Comma-separated addresses of reverse proxies whose X-Forwarded-For/-Proto are "
        "believed ('*': any). Default: none, the headers are ignored.",
    )(command)
    return click.option(
        "--docs/--no-docs", default=True, show_default=True, help="Serve Swagger UI at /docs."
    )(command)


@click.command()
@click.argument("app_spec", metavar="APP", envvar="CONVEYOR_APP")
@url_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="CONVEYOR_HOST",
    help="Address to listen on (env CONVEYOR_HOST).",
)
@click.option(
    "--port",
    default=8000,
    show_default=True,
    type=int,
    envvar="CONVEYOR_PORT",
    help="Port to listen on (env CONVEYOR_PORT).",
)
@click.option(
    "--with-worker", is_flag=True, help="Also run a worker in this process, on the same event loop."
)
@click.option(
    "--concurrency",
    "-c",
    default=10,
    show_default=True,
    help="With --with-worker: jobs run at once.",
)
@_limit_options
@log_format_option
@tenant_limit_option
def serve(
    app_spec: str,
    database_url: str | None,
    host: str,
    port: int,
    with_worker: bool,
    concurrency: int,
    log_format: str,
    tenant_limits: tuple[str, ...],
    **limits: Any,
) -> None:
    """Serve APP's REST API (docs at /docs, OpenAPI at /openapi.json) and dashboard (/ui/).

    Every route but /health needs a bearer token (/docs asks for one). Bound to an
    address other than loopback, serve refuses to start until a token exists (conveyor
    tokens create); on loopback with no token it creates an admin token and prints it
    once. The limits below keep hostile clients from exhausting the server (see
    docs/security.md). SIGTERM or SIGINT stops the server, then the worker hands its
    running jobs back.
    """
    from conveyor.worker import WorkerOptions

    try:
        from conveyor.web import ApiOptions, create_api
        from conveyor.web._server import ServerLimits
    except ImportError as exc:
        fail(
            f"serve needs the web extra ({exc.name} is not installed): {_web_extra_hint()}",
            EXIT_USAGE,
        )
    _check_port(host, port)
    app = app_from(app_spec, database_url)
    apply_tenant_limits(app, tenant_limits)
    setup_logging(logging.getLogger().level, log_format)
    try:
        server_limits = ServerLimits(
            request_timeout=limits["request_timeout"],
            keep_alive=limits["keep_alive_timeout"],
            max_connections=limits["max_connections"],
            backlog=limits["backlog"],
            forwarded_allow_ips=limits["forwarded_allow_ips"],
        )
        api_options = ApiOptions(
            max_body_bytes=limits["max_body"],
            max_page_bytes=limits["max_page_bytes"],
            max_long_polls=limits["max_long_polls"],
            max_long_polls_per_token=limits["max_long_polls_per_token"],
            db_timeout=limits["db_timeout"],
            max_requests_per_tenant=limits["max_requests_per_tenant"],
            docs=limits["docs"],
        )
        api = create_api(app, options=api_options)
        options = WorkerOptions(concurrency=concurrency) if with_worker else None
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)
    run_command(_serve(app, api, host, port, options, server_limits))


def _check_port(host: str, port: int) -> None:
    """Refuse a port another process listens on, before anything starts (exit 2)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        fail(f"cannot listen on {host!r}: {exc.strerror}; check --host", EXIT_USAGE)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As uvicorn binds: SO_REUSEADDR, so a port in TIME_WAIT is not taken for busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                fail(
                    f"port {port} is in use on {host} (another `conveyor serve`?); "
                    "stop it or choose another --port",
                    EXIT_USAGE,
                )
            fail(f"cannot listen on {host}:{port}: {exc.strerror}", EXIT_USAGE)


async def _serve(
    app: Conveyor,
    api: Any,
    host: str,
    port: int,
    worker_options: WorkerOptions | None,
    limits: Any,
) -> None:
    import asyncio

    import uvicorn

    from conveyor.cli._console import console, err_console
    from conveyor.web._server import GuardedConfig

    if not [t for t in await app.list_tokens() if t.active]:
        if not _is_loopback(host):
            fail(
                f"refusing to serve on {host} with no API token: anyone who can reach it "
                "could act on every job. Create one first (conveyor tokens create --tenant T "
                "--role admin), or bind to 127.0.0.1",
                EXIT_USAGE,
            )
        token, secret = await app.create_token(
            tenant="default", role="admin", name="created by conveyor serve on loopback"
        )
        err_console.print(
            f"no API token existed: created admin token {token.id} (tenant 'default'). "
            "It is shown this once:"
        )
        console.print(secret, highlight=False)
        console.file.flush()
    # log_config=None: uvicorn's lines go through the handlers set up above.
    config = GuardedConfig(
        api, limits=limits, host=host, port=port, lifespan="off", log_level="info", log_config=None
    )
    server = uvicorn.Server(config)
    running: asyncio.Task[None] | None = None
    if worker_options is not None:
        worker_ = app.worker(worker_options)
        running = asyncio.create_task(worker_.run(), name="conveyor-worker")
    try:
        await server.serve()
    finally:
        if running is not None:
            worker_.stop()
            await running
        await app.close()


def _web_extra_hint() -> str:
    """How to install the web extra: conveyor is not on PyPI, so from the clone it came
    from (named when this copy is an editable install of one)."""
    import conveyor

    clone = Path(conveyor.__file__).resolve().parent.parent
    where = str(clone) if (clone / "pyproject.toml").is_file() else "/path/to/conveyor"
    return (
        f'conveyor is not on PyPI: install the extra from its clone, pip install "{where}[web]"'
        " (README.md, Install)"
    )
