"""The ``conveyor`` command line.

Settings come from flags, then ``CONVEYOR_*`` environment variables (``CONVEYOR_APP``,
``CONVEYOR_DATABASE_URL``). ``APP`` is ``module:attribute`` naming a
:class:`~conveyor.Conveyor`.

Exit codes: 0 success; 1 the job ended failed or cancelled (``submit --wait``) or a
job action was refused; 2 usage or configuration error; 3 job not found; 4 database
unavailable; 130 interrupted (Ctrl-C) while waiting for a job, which keeps running.

Read commands take ``--json`` for scripts. Durations are written as the Python API takes
them: ``30`` (seconds), ``500ms``, ``2s``, ``15m``, ``1h30m``.
"""

from __future__ import annotations

import errno
import functools
import importlib
import importlib.util
import inspect
import ipaddress
import json
import logging
import os
import signal
import socket
import sys
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

import click
from click.core import ParameterSource

from conveyor.core.durations import seconds
from conveyor.core.ids import check_job_id
from conveyor.core.lifecycle import Status
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidDependency,
    InvalidPayload,
    JobNotFound,
    ScheduleNotFound,
    TokenNotFound,
    UnknownJobType,
)

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor._console import ShownJob
    from conveyor.client import Conveyor, Health
    from conveyor.core.auth import Token
    from conveyor.core.model import Attempt
    from conveyor.store import QueueInfo
    from conveyor.worker import Worker, WorkerOptions

T = TypeVar("T")

EXIT_JOB_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_UNAVAILABLE = 4
EXIT_INTERRUPTED = 130

# The status words the tables print that are not stored statuses: a queued job due later.
SHOWN_STATUSES = ("scheduled", "retrying")


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration as the Python API takes it: seconds, or ``500ms``, ``2s``, ``15m``, ``1h30m``."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            return seconds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()

# Where the database URL came from, so that messages name what the user typed.
_url_source = {"flag": False}


def _fail(message: str, code: int) -> NoReturn:
    from rich.text import Text

    from conveyor._console import err_console

    if _url_source["flag"]:
        message = message.replace("CONVEYOR_DATABASE_URL", "--database-url")
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
    sys.exit(code)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine, turning conveyor's errors into messages and exit codes."""
    import asyncio

    try:
        return asyncio.run(coro)
    except (JobNotFound, ScheduleNotFound) as exc:
        _fail(str(exc), EXIT_NOT_FOUND)
    except DatabaseUnavailable as exc:
        _fail(str(exc), EXIT_UNAVAILABLE)
    except (
        ConfigurationError,
        UnknownJobType,
        InvalidPayload,
        InvalidDependency,
        IdempotencyConflict,
    ) as exc:
        _fail(str(exc), EXIT_USAGE)
    except ConveyorError as exc:
        _fail(str(exc), EXIT_JOB_FAILED)


def load_app(spec: str) -> Conveyor:
    """Import ``module:attribute`` and return the Conveyor it names."""
    from conveyor.client import Conveyor

    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise click.BadParameter(
            f"{spec!r} is not of the form module:attribute (e.g. myproject.jobs:app)",
            param_hint="APP",
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(module_name) is not None
    except ModuleNotFoundError as exc:  # a parent package is missing...
        found = not module_name.startswith(exc.name or "")
    except Exception:  # ...or found, and its own import fails: shown below
        found = True
    if not found:
        raise click.BadParameter(
            f"cannot find module {module_name!r}; run from the folder that contains it "
            "or add it to PYTHONPATH",
            param_hint="APP",
        )
    try:
        module = importlib.import_module(module_name)
    except ConveyorError as exc:
        _fail(f"importing {module_name!r} failed: {exc}", EXIT_USAGE)
    except Exception as exc:
        # The module exists; its own code (or a dependency it imports) failed.
        from conveyor._console import err_console

        err_console.print(
            "".join(traceback.format_exception(exc)), markup=False, highlight=False, end=""
        )
        _fail(
            f"module {module_name!r} was found but importing it failed: "
            f"{type(exc).__name__}: {exc} (traceback above)",
            EXIT_USAGE,
        )
    app = getattr(module, attribute, None)
    if not isinstance(app, Conveyor):
        instances = sorted(k for k, v in vars(module).items() if isinstance(v, Conveyor))
        there = ", ".join(instances) if instances else "none"
        what = (
            f"has no attribute {attribute!r}"
            if not hasattr(module, attribute)
            else f"has {attribute!r}, a {type(app).__name__}, not a conveyor.Conveyor"
        )
        raise click.BadParameter(
            f"module {module_name!r} {what} (Conveyor instances there: {there})",
            param_hint="APP",
        )
    return app


def _app_from(
    app_spec: str | None, database_url: str | None, *, must_exist: bool = False
) -> Conveyor:
    """The application given --app (on --database-url if given), else one on the URL alone.

    ``must_exist``: a read command on a SQLite file that does not exist says so and
    creates nothing (a typo in a path would otherwise show an empty new database).
    """
    from conveyor.client import Conveyor
    from conveyor.store import sqlite_path

    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source("database_url") if ctx is not None else None
    _url_source["flag"] = bool(database_url) and source is click.core.ParameterSource.COMMANDLINE
    try:
        if app_spec:
            app = load_app(app_spec)
            if database_url:
                app.use_database(database_url)
        else:
            app = Conveyor(database_url)
        path = sqlite_path(app.url) if must_exist else None
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)
    if path is not None and not os.path.exists(path):
        _fail(
            f"no database at {os.path.abspath(path)} ({app.url}): check the path in "
            "CONVEYOR_DATABASE_URL; nothing was created. A new database is made by "
            "`conveyor migrate` or by the first worker",
            EXIT_USAGE,
        )
    return app


