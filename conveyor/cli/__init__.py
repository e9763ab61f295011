"""The ``conveyor`` command line.

Settings come from flags, then ``CONVEYOR_*`` environment variables (``CONVEYOR_APP``,
``CONVEYOR_DATABASE_URL``). ``APP`` is ``module:attribute`` naming a
:class:`~conveyor.Conveyor`.

Exit codes: 0 success; 1 the job ended failed or cancelled (``submit --wait``) or a
job action was refused; 2 usage or configuration error; 3 job not found; 4 database
unavailable; 130 interrupted (Ctrl-C) while waiting for a job, which keeps running.

Read commands take ``--json`` for scripts. Durations are written as the Python API takes
them: ``30`` (seconds), ``500ms``, ``2s``, ``15m``, ``1h30m``.

Each command group is a module of this package, loaded only when its command runs (or
``--help`` lists it): ``worker``, ``jobs`` (``submit`` and ``jobs``), ``admin``
(``schedules``, ``queues``, ``prune``, ``migrate``, ``status``), ``serve``, ``tokens``
and ``demo``; ``_common`` and ``_target`` hold what they share.
"""

from __future__ import annotations

import importlib
import logging

import click

from conveyor.cli._common import setup_logging

# Command name -> the module and attribute that define it. A command's module is imported
# when the command runs or is listed, so one command does not load another's imports.
COMMANDS = {
    "demo": ("conveyor.cli.demo", "demo"),
    "jobs": ("conveyor.cli.jobs", "jobs"),
    "migrate": ("conveyor.cli.admin", "migrate"),
    "prune": ("conveyor.cli.admin", "prune"),
    "queues": ("conveyor.cli.admin", "queues"),
    "schedules": ("conveyor.cli.admin", "schedules"),
    "serve": ("conveyor.cli.serve", "serve"),
    "status": ("conveyor.cli.admin", "status"),
    "submit": ("conveyor.cli.jobs", "submit"),
    "tokens": ("conveyor.cli.tokens", "tokens"),
    "worker": ("conveyor.cli.worker", "worker"),
}


class _LazyGroup(click.Group):
    """A group whose commands are imported by name when first needed (click's lazy
    subcommands)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attribute = where
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module}.{attribute} is not a click command")
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    setup_logging(log_level, "text")
    # httpx logs every request at INFO; a command acting through --url prints its own result.
    logging.getLogger("httpx").setLevel(logging.WARNING)
