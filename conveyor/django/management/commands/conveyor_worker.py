"""``python manage.py conveyor_worker``: run Django's tasks with conveyor's worker.

Takes the options of ``conveyor worker``. The tasks are found by module path: the
worker imports each installed app's ``tasks`` module and the modules listed in the
backend's ``OPTIONS["TASK_MODULES"]``, and each task they define is a job type it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.tasks import task_backends
from django.tasks.exceptions import InvalidTaskBackend
from django.utils.module_loading import autodiscover_modules

import conveyor
from conveyor.core.durations import seconds

log = logging.getLogger("conveyor.worker")


def _duration(text: str) -> float:
    try:
        return seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = (
        "Run conveyor's worker for Django's tasks until SIGTERM or SIGINT: the first signal "
        "stops claiming and lets running tasks finish within --grace, a second stops at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend", default="default", help="The TASKS alias to run (default: default)."
        )
        parser.add_argument(
            "--queues",
            "-q",
            default=None,
            help="Comma-separated queues (default: the backend's QUEUES).",
        )
        parser.add_argument(
            "--concurrency",
            "-c",
            type=int,
            default=100,
            help="Tasks run at once (sync tasks: one thread each; default 100).",
        )
        for name, default, text in (
            ("lease", "30s", "Lease length: a task whose worker is silent this long is rescued."),
            ("grace", "30s", "Time running tasks get to finish on SIGTERM."),
            ("cancel-grace", "5s", "Time a cancelled task gets before it is abandoned."),
            ("poll-interval", "1s", "Time between polls when no wake-up arrives."),
            ("rescue-interval", "5s", "Time between rescues of expired leases."),
            ("prune-interval", "60s", "Time between prunes of finished jobs past retention."),
        ):
            parser.add_argument(
                f"--{name}", type=_duration, default=default, help=f"{text} (default {default})"
            )
        parser.add_argument("--burst", action="store_true", help="Exit when no task is due.")
        parser.add_argument(
            "--log-format",
            choices=("text", "json"),
            default=os.environ.get("CONVEYOR_LOG_FORMAT", "text"),
            help="Log lines as text, or one JSON object per line (env CONVEYOR_LOG_FORMAT).",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="Serve this worker's Prometheus metrics on this port (0: any free port).",
        )
        parser.add_argument(
            "--metrics-host", default="127.0.0.1", help="Address the metrics port binds to."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from conveyor.django.backend import ConveyorBackend
        from conveyor.observe import logs

        try:
            backend = task_backends[options["backend"]]
        except InvalidTaskBackend as exc:
            raise CommandError(str(exc)) from None
        if not isinstance(backend, ConveyorBackend):
            raise CommandError(
                f"TASKS[{options['backend']!r}] is {type(backend).__module__}."
                f"{type(backend).__name__}, not conveyor.django.ConveyorBackend"
            )
        autodiscover_modules("tasks")
        for module in backend.task_modules:
            __import__(module)
        queues = options["queues"]
        try:
            worker_options = conveyor.WorkerOptions(
                concurrency=options["concurrency"],
                queues=tuple(q.strip() for q in queues.split(",") if q.strip())
                if queues
                else tuple(sorted(backend.queues)),
                lease=options["lease"],
                grace=options["grace"],
                cancel_grace=options["cancel_grace"],
                poll_interval=options["poll_interval"],
                rescue_interval=options["rescue_interval"],
                prune_interval=options["prune_interval"],
                burst=options["burst"],
            )
        except conveyor.ConfigurationError as exc:
            raise CommandError(str(exc)) from None
        unknown = set(worker_options.queues or ()) - set(backend.queues)
        if unknown:
            raise CommandError(
                f"queues {sorted(unknown)} are not in TASKS[{backend.alias!r}]['QUEUES'] "
                f"({sorted(backend.queues)}): no task can be enqueued there"
            )
        app = backend.app
        logs.configure(
            logging.INFO if options["verbosity"] < 2 else logging.DEBUG, options["log_format"]
        )
        if options["metrics_port"] is not None:
            _serve_metrics(app, options["metrics_host"], options["metrics_port"])
        log.info("tasks: %s", ", ".join(app.registry.names()) or "none found")
        asyncio.run(_run(app.worker(worker_options)))


def _serve_metrics(app: Any, host: str, port: int) -> None:
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=host, registry=app.metrics.registry)
    except OSError as exc:
        raise CommandError(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from None
    log.info("metrics at http://%s:%d/metrics", host, server.server_address[1])


async def _run(worker: conveyor.Worker) -> None:
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            worker.stop()
        else:
            log.warning(
                "%s again: stopping now; running tasks are rescued when their leases expire",
                signal.Signals(signum).name,
            )
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await worker.run()