_app_option = click.option(
    "--app",
    "app_spec",
    envvar="CONVEYOR_APP",
    metavar="MODULE:ATTR",
    help="Application whose job types to use (env CONVEYOR_APP).",
)
_server_option = click.option(
    "--url",
    "server_url",
    envvar="CONVEYOR_URL",
    metavar="URL",
    help="Act through a conveyor server's API, e.g. http://host:8000 (env CONVEYOR_URL), "
    "instead of the database.",
)
_token_option = click.option(
    "--token",
    envvar="CONVEYOR_TOKEN",
    metavar="TOKEN",
    help="API token for --url, better given as env CONVEYOR_TOKEN or --token-file: on the "
    "command line it is visible to other users of the machine (ps, shell history).",
)
_token_file_option = click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=str),
    envvar="CONVEYOR_TOKEN_FILE",
    help="Read the API token for --url from this file (env CONVEYOR_TOKEN_FILE).",
)


def _resolve_token(token: str | None, token_file: str | None) -> str | None:
    """The API token from --token-file, CONVEYOR_TOKEN or --token (warned about: argv is
    visible to every user of the machine)."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as exc:
            _fail(f"cannot read --token-file {token_file!r}: {exc.strerror}", EXIT_USAGE)
        if not text:
            _fail(f"--token-file {token_file!r} is empty: put the API token in it", EXIT_USAGE)
        return text
    context = click.get_current_context(silent=True)
    if token and context is not None:
        from conveyor._console import err_console

        source = context.get_parameter_source("token")
        if source is ParameterSource.COMMANDLINE:
            err_console.print(
                "warning: --token on the command line is visible to other users (ps, shell "
                "history); set CONVEYOR_TOKEN or use --token-file instead",
                highlight=False,
            )
    return token


_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document instead of tables."
)

_url_option = click.option(
    "--database-url",
    envvar="CONVEYOR_DATABASE_URL",
    metavar="URL",
    help="Database URL (env CONVEYOR_DATABASE_URL); default sqlite:///conveyor.db.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    default="INFO",
    envvar="CONVEYOR_LOG_LEVEL",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log level (env CONVEYOR_LOG_LEVEL).",
)
@click.version_option(package_name="conveyor")
def main(log_level: str) -> None:
    """conveyor: durable background jobs on SQLite and PostgreSQL.

    Exit codes: 0 success, 1 job failed or action refused, 2 usage or configuration
    error, 3 job not found, 4 database unavailable, 130 interrupted while waiting.

    Read commands take --json. Durations: 30 (seconds), 500ms, 2s, 15m, 1h30m. Shell
    completion: eval "$(_CONVEYOR_COMPLETE=bash_source conveyor)" (or zsh_source,
    fish_source) in your shell's start-up file.
    """
    _setup_logging(log_level, "text")
    # httpx logs every request at INFO; a command acting through --url prints its own result.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _setup_logging(level: str | int, log_format: str) -> None:
    """Log to stderr: rich on a terminal, else plain single lines; or JSON, one per line."""
    from conveyor import logs

    logs.configure(level, log_format)


_log_format_option = click.option(
    "--log-format",
    default="text",
    show_default=True,
    envvar="CONVEYOR_LOG_FORMAT",
    type=click.Choice(["text", "json"]),
    help="Log lines as text, or as one JSON object per line (env CONVEYOR_LOG_FORMAT).",
)


# -- worker ----------------------------------------------------------------------------


_tenant_limit_option = click.option(
    "--tenant-limit",
    "tenant_limits",
    multiple=True,
    metavar="TENANT:LIMITS",
    help="Limit a tenant's jobs, e.g. acme:concurrency=5,rate=100/m,max_queued=10000 "
    "(any of the three; * for every tenant without its own; repeat for more tenants).",
)


def _apply_tenant_limits(app: Conveyor, specs: Sequence[str]) -> None:
    try:
        app.tenants.parse(specs)
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)


@main.command()
@click.argument("app_spec", metavar="APP", envvar="CONVEYOR_APP")
@_url_option
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
@click.option("--burst", is_flag=True, help="Exit when no job is due.")
@_log_format_option
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
@_tenant_limit_option
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
    from conveyor.worker import WorkerOptions

    app = _app_from(app_spec, database_url)
    _apply_tenant_limits(app, tenant_limits)
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
            burst=burst,
            metrics=count_metrics,
        )
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)
    _setup_logging(logging.getLogger().level, log_format)
    if metrics_port is not None:
        _serve_metrics(app, metrics_host, metrics_port)
    _run(_run_worker(app.worker(options)))


def _serve_metrics(app: Conveyor, host: str, port: int) -> None:
    """Serve the application's metrics from a thread (each worker process its own)."""
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(port, addr=host, registry=app.metrics.registry)
    except OSError as exc:
        _fail(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}", EXIT_USAGE)
    bound = server.server_address[1]
    logging.getLogger("conveyor.worker").info("metrics at http://%s:%d/metrics", host, bound)


