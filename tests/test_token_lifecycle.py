"""API tokens over their life, on both backends: expiry, rotation with and without grace,
last use recorded and shown, the CLI reading a token from CONVEYOR_TOKEN or a file, and
the migration that brings these to a database holding live tokens and jobs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from conveyor import Conveyor
from conveyor.core.auth import format_token, hash_secret
from conveyor.errors import ConfigurationError, TokenNotFound
from conveyor.store.postgres import backend as postgres
from conveyor.store.sqlite import backend as sqlite
from tests.apiserver import api_for_tests, serving
from tests.apps.api import build
from tests.helpers import eventually, key_by_creation

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    application = build(db_url)
    yield application
    await application.close()


async def test_a_token_stops_working_when_it_expires(app: Conveyor) -> None:
    token, secret = await app.create_token(tenant="acme", role="read", expires="1s")
    assert token.expires_at is not None and token.expires_at > token.created_at
    assert await app.authenticate(secret) is not None

    async def expired() -> bool:
        return await app.authenticate(secret) is None

    await eventually(expired)
    (listed,) = await app.list_tokens()
    assert listed.state_at(await app.ops.now()) == "expired"
    forever, _ = await app.create_token(tenant="acme", role="read")
    assert forever.expires_at is None
    for bad in ("soon", "0s", -1, "20y"):
        with pytest.raises(ConfigurationError, match="expires"):
            await app.create_token(tenant="acme", role="read", expires=bad)


async def test_rotation_replaces_the_secret_at_once_or_after_a_grace(app: Conveyor) -> None:
    token, old = await app.create_token(tenant="acme", role="write", name="ci")
    rotated, new = await app.rotate_token(token.id)
    assert new != old and new.startswith(f"cvt_{token.id}_")
    assert await app.authenticate(old) is None
    principal = await app.authenticate(new)
    assert principal is not None and (principal.tenant, principal.role.value) == ("acme", "write")
    assert rotated.name == "ci" and rotated.previous_expires_at is None

    graced, newer = await app.rotate_token(token.id, grace="1s")
    assert graced.previous_expires_at is not None
    assert await app.authenticate(new) is not None  # the old secret, in its grace
    assert await app.authenticate(newer) is not None

    async def grace_over() -> bool:
        return await app.authenticate(new) is None

    await eventually(grace_over)
    assert await app.authenticate(newer) is not None

    await app.revoke_token(token.id)
    with pytest.raises(TokenNotFound):
        await app.rotate_token(token.id)
    with pytest.raises(TokenNotFound):
        await app.rotate_token("0123456789ab")


async def test_last_use_is_recorded_at_most_once_a_minute(app: Conveyor) -> None:
    _, secret = await app.create_token(tenant="acme", role="read")
    (listed,) = await app.list_tokens()
    assert listed.last_used_at is None
    assert await app.authenticate(secret) is not None
    (first,) = await app.list_tokens()
    assert first.last_used_at is not None
    assert await app.authenticate(secret) is not None
    (second,) = await app.list_tokens()
    assert second.last_used_at == first.last_used_at  # not written again within the minute


# -- the CLI ----------------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = str(ROOT)
    return {**env, **extra}


def conveyor(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


async def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(conveyor, *args, **env)


async def test_cli_creates_rotates_and_lists_tokens(app: Conveyor, db_url: str) -> None:
    made = await run("tokens", "create", "--tenant", "acme", "--role", "read", "--expires", "30d",
                     "--database-url", db_url)  # fmt: skip
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert "expiring" in made.stderr and secret.startswith("cvt_")
    token_id = secret.split("_")[1]
    assert await app.authenticate(secret) is not None  # now used: last use recorded

    listed = json.loads((await run("tokens", "list", "--json", "--database-url", db_url)).stdout)
    (entry,) = listed["tokens"]
    assert entry["state"] == "active" and entry["expires_at"] and entry["last_used_at"]
    assert "secret_hash" not in entry and "previous_hash" not in entry
    table = await run("tokens", "list", "--database-url", db_url)
    assert "active" in table.stdout and "expires" in table.stdout

    rotated = await run("tokens", "rotate", token_id, "--database-url", db_url)
    assert rotated.returncode == 0, rotated.stderr
    assert "no longer works" in rotated.stderr
    assert await app.authenticate(secret) is None
    assert await app.authenticate(rotated.stdout.strip()) is not None
    unknown = await run("tokens", "rotate", "0123456789ab", "--database-url", db_url)
    assert unknown.returncode != 0 and "no token with id" in unknown.stderr


async def test_cli_reads_the_token_from_the_environment_or_a_file(
    app: Conveyor, db_url: str, tmp_path: Path
) -> None:
    await app.submit("add", {"a": 1, "b": 2}, tenant="acme")
    _, secret = await app.create_token(tenant="acme", role="read")
    file = tmp_path / "token"
    file.write_text(secret + "\n")
    served = build(db_url)  # the server's own instance: it runs on a loop of its own
    with serving(served, api_for_tests(served)) as server:
        url = server.base_url
        by_file = await run("jobs", "list", "--json", "--url", url, "--token-file", str(file))
        assert by_file.returncode == 0, by_file.stderr
        assert len(json.loads(by_file.stdout)["jobs"]) == 1
        assert "warning" not in by_file.stderr
        by_env = await run("jobs", "list", "--json", "--url", url, CONVEYOR_TOKEN=secret)
        assert by_env.returncode == 0 and "warning" not in by_env.stderr, by_env.stderr
        on_argv = await run("jobs", "list", "--json", "--url", url, "--token", secret)
        assert on_argv.returncode == 0, on_argv.stderr
        assert "visible to other users" in on_argv.stderr
        missing = await run("jobs", "list", "--url", url, "--token-file", str(tmp_path / "nope"))
        assert missing.returncode == 2 and "cannot read --token-file" in missing.stderr
    bad_id = await run("submit", "add", "-p", '{"a": 1, "b": 2}', "--id", "a/b",
                       "--url", "http://127.0.0.1:9", CONVEYOR_TOKEN=secret)  # fmt: skip
    assert bad_id.returncode == 2 and "a job id is" in bad_id.stderr


# -- the migration ----------------------------------------------------------------------------


def _before_token_expiry(migrations: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The migrations before the one that added token expiry (by name, not number)."""
    names = [name for _, name, _ in migrations]
    (mine,) = [i for i, name in enumerate(names) if "token_expiry" in name]
    return migrations[:mine]


