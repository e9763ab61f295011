"""What the ``conveyor`` commands share: exit codes, the duration type, turning conveyor's
errors into messages and exit codes, loading the application, and the common options."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from click.core import ParameterSource

from conveyor.core.durations import seconds
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidDependency,
    InvalidPayload,
    JobNotFound,
    ScheduleNotFound,
    UnknownJobType,
)

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor.app.client import Conveyor

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

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
url_source = {"flag": False}
# --pooler and --listen-url (or their environment variables), for app_from: they come
# with every --database-url, so they are kept here rather than in each command's arguments.
route: dict[str, str | None] = {"pooler": None, "listen_url": None}


def fail(message: str, code: int) -> NoReturn:
    from rich.text import Text

    from conveyor.cli._console import err_console

    if url_source["flag"]:
        message = message.replace("CONVEYOR_DATABASE_URL", "--database-url")
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False)
    sys.exit(code)


def run_command(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine, turning conveyor's errors into messages and exit codes."""
    import asyncio

    try:
        return asyncio.run(coro)
    except (JobNotFound, ScheduleNotFound) as exc:
        fail(str(exc), EXIT_NOT_FOUND)
    except DatabaseUnavailable as exc:
        fail(str(exc), EXIT_UNAVAILABLE)
    except (
        ConfigurationError,
        UnknownJobType,
        InvalidPayload,
        InvalidDependency,
        IdempotencyConflict,
    ) as exc:
        fail(str(exc), EXIT_USAGE)
    except ConveyorError as exc:
        fail(str(exc), EXIT_JOB_FAILED)


def load_app(spec: str) -> Conveyor:
    """Import ``module:attribute`` and return the Conveyor it names."""
    from conveyor.app.client import Conveyor

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
        fail(f"importing {module_name!r} failed: {exc}", EXIT_USAGE)
    except Exception as exc:
        # The module exists; its own code (or a dependency it imports) failed.
        from conveyor.cli._console import err_console

        err_console.print(
            "".join(traceback.format_exception(exc)), markup=False, highlight=False, end=""
        )
        fail(
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


def app_from(
    app_spec: str | None, database_url: str | None, *, must_exist: bool = False
) -> Conveyor:
    """The application given --app (on --database-url if given), else one on the URL alone.

    ``must_exist``: a read command on a SQLite file that does not exist says so and
    creates nothing (a typo in a path would otherwise show an empty new database).
    """
    from conveyor.app.client import Conveyor
    from conveyor.store import sqlite_path

    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source("database_url") if ctx is not None else None
    url_source["flag"] = bool(database_url) and source is click.core.ParameterSource.COMMANDLINE
    pooler, listen_url = route["pooler"], route["listen_url"]
    try:
        if app_spec:
            app = load_app(app_spec)
            if database_url or pooler is not None or listen_url is not None:
                app.use_database(database_url or app.url, pooler=pooler, listen_url=listen_url)
        else:
            app = Conveyor(database_url, pooler=pooler, listen_url=listen_url)
        path = sqlite_path(app.url) if must_exist else None
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)
    if path is not None and not os.path.exists(path):
        fail(
            f"no database at {os.path.abspath(path)} ({app.url}): check the path in "
            "CONVEYOR_DATABASE_URL; nothing was created. A new database is made by "
            "`conveyor migrate` or by the first worker",
            EXIT_USAGE,
        )
    return app


app_option = click.option(
    "--app",
    "app_spec",
    envvar="CONVEYOR_APP",
    metavar="MODULE:ATTR",
    help="Application whose job types to use (env CONVEYOR_APP).",
)
server_option = click.option(
    "--url",
    "server_url",
    envvar="CONVEYOR_URL",
    metavar="URL",
    help="Act through a conveyor server's API, e.g. http://host:8000 (env CONVEYOR_URL), "
    "instead of the database.",
)
token_option = click.option(
    "--token",
    envvar="CONVEYOR_TOKEN",
    metavar="TOKEN",
    help="API token for --url, better given as env CONVEYOR_TOKEN or --token-file: on the "
    "command line it is visible to other users of the machine (ps, shell history).",
)
token_file_option = click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=str),
    envvar="CONVEYOR_TOKEN_FILE",
    help="Read the API token for --url from this file (env CONVEYOR_TOKEN_FILE).",
)


def resolve_token(token: str | None, token_file: str | None) -> str | None:
    """The API token from --token-file, CONVEYOR_TOKEN or --token (warned about: argv is
    visible to every user of the machine)."""
    if token_file:
        try:
            with open(token_file, encoding="utf-8") as f:
                text = f.read().strip()
        except OSError as exc:
            fail(f"cannot read --token-file {token_file!r}: {exc.strerror}", EXIT_USAGE)
        if not text:
            fail(f"--token-file {token_file!r} is empty: put the API token in it", EXIT_USAGE)
        return text
    context = click.get_current_context(silent=True)
    if token and context is not None:
        from conveyor.cli._console import err_console

        source = context.get_parameter_source("token")
        if source is ParameterSource.COMMANDLINE:
            err_console.print(
                "warning: --token on the command line is visible to other users (ps, shell "
                "history); set CONVEYOR_TOKEN or use --token-file instead",
                highlight=False,
            )
    return token


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document instead of tables."
)


def _keep_route(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if param.name is not None:
        route[param.name] = value


def url_option(command: F) -> F:
    """Give a command --database-url, and --pooler and --listen-url for PgBouncer."""
    command = click.option(
        "--listen-url",
        envvar="CONVEYOR_LISTEN_URL",
        metavar="URL",
        expose_value=False,
        callback=_keep_route,
        help="A direct PostgreSQL URL of the same database, used only to LISTEN for "
        "wake-ups when --database-url goes through a transaction pooler (env "
        "CONVEYOR_LISTEN_URL); without it workers poll.",
    )(command)
    command = click.option(
        "--pooler",
        envvar="CONVEYOR_POOLER",
        type=click.Choice(["transaction", "none"], case_sensitive=False),
        expose_value=False,
        callback=_keep_route,
        help="'transaction': --database-url goes through a transaction pooler such as "
        "PgBouncer's pool_mode = transaction (env CONVEYOR_POOLER).",
    )(command)
    return click.option(
        "--database-url",
        envvar="CONVEYOR_DATABASE_URL",
        metavar="URL",
        help="Database URL (env CONVEYOR_DATABASE_URL); default sqlite:///conveyor.db.",
    )(command)


def setup_logging(level: str | int, log_format: str) -> None:
    """Log to stderr: rich on a terminal, else plain single lines; or JSON, one per line."""
    from conveyor.observe import logs

    logs.configure(level, log_format)


log_format_option = click.option(
    "--log-format",
    default="text",
    show_default=True,
    envvar="CONVEYOR_LOG_FORMAT",
    type=click.Choice(["text", "json"]),
    help="Log lines as text, or as one JSON object per line (env CONVEYOR_LOG_FORMAT).",
)


# -- worker ----------------------------------------------------------------------------


tenant_limit_option = click.option(
    "--tenant-limit",
    "tenant_limits",
    multiple=True,
    metavar="TENANT:LIMITS",
    help="Limit a tenant's jobs, e.g. acme:concurrency=5,rate=100/m,max_queued=10000 "
    "(any of the three; * for every tenant without its own; repeat for more tenants).",
)


def apply_tenant_limits(app: Conveyor, specs: Sequence[str]) -> None:
    try:
        app.tenants.parse(specs)
    except ConfigurationError as exc:
        fail(str(exc), EXIT_USAGE)