async def _run_worker(w: Worker) -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            w.stop()
        else:
            from conveyor._console import err_console

            err_console.print(
                f"{signal.Signals(signum).name} again: stopping now; running jobs will be "
                "rescued when their leases expire"
            )
            os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await w.run()


# -- schedules and retention ----------------------------------------------------------


@main.group()
def schedules() -> None:
    """List, run, enable and disable cron schedules."""


@schedules.command("list")
@_app_option
@_url_option
@_json_option
def schedules_list(app_spec: str | None, database_url: str | None, as_json: bool) -> None:
    """List schedules with their next tick (declared ones are synced first, given --app)."""
    from conveyor._console import console, print_json, schedules_table

    app = _app_from(app_spec, database_url, must_exist=True)

    async def go() -> list[Any]:
        await app.sync_schedules()
        return await app.list_schedules()

    found = _run(go())
    if as_json:
        print_json({"schedules": found})
    else:
        console.print(schedules_table(found))


@schedules.command("run")
@click.argument("name")
@_app_option
@_url_option
def schedules_run(name: str, app_spec: str | None, database_url: str | None) -> None:
    """Submit a schedule's job now, outside its ticks."""
    from conveyor._console import console

    app = _app_from(app_spec, database_url)
    job = _run(app.run_schedule(name))
    console.print(f"schedule {name} submitted [bold]{job.id}[/]")


@schedules.command("enable")
@click.argument("name")
@_app_option
@_url_option
def schedules_enable(name: str, app_spec: str | None, database_url: str | None) -> None:
    """Enable a schedule (its ticks restart from now)."""
    from conveyor._console import console

    app = _app_from(app_spec, database_url)
    _run(app.enable_schedule(name, True))
    console.print(f"schedule {name} enabled")


@schedules.command("disable")
@click.argument("name")
@_app_option
@_url_option
def schedules_disable(name: str, app_spec: str | None, database_url: str | None) -> None:
    """Disable a schedule: no tick fires until it is enabled again."""
    from conveyor._console import console

    app = _app_from(app_spec, database_url)
    _run(app.enable_schedule(name, False))
    console.print(f"schedule {name} disabled")


@main.command()
@_app_option
@_url_option
@click.option(
    "--succeeded", type=DURATION, default="1d", show_default=True, help="Keep succeeded jobs."
)
@click.option("--failed", type=DURATION, default="7d", show_default=True, help="Keep failed jobs.")
@click.option(
    "--cancelled", type=DURATION, default="7d", show_default=True, help="Keep cancelled jobs."
)
def prune(
    app_spec: str | None,
    database_url: str | None,
    succeeded: float,
    failed: float,
    cancelled: float,
) -> None:
    """Delete finished job trees older than their retention, in small batches.

    Job types' own retention (given --app) overrides these for their jobs.
    """
    from conveyor._console import console
    from conveyor.store import Retention

    app = _app_from(app_spec, database_url, must_exist=True)
    policy = Retention(succeeded=succeeded, failed=failed, cancelled=cancelled)
    deleted = _run(app.prune(policy))
    console.print(f"pruned {deleted} finished job(s)")


# -- migrate ---------------------------------------------------------------------------


@main.command()
@_app_option
@_url_option
def migrate(app_spec: str | None, database_url: str | None) -> None:
    """Create or upgrade conveyor's tables."""
    from conveyor._console import console

    app = _app_from(app_spec, database_url)
    applied = _run(app.migrate())
    if applied:
        console.print(f"applied {len(applied)} migration(s): {', '.join(applied)}")
    else:
        console.print("database is up to date")


# -- where the job commands act -------------------------------------------------------------


