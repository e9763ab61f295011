"""``conveyor tokens``: create, rotate, list and revoke API tokens."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import click

from conveyor.cli._common import (
    EXIT_NOT_FOUND,
    app_from,
    app_option,
    fail,
    json_option,
    run_command,
    url_option,
)
from conveyor.errors import TokenNotFound

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor.core.auth import Token

# -- tokens ----------------------------------------------------------------------------


@click.group()
def tokens() -> None:
    """Create, list, rotate and revoke API tokens (stored hashed; a secret is shown once)."""


@tokens.command("create")
@app_option
@url_option
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
    from conveyor.cli._console import console, err_console

    app = app_from(app_spec, database_url)
    token, secret = run_command(
        app.create_token(tenant=tenant, role=role, name=name, expires=expires)
    )
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
@app_option
@url_option
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
    from conveyor.cli._console import console, err_console

    app = app_from(app_spec, database_url, must_exist=True)

    async def go() -> tuple[Token, str]:
        try:
            return await app.rotate_token(token_id, grace=grace)
        except TokenNotFound as exc:
            fail(f"{exc} (revoked tokens cannot be rotated)", EXIT_NOT_FOUND)

    token, secret = run_command(go())
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
@app_option
@url_option
@json_option
def tokens_list(app_spec: str | None, database_url: str | None, as_json: bool) -> None:
    """List API tokens (never their secrets), newest first: state (active, expired or
    revoked), expiry and when each was last used (recorded at most once a minute)."""
    from conveyor.cli._console import console, jsonable, print_json, tokens_table

    app = app_from(app_spec, database_url, must_exist=True)

    async def read() -> tuple[list[Token], datetime]:
        return await app.list_tokens(), await app.ops.now()

    found, now = run_command(read())
    if as_json:
        hidden = frozenset({"secret_hash", "previous_hash"})
        print_json(
            {"tokens": [{**jsonable(t, omit=hidden), "state": t.state_at(now)} for t in found]}
        )
    else:
        console.print(tokens_table(found, now))


@tokens.command("revoke")
@click.argument("token_id", metavar="ID")
@app_option
@url_option
def tokens_revoke(token_id: str, app_spec: str | None, database_url: str | None) -> None:
    """Revoke the token ID: requests bearing it are refused from now on."""
    from conveyor.cli._console import console

    app = app_from(app_spec, database_url, must_exist=True)

    async def go() -> None:
        try:
            await app.revoke_token(token_id)
        except TokenNotFound as exc:
            fail(str(exc), EXIT_NOT_FOUND)

    run_command(go())
    console.print(f"token {token_id} revoked")
