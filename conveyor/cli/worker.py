"""``conveyor worker``: run a worker for an application."""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING

import click

from conveyor.cli._common import (
    DURATION,
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
    from conveyor.worker import Worker


@click.command()
@click.argument("app_spec", metavar="APP", envvar="CONVEYOR_APP")
@url_option
@click.option(
    "--concurrency",
    "-c",
    default=100,
    show_default=True,
    help="Jobs run at once (sync handlers: one thread each); lower it for CPU-heavy handlers.",
)
@click.option(
    "--queues",
    "-q",
    default=None,
    help="Comma-separated queues (default: those of the app's job types).",
)
@click.option(
    "--lease",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Lease length (e.g. 30s, 2m): a job whose worker is silent this long is rescued.",
)
@click.option(
    "--grace",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Time running jobs get to finish on SIGTERM.",
)
@click.option(
    "--cancel-grace",
    type=DURATION,
    default="5s",
    show_default=True,
    help="Time a cancelled handler gets before it is abandoned.",
)
@click.option(
    "--poll-interval",
    type=DURATION,
    default="1s",
    show_default=True,
    help="Time between polls when no wake-up arrives.",
)
@click.option(
    "--rescue-interval",
    type=DURATION,
    default="5s",
    show_default=True,
    help="Time between rescues of expired leases.",
)
@click.option(
    "--cron-interval",
    type=DURATION,
    default="1s",
    show_default=True,
    help="Longest wait between checks for due schedule ticks (workers also wake at each tick).",
)
@click.option(
    "--prune-interval",
    type=DURATION,
    default="60s",
    show_default=True,
    help="Time between prunes of finished jobs past their retention.",
)
@click.option(
    "--forget-after",
    type=DURATION,
    default="1h",
    show_default=True,
    help="A worker silent this long (dead or stopped) is forgotten by the registry; "
    "health counts a dead worker only until then. Longer than --lease.",
)
@click.option("--burst", is_flag=True, help="Exit when no job is due.")
@log_format_option
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve this worker's Prometheus metrics on this port (0: any free port, logged).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics port binds to.",
)
@click.option(
    "--metrics/--no-metrics",
    "count_metrics",
    default=True,
    hidden=True,
    help="Count attempts into metrics (off only to measure what counting costs).",
)
@tenant_limit_option
def worker(
    app_spec: str,
    database_url: str | None,
    concurrency: int,
    queues: str | None,
    lease: float,
    grace: float,
    cancel_grace: float,
    poll_interval: float,
    rescue_interval: float,
    cron_interval: float,
    prune_interval: float,
    forget_after: float,
    burst: bool,
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    count_metrics: bool,
    tenant_limits: tuple[str, ...],
) -> None:
    """Run a worker for APP (module:attribute) until SIGTERM or SIGINT.

    The first signal stops claiming and lets running jobs finish within the grace
    period, then hands the rest back as queued; a second signal stops at once (their
    leases then expire and other workers rescue them).
    """
    import gc

    # Start-up makes objects that live as long as the process (the application and its
    # imports): the collector's passes over them as they are made are wasted, so it stays
    # off until they are frozen out of its scans (_settle_garbage_collector turns it on).
    collecting = gc.isenabled()
    gc.disable()
    try:
        from conveyor.worker import WorkerOptions

        app = app_from(app_spec, database_url)
        apply_tenant_limits(app, tenant_limits)
        try:
            options = WorkerOptions(
                concurrency=concurrency,
                queues=tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None,
                lease=lease,
                grace=grace,
                cancel_grace=cancel_grace,
                poll_interval=poll_interval,
                rescue_interval=rescue_interval,
                cron_interval=cron_interval,
                prune_interval=prune_interval,
                forget_after=forget_after,
                burst=burst,
                metrics=count_metrics,
            )
        except ConfigurationError as exc:
            fail(str(exc), EXIT_USAGE)
        setup_logging(logging.getLogger().level, log_format)
        if metrics_port is not None:
            _serve_metrics(app, metrics_host, metrics_port)
        run_command(_run_worker(app.worker(options), collecting))
    finally:
        if collecting:
            gc.enable()


def _serve_metrics(app: Conveyor, host: str, port: int) -> None:
    """Serve the application's metrics from a thread (each worker process its own)."""
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=host, registry=app.metrics.registry)
    except OSError as exc:
        fail(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}", EXIT_USAGE)
    bound = server.server_address[1]
    logging.getLogger("conveyor.worker").info("metrics at http://%s:%d/metrics", host, bound)


async def _run_worker(w: Worker, collecting: bool) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            w.stop()
        else:
            from conveyor.cli._console import err_console

            err_console.print(
                f"{signal.Signals(signum).name} again: stopping now; running jobs will be "
                "rescued when their leases expire"
            )
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    _settle_garbage_collector(collecting)
    await w.run()


def _settle_garbage_collector(collecting: bool) -> None:
    """Leave what start-up made (the application, its imports) out of the collector's
    scans: the worker process is ours.

    A draining worker allocates a few objects per job (its task, its run, its settlement)
    and holds up to ``--concurrency`` jobs' worth alive, so its young objects keep being
    promoted and the full collections that follow walked every object the imports made
    as well, each time.

    No collection first: a full collection of all that start-up made took 15-20 ms of the
    time to the first claim, to free what start-up left unreachable (with the collector
    off while it loads, about 780 objects, 190 kB, for an application on PostgreSQL),
    which is frozen with the rest instead. The collector was off during start-up
    (``worker``); from here it is on again if it was on before (``collecting``).
    """
    import gc

    gc.freeze()
    if collecting:
        gc.enable()