class JobsTarget(Protocol):
    """Where the job commands act: the database through the facade (:class:`Conveyor`), or
    a conveyor server through its API (:class:`~conveyor.remote.RemoteClient`)."""

    async def submit(
        self,
        type: str,
        payload: Mapping[str, Any],
        *,
        id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
    ) -> ShownJob: ...

    async def get(self, job_id: str) -> ShownJob: ...

    async def list_jobs(
        self,
        *,
        status: Sequence[str] = (),
        type: str | None = None,
        queue: str | None = None,
        include_children: bool = False,
        parent_id: str | None = None,
        root_id: str | None = None,
        limit: int = 50,
    ) -> Sequence[ShownJob]: ...

    async def attempts(self, job_id: str) -> list[Attempt]: ...

    async def cancel(self, job_id: str) -> ShownJob: ...

    async def retry(self, job_id: str) -> ShownJob: ...

    async def retry_failed_children(self, job_id: str) -> Sequence[ShownJob]: ...

    async def children(self, job_id: str, *, limit: int = ...) -> Sequence[ShownJob]: ...

    async def queues(self) -> list[QueueInfo]: ...

    async def pause(self, queue: str) -> None: ...

    async def resume(self, queue: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """The target a job command was given, chosen once from its options."""

    jobs: JobsTarget
    close: Callable[[], Awaitable[None]]
    remote: bool
    app_spec: str | None

    @property
    def has_app(self) -> bool:
        return bool(self.app_spec)

    @classmethod
    def choose(
        cls,
        app_spec: str | None,
        database_url: str | None,
        server_url: str | None,
        token: str | None,
        *,
        must_exist: bool = True,
    ) -> Target:
        """A server's API given --url (its token from --token), else the database."""
        from conveyor.remote import RemoteClient

        if server_url:
            try:
                client = RemoteClient(server_url, token)
            except ConfigurationError as exc:
                _fail(str(exc), EXIT_USAGE)
            return cls(client, client.close, remote=True, app_spec=app_spec)
        app = _app_from(app_spec, database_url, must_exist=must_exist)
        return cls(app, app.close, remote=False, app_spec=app_spec)

    async def no_worker_hint(self) -> str | None:
        """Say so when no worker is live to run a queued job (None when one is)."""
        from conveyor.client import Conveyor
        from conveyor.core.health import no_live_worker
        from conveyor.remote import RemoteClient

        if isinstance(self.jobs, Conveyor):
            return _hint(await self.jobs.health(), self.app_spec)
        if isinstance(self.jobs, RemoteClient):
            ready = await self.jobs.health()
            if ready.get("live_workers"):
                return None
            return no_live_worker(
                workers=int(ready.get("workers") or 0),
                heartbeat_age=ready.get("heartbeat_age"),
                app=self.app_spec,
            )
        return None

    def run(self, action: Callable[[JobsTarget], Awaitable[T]]) -> T:
        """Run ``action`` on the target, then close it; conveyor's errors become exit codes."""

        async def go() -> T:
            try:
                return await action(self.jobs)
            finally:
                await self.close()

        return _run(go())


def _jobs_target(
    command: Callable[..., None] | None = None, *, creates: bool = False
) -> Callable[..., Any]:
    """Give a job command the --app/--database-url and --url/--token options, resolved
    once into its ``target`` argument. Unless ``creates``, a SQLite file must exist."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def with_target(
            *args: Any,
            app_spec: str | None,
            database_url: str | None,
            server_url: str | None,
            token: str | None,
            token_file: str | None,
            **kwargs: Any,
        ) -> None:
            token = _resolve_token(token, token_file)
            target = Target.choose(
                app_spec, database_url, server_url, token, must_exist=not creates
            )
            command(*args, target=target, **kwargs)

        options = (_token_file_option, _token_option, _server_option, _url_option, _app_option)
        for option in options:
            with_target = option(with_target)
        return with_target

    return decorate(command) if command is not None else decorate


def _interrupted(job_id: str | None, status: str | None) -> NoReturn:
    """Ctrl-C while waiting: the job is not touched; say how to follow or cancel it."""
    if job_id is None:
        _fail("interrupted", EXIT_INTERRUPTED)
    _fail(
        f"stopped waiting; job {job_id} is still {status or 'there'} and keeps going. "
        f"Follow it with `conveyor jobs show {job_id} --follow`, cancel it with "
        f"`conveyor jobs cancel {job_id}`",
        EXIT_INTERRUPTED,
    )


# -- submit ----------------------------------------------------------------------------


def _parse_payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            """write e.g. '{"to": "a@b.c"}'""",
            param_hint="--payload",
        ) from None
    if not isinstance(payload, dict):
        raise click.BadParameter(
            "must be a JSON object of keyword arguments, e.g. '{\"n\": 3}'",
            param_hint="--payload",
        )
    return payload


def _client_id(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_job_id(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--id") from None


@main.command()
@click.argument("job_type", metavar="TYPE")
@click.option("--payload", "-p", default="{}", help="JSON object of keyword arguments.")
@click.option(
    "--id",
    "job_id",
    default=None,
    callback=lambda _ctx, _param, value: _client_id(value),
    help="Client id (idempotent): letters, digits and . _ : @ + = -",
)
@click.option("--queue", default=None, help="Queue (default: the type's).")
@click.option("--priority", type=int, default=None, help="Lower runs first.")
@click.option("--delay", type=DURATION, default=None, help="Run after a delay such as 30s or 5m.")
@click.option("--wait", is_flag=True, help="Wait for the job to end, with a progress bar.")
@click.option(
    "--timeout",
    "wait_timeout",
    type=DURATION,
    default=None,
    help="With --wait: give up after this long (e.g. 90s, 15m).",
)
@_jobs_target(creates=True)
def submit(
    target: Target,
    job_type: str,
    payload: str,
    job_id: str | None,
    queue: str | None,
    priority: int | None,
    delay: float | None,
    wait: bool,
    wait_timeout: float | None,
) -> None:
    """Submit a job of TYPE; the payload is checked against the handler's signature.

    With --url the server checks it (no --app needed there). With --wait, Ctrl-C stops
    waiting (exit 130); the job keeps running.
    """
    from conveyor._console import console, print_job

    if not target.remote and not target.has_app:
        _fail(
            "submit needs the application to check the payload: pass --app module:attr "
            "or set CONVEYOR_APP",
            EXIT_USAGE,
        )
    data = _parse_payload(payload)
    submitted: list[ShownJob] = []

    async def go(jobs: JobsTarget) -> ShownJob:
        job = await jobs.submit(
            job_type, data, id=job_id, queue=queue, priority=priority, delay=delay
        )
        submitted.append(job)
        console.print(f"submitted [bold]{job.id}[/] ({job.type}, {job.status.value})")
        if wait:
            await _wait_for(target, job, wait_timeout)
        return job

    try:
        job = target.run(go)
    except KeyboardInterrupt:
        last = submitted[0] if submitted else None
        _interrupted(last.id if last else None, last.status.value if last else None)
    if wait:
        print_job(job, attempts=None)
        if job.status is not Status.SUCCEEDED:
            sys.exit(EXIT_JOB_FAILED)


async def _wait_for(target: Target, job: ShownJob, timeout: float | None) -> None:
    """Follow a job until it ends; warn at once, and fail after ``timeout``, if no worker
    is live to run it."""
    from rich.text import Text

    from conveyor._console import err_console, follow, status_text

    if job.status is Status.QUEUED:
        hint = await target.no_worker_hint()
        if hint:
            err_console.print(Text.assemble(("warning:", "bold yellow"), " ", hint))
    if await follow(job, timeout):
        return
    message = f"job {job.id} still {status_text(job.record)} after {timeout:g}s"
    if job.status is Status.QUEUED:
        hint = await target.no_worker_hint()
        if hint:
            message += f": {hint}"
    _fail(message, EXIT_JOB_FAILED)


# -- jobs ------------------------------------------------------------------------------


@main.group()
def jobs() -> None:
    """List, show, cancel and retry jobs."""


def _status_filter(words: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    """Stored statuses to ask for, and the shown statuses (scheduled, retrying) to keep."""
    known = [s.value for s in Status]
    stored: list[str] = []
    shown: set[str] = set()
    for word in words:
        word = word.strip().lower()
        if word in SHOWN_STATUSES:
            shown.add(word)
            stored.append(Status.QUEUED.value)
        elif word in known:
            stored.append(word)
        else:
            raise click.BadParameter(
                f"unknown status {word!r}; use one of {', '.join([*known, *SHOWN_STATUSES])}",
                param_hint="--status",
            )
    return tuple(dict.fromkeys(stored)), frozenset(shown)


# Scheduled and retrying jobs are picked among this many newest queued ones.
_SHOWN_STATUS_WINDOW = 1000


@jobs.command("list")
@click.option(
    "--status",
    "-s",
    multiple=True,
    help="Filter by status (repeatable): pending, queued, scheduled, retrying, running, "
    "waiting, succeeded, failed, cancelled.",
)
@click.option("--type", "job_type", default=None, help="Filter by job type.")
@click.option("--queue", default=None, help="Filter by queue.")
@click.option(
    "--children",
    "--include-children",
    "include_children",
    is_flag=True,
    help="Also list jobs spawned by other jobs (by default only top-level jobs).",
)
@click.option("--parent", "parent_id", default=None, metavar="ID", help="The children of ID.")
@click.option("--root", "root_id", default=None, metavar="ID", help="Every job below root ID.")
@click.option("--limit", default=50, show_default=True, help="At most this many jobs.")
@_json_option
@_jobs_target
def jobs_list(
    target: Target,
    status: tuple[str, ...],
    job_type: str | None,
    queue: str | None,
    include_children: bool,
    parent_id: str | None,
    root_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List jobs, newest first (by creation time): top-level ones unless --children, or
    the children of --parent ID, or the jobs below --root ID.

    scheduled and retrying are queued jobs due later (retrying: after a failed attempt),
    as the tables show them.
    """
    from conveyor._console import console, job_document, jobs_table, print_json, status_text

    stored, shown = _status_filter(status)
    # scheduled/retrying (without queued itself) read queued jobs and keep those due later.
    only_shown = bool(shown) and Status.QUEUED.value not in [w.strip().lower() for w in status]
    found = target.run(
        lambda jobs: jobs.list_jobs(
            status=stored,
            type=job_type,
            queue=queue,
            include_children=include_children,
            parent_id=parent_id,
            root_id=root_id,
            limit=max(limit, _SHOWN_STATUS_WINDOW) if only_shown else limit,
        )
    )
    if only_shown:
        found = [
            j for j in found if j.status is not Status.QUEUED or status_text(j.record) in shown
        ][:limit]
    if as_json:
        print_json({"jobs": [job_document(j.record) for j in found]})
    else:
        console.print(jobs_table(found, title=f"{len(found)} job(s)"))


# Sub-jobs `jobs show` lists under a job (all of them are counted).
_SHOWN_CHILDREN = 20


@jobs.command("show")
@click.argument("job_id")
@click.option(
    "--follow",
    "-f",
    "following",
    is_flag=True,
    help="Follow the job until it ends (a parent: the jobs below it, done/total).",
)
@click.option("--traceback", "tracebacks", is_flag=True, help="Print each attempt's traceback.")
@_json_option
@_jobs_target
def jobs_show(
    target: Target, job_id: str, following: bool, tracebacks: bool, as_json: bool
) -> None:
    """Show one job with its attempts, the counts of the jobs below it and its first
    sub-jobs (--follow: a live progress bar until it ends; Ctrl-C stops following, exit
    130)."""
    from conveyor._console import console, job_document, jobs_table, print_job, print_json

    shown: list[ShownJob] = []

    async def go(jobs: JobsTarget) -> tuple[ShownJob, list[Attempt], str | None, list[Any]]:
        job = await jobs.get(job_id)
        shown.append(job)
        if following and not job.terminal:
            await _wait_for(target, job, None)
        hint = await target.no_worker_hint() if job.status is Status.QUEUED else None
        below = job.record.below
        children = await jobs.children(job_id, limit=_SHOWN_CHILDREN) if below else []
        return job, await job.attempts(), hint, list(children)

    try:
        job, attempts, hint, children = target.run(go)
    except KeyboardInterrupt:
        _interrupted(job_id, shown[0].status.value if shown else None)
    if as_json:
        document = job_document(job.record, attempts)
        document["hint"] = hint
        document["children"] = [job_document(c.record) for c in children]
        print_json(document)
    else:
        print_job(job, attempts, tracebacks=tracebacks, note=hint)
        if children:
            below = job.record.below
            title = f"sub-jobs (newest {len(children)} of {below.total if below else '?'} below)"
            console.print(jobs_table(children, title=title))


@jobs.command("cancel")
@click.argument("job_id")
@click.option("--wait", is_flag=True, help="Wait until a running job has actually stopped.")
@click.option(
    "--timeout",
    "wait_timeout",
    type=DURATION,
    default=None,
    help="With --wait: give up after this long (exit 1).",
)
@_jobs_target
def jobs_cancel(target: Target, job_id: str, wait: bool, wait_timeout: float | None) -> None:
    """Cancel a job (a running one is asked to stop; --wait waits until it has)."""
    from conveyor._console import console, follow

    async def go(jobs: JobsTarget) -> tuple[ShownJob, bool]:
        job = await jobs.cancel(job_id)
        if not (wait and job.status in (Status.RUNNING, Status.WAITING)):
            return job, False
        console.print(f"job {job.id} is {job.status.value}: waiting for it to stop")
        if not await follow(job, wait_timeout):
            _fail(f"job {job.id} still running after {wait_timeout:g}s", EXIT_JOB_FAILED)
        return job, True

    try:
        job, waited = target.run(go)
    except KeyboardInterrupt:
        _interrupted(job_id, "running")
    if job.status is Status.CANCELLED:
        console.print(f"job {job.id} cancelled" + (" and stopped" if waited else ""))
    elif job.status is Status.RUNNING:
        console.print(f"job {job.id} is running: its worker was asked to stop it")
    elif job.status is Status.WAITING:
        console.print(
            f"job {job.id} is waiting for the jobs running below it, which were asked to "
            "stop: it ends cancelled once they have"
        )
    elif waited:
        # It ended some other way while its worker was stopping it.
        _fail(f"job {job.id} ended {job.status.value} before it could be stopped", EXIT_JOB_FAILED)
    else:
        _fail(f"job {job.id} is already {job.status.value}", EXIT_JOB_FAILED)


@jobs.command("retry")
@click.argument("job_id")
@click.option(
    "--failed-children",
    is_flag=True,
    help="Retry every failed job below JOB_ID instead (its failed parents wait again).",
)
@_jobs_target
def jobs_retry(target: Target, job_id: str, failed_children: bool) -> None:
    """Retry a failed or cancelled job as a new job in its place (the old one is kept;
    a parent that failed because of it waits again). --failed-children: every failed
    job below JOB_ID, in one go."""
    from conveyor._console import console

    if failed_children:
        retried = target.run(lambda jobs: jobs.retry_failed_children(job_id))
        for job in retried:
            console.print(f"job {job.record.retry_of} retried as [bold]{job.id}[/]")
        console.print(f"{len(retried)} failed job(s) below {job_id} retried")
        return
    job = target.run(lambda jobs: jobs.retry(job_id))
    console.print(f"job {job_id} retried as [bold]{job.id}[/] (retry {job.record.retry_count})")


# -- queues ----------------------------------------------------------------------------


@main.group()
def queues() -> None:
    """List queues with their job counts; pause and resume claiming from one."""


@queues.command("list")
@_jobs_target
@_json_option
def queues_list(target: Target, as_json: bool) -> None:
    """List queues with their job counts per status and whether each is paused."""
    from conveyor._console import console, print_json, queues_table

    found = target.run(lambda jobs: jobs.queues())
    if as_json:
        print_json({"queues": found})
    else:
        console.print(queues_table(found))


@queues.command("pause")
@click.argument("queue")
@_jobs_target
def queues_pause(target: Target, queue: str) -> None:
    """Stop workers claiming jobs from QUEUE (running jobs finish)."""
    from conveyor._console import console

    target.run(lambda jobs: jobs.pause(queue))
    console.print(f"queue {queue} paused: workers claim no new job from it")


@queues.command("resume")
@click.argument("queue")
@_jobs_target
def queues_resume(target: Target, queue: str) -> None:
    """Let workers claim jobs from QUEUE again."""
    from conveyor._console import console

    target.run(lambda jobs: jobs.resume(queue))
    console.print(f"queue {queue} resumed")


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


@main.command()
@click.argument("app_spec", metavar="APP", envvar="CONVEYOR_APP")
@_url_option
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
@_log_format_option
@_tenant_limit_option
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
        _fail(
            f'serve needs the web extra ({exc.name} is not installed): pip install "conveyor[web]"',
            EXIT_USAGE,
        )
    _check_port(host, port)
    app = _app_from(app_spec, database_url)
    _apply_tenant_limits(app, tenant_limits)
    _setup_logging(logging.getLogger().level, log_format)
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
            docs=limits["docs"],
        )
        api = create_api(app, options=api_options)
        options = WorkerOptions(concurrency=concurrency) if with_worker else None
    except ConfigurationError as exc:
        _fail(str(exc), EXIT_USAGE)
    _run(_serve(app, api, host, port, options, server_limits))


