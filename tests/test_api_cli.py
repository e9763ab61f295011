"""The CLI's API commands: tokens, ``serve`` (with its loopback rule), and the job commands
against a remote server with ``--url``/``--token``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from conveyor import Conveyor
from conveyor.cli import main
from conveyor.core.model import NewJob
from tests.apiserver import api_for_tests, serving
from tests.processes import ROOT

APP = "tests.apps.api:app"


def cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_tokens_create_list_and_revoke(db_url: str) -> None:
    code, out, err = cli(
        "tokens",
        "create",
        "--tenant",
        "acme",
        "--role",
        "write",
        "--name",
        "billing",
        "--database-url",
        db_url,
    )
    assert code == 0, err
    secret = out.strip()
    assert secret.startswith("cvt_") and "\n" not in secret
    assert "not shown again" in err
    token_id = secret.split("_")[1]
    code, out, _ = cli("tokens", "list", "--database-url", db_url)
    assert code == 0 and token_id in out and "acme" in out and "billing" in out
    assert secret not in out
    code, out, _ = cli("tokens", "revoke", token_id, "--database-url", db_url)
    assert code == 0 and f"token {token_id} revoked" in out
    code, _, err = cli("tokens", "revoke", "000000000000", "--database-url", db_url)
    assert code == 3 and "no token with id" in err
    code, _, err = cli(
        "tokens", "create", "--tenant", "bad tenant!", "--role", "read", "--database-url", db_url
    )
    assert code == 2 and "tenant" in err


def test_serve_refuses_a_public_address_without_tokens(db_url: str) -> None:
    code, _, err = cli("serve", APP, "--database-url", db_url, "--host", "0.0.0.0")
    assert code == 2
    assert "refusing to serve on 0.0.0.0 with no API token" in err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``conveyor serve --with-worker`` on loopback with no token: (base URL, its token)."""
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CONVEYOR_DATABASE_URL=db_url)
    log = open(tmp_path / "serve.err", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "conveyor",
            "serve",
            APP,
            "--database-url",
            db_url,
            "--port",
            str(port),
            "--with-worker",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    log.close()
    try:
        assert proc.stdout is not None
        token = proc.stdout.readline().decode().strip()
        assert token.startswith("cvt_"), (tmp_path / "serve.err").read_text()
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/health/live").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.err").read_text()
            time.sleep(0.05)
        yield base, token
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.processes
def test_remote_job_commands_against_serve_with_worker(served: tuple[str, str]) -> None:
    base, token = served
    remote = ("--url", base, "--token", token)
    code, out, err = cli("submit", "add", "--payload", '{"a": 20, "b": 22}', "--wait", *remote)
    assert code == 0, err
    assert "submitted" in out and "succeeded" in out and "42" in out
    job_id = out.split()[1]
    code, out, err = cli("jobs", "list", *remote)
    assert code == 0 and job_id[:10] in out and "succeeded" in out, err
    code, out, err = cli("jobs", "show", job_id, *remote)
    assert code == 0 and "attempts" in out and "succeeded" in out, err
    code, out, err = cli("jobs", "cancel", job_id, *remote)
    assert code == 1 and "already succeeded" in err
    code, out, err = cli("submit", "explode", "--wait", *remote)
    assert code == 1
    failed_id = out.split()[1]
    code, out, err = cli("jobs", "retry", failed_id, *remote)
    assert code == 0 and f"job {failed_id} retried as" in out, err
    code, _, err = cli("jobs", "show", "no-such-job", *remote)
    assert code == 3 and "no job with id 'no-such-job'" in err
    code, _, err = cli("submit", "add", "--payload", '{"a": "x"}', *remote)
    assert code == 2 and "invalid payload" in err
    code, _, err = cli("jobs", "list", "--url", base, "--token", "cvt_000000000000_" + "x" * 43)
    assert code == 2 and "refused the token (401)" in err
    code, _, err = cli("jobs", "list", "--url", base)
    assert code == 2 and "needs an API token" in err


def _listed(out: str, ids: list[str]) -> set[str]:
    return {job_id for job_id in ids if job_id in out}


def test_jobs_list_shows_the_same_jobs_locally_and_through_a_server(db_url: str) -> None:
    app = Conveyor(db_url)

    async def a_tree() -> str:
        store = await app.store()
        await store.submit([NewJob(id="tree-root", type="add", payload={})])
        child = NewJob(
            id="tree-leaf", type="add", payload={}, parent_id="tree-root", root_id="tree-root"
        )
        await store.submit([child])
        _, secret = await app.create_token(tenant="default", role="admin")
        await app.close()
        return secret

    secret = asyncio.run(a_tree())
    ids = ["tree-root", "tree-leaf"]
    with serving(app, api_for_tests(app)) as server:
        remote = ("--url", server.base_url, "--token", secret)
        for flags, expected in (((), {"tree-root"}), (("--include-children",), set(ids))):
            code, local_out, err = cli("jobs", "list", *flags, "--database-url", db_url)
            assert code == 0, err
            code, remote_out, err = cli("jobs", "list", *flags, *remote)
            assert code == 0, err
            assert _listed(local_out, ids) == _listed(remote_out, ids) == expected, flags