async def test_the_migration_keeps_live_tokens_and_jobs(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = postgres if db_url.startswith("postgres") else sqlite
    full = module._MIGRATIONS
    with monkeypatch.context() as patch:
        patch.setattr(module, "_MIGRATIONS", _before_token_expiry(full))
        old = build(db_url)
        store = await old.store()
        key_by_creation(db_url)  # the key today's store writes (SQLite)
        job = await old.submit("add", {"a": 1, "b": 2}, tenant="acme")
        # The old schema's token row, as the previous version created it.
        if module is sqlite:
            sql = ("INSERT INTO conveyor_tokens (id, tenant, role, secret_hash, name, created_at)"
                   " VALUES (:id, 'acme', 'read', :hash, 'old', 0)")  # fmt: skip
        else:
            sql = ("INSERT INTO conveyor_tokens (id, tenant, role, secret_hash, name, created_at)"
                   " VALUES (%(id)s, 'acme', 'read', %(hash)s, 'old', now())")  # fmt: skip
        params = {"id": "00aa11bb22cc", "hash": hash_secret("s" * 43)}
        if module is sqlite:
            await store._write(lambda conn: conn.execute(sql, params))  # type: ignore[attr-defined]
        else:
            await store._run(lambda conn: conn.execute(sql, params))  # type: ignore[attr-defined]
        await old.close()
    new = build(db_url)
    try:
        principal = await new.authenticate(format_token("00aa11bb22cc", "s" * 43))
        assert principal is not None and principal.tenant == "acme"
        (token,) = await new.list_tokens()
        assert token.expires_at is None and token.previous_hash is None
        assert (await new.get(job.id)).status.value == "queued"
        assert await (await new.store()).server_secret("cursor")
    finally:
        await new.close()