def _check_port(host: str, port: int) -> None:
    """Refuse a port another process listens on, before anything starts (exit 2)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        _fail(f"cannot listen on {host!r}: {exc.strerror}; check --host", EXIT_USAGE)
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As uvicorn binds: SO_REUSEADDR, so a port in TIME_WAIT is not taken for busy.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                _fail(
                    f"port {port} is in use on {host} (another `conveyor serve`?); "
                    "stop it or choose another --port",
                    EXIT_USAGE,
                )
            _fail(f"cannot listen on {host}:{port}: {exc.strerror}", EXIT_USAGE)


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

    from conveyor._console import console, err_console
    from conveyor.web._server import GuardedConfig

    if not [t for t in await app.list_tokens() if t.active]:
        if not _is_loopback(host):
            _fail(
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


# -- tokens ----------------------------------------------------------------------------


@main.group()
def tokens() -> None:
    """Create, list, rotate and revoke API tokens (stored hashed; a secret is shown once)."""


@tokens.command("create")
@_app_option
@_url_option
@click.option("--tenant", required=True, help="The tenant whose jobs the token acts on.")
@click.option(
    "--role",
    required=True,
    type=click.Choice(["read", "write", "admin"]),
    help="read: see jobs; write: also submit, cancel, retry; admin: every tenant, queues.",
)
@click.option("--name", default=None, help="A note saying who or what uses the token.")
@click.option(
    "--expires",
    default=None,
    metavar="DURATION",
    help="The token stops working after this long, e.g. 30d, 12h (default: never).",
)
def tokens_create(
    app_spec: str | None,
    database_url: str | None,
    tenant: str,
    role: str,
    name: str | None,
    expires: str | None,
) -> None:
    """Create an API token and print it (on stdout, alone, this once only)."""
    from conveyor._console import console, err_console

    app = _app_from(app_spec, database_url)
    token, secret = _run(app.create_token(tenant=tenant, role=role, name=name, expires=expires))
    until = (
        f", expiring {token.expires_at.isoformat(timespec='seconds')}" if token.expires_at else ""
    )
    err_console.print(
        f"created token {token.id} for tenant {token.tenant!r} with role {token.role.value}"
        f"{until}; store it now, it is not shown again:"
    )
    console.print(secret, highlight=False)


@tokens.command("rotate")
@click.argument("token_id", metavar="ID")
@_app_option
@_url_option
@click.option(
    "--grace",
    default="0s",
    show_default=True,
    metavar="DURATION",
    help="How long the old secret keeps working beside the new one, e.g. 10m.",
)
def tokens_rotate(
    token_id: str, app_spec: str | None, database_url: str | None, grace: str
) -> None:
    """Give the token ID a new secret and print it (once); the old secret stops working
    (after --grace). The token keeps its id, tenant, role and expiry."""
    from conveyor._console import console, err_console

    app = _app_from(app_spec, database_url, must_exist=True)

    async def go() -> tuple[Token, str]:
        try:
            return await app.rotate_token(token_id, grace=grace)
        except TokenNotFound as exc:
            _fail(f"{exc} (revoked tokens cannot be rotated)", EXIT_NOT_FOUND)

    token, secret = _run(go())
    err_console.print(
        f"token {token.id} has a new secret; the old one "
        + (
            f"works until {token.previous_expires_at.isoformat(timespec='seconds')}"
            if token.previous_expires_at
            else "no longer works"
        )
        + ". Store the new one now, it is not shown again:"
    )
    console.print(secret, highlight=False)


@tokens.command("list")
@_app_option
@_url_option
@_json_option
def tokens_list(app_spec: str | None, database_url: str | None, as_json: bool) -> None:
    """List API tokens (never their secrets), newest first: state (active, expired or
    revoked), expiry and when each was last used (recorded at most once a minute)."""
    from conveyor._console import console, jsonable, print_json, tokens_table

    app = _app_from(app_spec, database_url, must_exist=True)

    async def read() -> tuple[list[Token], datetime]:
        return await app.list_tokens(), await app.now()

    found, now = _run(read())
    if as_json:
        hidden = frozenset({"secret_hash", "previous_hash"})
        print_json(
            {"tokens": [{**jsonable(t, omit=hidden), "state": t.state_at(now)} for t in found]}
        )
    else:
        console.print(tokens_table(found, now))


@tokens.command("revoke")
@click.argument("token_id", metavar="ID")
@_app_option
@_url_option
def tokens_revoke(token_id: str, app_spec: str | None, database_url: str | None) -> None:
    """Revoke the token ID: requests bearing it are refused from now on."""
    from conveyor._console import console

    app = _app_from(app_spec, database_url, must_exist=True)

    async def go() -> None:
        try:
            await app.revoke_token(token_id)
        except TokenNotFound as exc:
            _fail(str(exc), EXIT_NOT_FOUND)

    _run(go())
    console.print(f"token {token_id} revoked")


# -- status ----------------------------------------------------------------------------


@main.command()
@_app_option
@_url_option
@_json_option
def status(app_spec: str | None, database_url: str | None, as_json: bool) -> None:
    """Show the cluster's health verdict, its queues and its workers.

    The verdict and counts are those of the API's /health/ready: each worker is live
    while its newest heartbeat is younger than its own lease, dead once silent longer.
    """
    from conveyor._console import console, print_json, queues_table, worker_document, workers_table

    app = _app_from(app_spec, database_url, must_exist=True)

    async def go() -> tuple[Health, list[Any], list[Any]]:
        return await app.health(), await app.queues(), await app.workers()

    health, queues, workers = _run(go())
    now = health.counts.now
    hint = _health_hint(health, app_spec)
    if as_json:
        print_json(
            {
                "health": health.to_dict(),
                "hint": hint,
                "queues": queues,
                "workers": [worker_document(w, now) for w in workers],
            }
        )
        return
    c = health.counts
    style = {"healthy": "green", "degraded": "yellow", "unhealthy": "red"}[health.status]
    age = f"{health.heartbeat_age:.0f}s ago" if health.heartbeat_age is not None else "never"
    console.print(
        f"[bold {style}]{health.status}[/]: {c.live_workers} live, {c.dead_workers} dead of "
        f"{c.workers} worker(s); last heartbeat {age}; {c.queued} queued ({c.due} due), "
        f"{c.running} running ({c.stale_running} with an expired lease)",
        highlight=False,
    )
    if hint:
        console.print(f"[yellow]note:[/] {hint}", highlight=False)
    console.print(queues_table(queues))
    console.print(workers_table(workers, now))


def _health_hint(health: Health, app_spec: str | None) -> str | None:
    """Why the verdict is not healthy and what to do, naming APP in the command to run."""
    from conveyor.core.health import explain

    c = health.counts
    return explain(
        workers=c.workers,
        live_workers=c.live_workers,
        dead_workers=c.dead_workers,
        stale_running=c.stale_running,
        heartbeat_age=health.heartbeat_age,
        app=app_spec,
    )


def _hint(health: Health, app_spec: str | None) -> str | None:
    """The "no live worker" hint, or None when a worker is live."""
    from conveyor.core.health import no_live_worker

    if not health.no_live_worker:
        return None
    return no_live_worker(
        workers=health.counts.workers, heartbeat_age=health.heartbeat_age, app=app_spec
    )


# -- demo ------------------------------------------------------------------------------


@main.command()
@click.argument("app_spec", metavar="APP", default="examples.app:app")
@click.option("--concurrency", default=4, show_default=True)
def demo(app_spec: str, concurrency: int) -> None:
    """Submit APP's demo jobs and watch a worker run them, live.

    APP's module provides the jobs through a function ``seed(app)`` that submits them
    (sync or async). The demo ends when every job it submitted has ended.
    """
    app = load_app(app_spec)
    module = sys.modules[app_spec.partition(":")[0]]
    seed: Callable[[Conveyor], Any] | None = getattr(module, "seed", None)
    if seed is None:
        _fail(f"{app_spec} has no seed(app) function that submits demo jobs", EXIT_USAGE)
    _run(_demo(app, app_spec, seed, concurrency))


async def _demo(
    app: Conveyor, app_spec: str, seed: Callable[[Conveyor], Any], concurrency: int
) -> None:
    import asyncio

    from rich.live import Live

    from conveyor._console import console, jobs_table
    from conveyor.worker import WorkerOptions

    submitted = seed(app)
    if inspect.isawaitable(submitted):
        submitted = await submitted
    ids = [j.id for j in submitted]
    worker_ = app.worker(
        WorkerOptions(concurrency=concurrency, poll_interval=0.2, rescue_interval=1.0)
    )
    running = asyncio.create_task(worker_.run())
    try:
        with Live(console=console, refresh_per_second=8) as live:
            while True:
                handles = [await app.get(i) for i in ids]
                live.update(jobs_table(handles, title="conveyor demo: jobs moving"))
                if all(h.terminal for h in handles) or running.done():
                    break
                await asyncio.sleep(0.25)
    finally:
        worker_.stop()
        await running
    counts: dict[str, int] = {}
    for h in handles:
        counts[h.status.value] = counts.get(h.status.value, 0) + 1
    console.print(
        "done: "
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f". Inspect one with: conveyor jobs show {ids[0]} --database-url {app.url}"
    )
    _, secret = await app.create_token(
        tenant="default", role="admin", name="created by conveyor demo for the dashboard"
    )
    console.print(
        "\nSee them in the dashboard: start the server with\n"
        f"  conveyor serve {app_spec} --database-url {app.url}\n"
        "then open http://127.0.0.1:8000/ui/ and sign in with this admin token "
        "(shown this once):",
        highlight=False,
    )
    console.print(secret, highlight=False, soft_wrap=True)


if __name__ == "__main__":
    main()
