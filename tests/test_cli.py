"""The ``conveyor`` command as scripts and people use it: JSON output, durations, status
words, unwrapped lines, health verdicts, and messages that say what to do. Behaviour of
the process itself (exit codes, signals) is tested on the real command, as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from conveyor import Conveyor, Status
from conveyor.core.model import NewJob
from tests.apiserver import api_for_tests, serving

from .apps.cli import app as cli_app
from .helpers import eventually, running_worker, settled

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.apps.cli:app"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# `python -m conveyor` taking Ctrl-C as from a terminal. A shell starts a background command
# (a suite run with `&`) with SIGINT ignored, every process below inherits that, and Python
# then leaves it ignored: the Ctrl-C tests would send their SIGINT to a deaf process.
_CONVEYOR_HEARING_CTRL_C = (
    sys.executable,
    "-c",
    "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "runpy.run_module('conveyor', run_name='__main__', alter_sys=True)",
)


@contextlib.asynccontextmanager
async def _ctrl_c_target(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """Start ``conveyor ARGS`` with pipes for its output; kill it if the test fails first."""
    proc = await asyncio.create_subprocess_exec(
        *_CONVEYOR_HEARING_CTRL_C, *args,
        cwd=ROOT, env=_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def cli(*args: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``conveyor ARGS`` as a process, stdout and stderr not a terminal."""
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def acli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, *args, cwd=cwd)


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    """The CLI tests' application on a fresh database, as ``tests.apps.cli:app``."""
    cli_app.use_database(db_url)
    yield cli_app
    await cli_app.close()


@pytest.fixture
def worker(db_url: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real worker process of ``tests.apps.cli:app`` on the database under test."""
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "conveyor", "worker", APP, "--database-url", db_url),
            *("--lease", "2s", "--poll-interval", "100ms", "--grace", "1s"),
        ],
        cwd=ROOT,
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- JSON for scripts -------------------------------------------------------------------


async def test_read_commands_print_json(app: Conveyor, db_url: str) -> None:
    now = await app.submit("build_report", {"months": 3}, id="report-now")
    later = await app.submit("build_report", {"months": 4}, id="report-later", delay="1h")
    await app.create_token(tenant="acme", role="read", name="ci")

    listed = await acli("jobs", "list", "--json", "--database-url", db_url)
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)["jobs"]
    assert {j["id"]: j["shown_status"] for j in jobs} == {
        now.id: "queued",
        later.id: "scheduled",
    }
    assert all("lease_token" not in j for j in jobs)

    shown = await acli("jobs", "show", now.id, "--json", "--database-url", db_url)
    document = json.loads(shown.stdout)
    assert document["id"] == now.id and document["payload"] == {"months": 3}
    assert document["attempts"] == [] and document["status"] == "queued"
    assert document["hint"].startswith("no worker has heartbeated on this database")

    tokens = json.loads((await acli("tokens", "list", "--json", "--database-url", db_url)).stdout)
    (token,) = tokens["tokens"]
    assert token["tenant"] == "acme" and "secret_hash" not in token

    schedules = await acli("schedules", "list", "--json", "--database-url", db_url)
    assert json.loads(schedules.stdout) == {"schedules": []}

    queues = await acli("queues", "list", "--json", "--database-url", db_url)
    assert queues.returncode == 0, queues.stderr
    (queue,) = json.loads(queues.stdout)["queues"]
    assert queue["name"] == "default" and queue["paused"] is False
    assert queue["counts"]["queued"] == 2  # the delayed job is queued, not yet due


async def test_status_gives_the_verdict_and_counts_of_health_ready(
    app: Conveyor, db_url: str
) -> None:
    await app.submit("build_report", {"months": 1})
    _, secret = await app.create_token(tenant="ops", role="admin")
    transport = httpx.ASGITransport(app=api_for_tests(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        admin = {"Authorization": f"Bearer {secret}"}
        ready = (await client.get("/health/ready", headers=admin)).json()
    status = await acli("status", "--json", "--database-url", db_url)
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)
    assert document["health"] == ready
    assert document["health"]["status"] == "degraded"
    assert document["hint"] == (
        "no worker has heartbeated on this database — start one with `conveyor worker APP`"
    )
    table = await acli("status", "--database-url", db_url)
    assert table.stdout.startswith("degraded: 0 live, 0 dead of 0 worker(s)")
    assert "no worker has heartbeated on this database" in table.stdout


async def test_status_counts_a_live_worker_then_its_clean_stop(
    app: Conveyor, db_url: str, worker: subprocess.Popen[bytes]
) -> None:
    async def live() -> bool:
        return (await app.health()).counts.live_workers == 1

    await eventually(live, timeout=60)
    document = json.loads((await acli("status", "--json", "--database-url", db_url)).stdout)
    assert document["health"]["status"] == "healthy" and document["hint"] is None
    (w,) = document["workers"]
    assert w["state"] == "live" and w["lease"] == 2.0
    worker.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.wait, 30) == 0
    document = json.loads((await acli("status", "--json", "--database-url", db_url)).stdout)
    assert document["health"]["status"] == "unhealthy"
    assert [w["state"] for w in document["workers"]] == ["stopped"]


async def test_a_killed_worker_is_dead_once_its_lease_has_passed(
    app: Conveyor, db_url: str, worker: subprocess.Popen[bytes]
) -> None:
    async def live() -> bool:
        return (await app.health()).counts.live_workers == 1

    await eventually(live, timeout=60)
    worker.kill()  # no deregistration: only its silence tells
    await asyncio.to_thread(worker.wait, 30)

    async def dead() -> bool:
        return (await app.health()).counts.dead_workers == 1

    await eventually(dead, timeout=60)  # its lease is 2 s
    document = json.loads((await acli("status", "--json", "--database-url", db_url)).stdout)
    assert document["health"]["status"] == "unhealthy"
    assert (document["health"]["live_workers"], document["health"]["dead_workers"]) == (0, 1)
    assert [w["state"] for w in document["workers"]] == ["dead"]


# -- status words, durations, tracebacks, cancel --wait -----------------------------------


async def test_status_filters_accept_the_words_the_tables_print(app: Conveyor, db_url: str) -> None:
    await app.submit("build_report", {"months": 3}, id="due-now")
    await app.submit("build_report", {"months": 4}, id="due-later", delay="1h")
    for word, expected in (("scheduled", ["due-later"]), ("queued", ["due-now", "due-later"])):
        listed = await acli("jobs", "list", "--status", word, "--json", "--database-url", db_url)
        assert listed.returncode == 0, listed.stderr
        assert sorted(j["id"] for j in json.loads(listed.stdout)["jobs"]) == sorted(expected)
    retrying = await acli("jobs", "list", "-s", "retrying", "--database-url", db_url)
    assert retrying.returncode == 0 and "0 job(s)" in retrying.stdout
    wrong = await acli("jobs", "list", "-s", "sheduled", "--database-url", db_url)
    assert wrong.returncode == 2
    assert "use one of pending, queued, running" in wrong.stderr and "scheduled" in wrong.stderr


def test_durations_are_accepted_where_seconds_were(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    burst = cli("worker", APP, "--database-url", url, "--burst", "--lease", "2s", "--grace", "1m")
    assert burst.returncode == 0, burst.stderr
    assert "lease 2.0s" in burst.stderr
    bad = cli("worker", APP, "--database-url", url, "--burst", "--lease", "2 fortnights")
    assert bad.returncode == 2
    assert "Invalid value for '--lease'" in bad.stderr and "'30s'" in bad.stderr


async def test_submit_wait_without_a_worker_says_none_is_live(db_url: str) -> None:
    waited = await acli(
        "submit", "build_report", "-p", '{"months": 2}', "--app", APP, "--database-url", db_url,
        "--wait", "--timeout", "500ms",
    )  # fmt: skip
    assert waited.returncode == 1
    message = (
        "no worker has heartbeated on this database — start one with "
        "`conveyor worker tests.apps.cli:app`"
    )
    assert f"warning: {message}" in waited.stderr
    assert f"still queued after 0.5s: {message}" in waited.stderr


async def test_jobs_show_traceback_prints_the_failed_attempts_traceback(
    app: Conveyor, db_url: str, worker: subprocess.Popen[bytes]
) -> None:
    job = await app.submit("explode", {"why": "on purpose"})
    await job.wait(timeout=60)
    assert job.status is Status.FAILED
    plain = await acli("jobs", "show", job.id, "--database-url", db_url)
    assert "Traceback (most recent call last)" not in plain.stdout
    shown = await acli("jobs", "show", job.id, "--traceback", "--database-url", db_url)
    assert shown.returncode == 0, shown.stderr
    assert "traceback of attempt 1 (failed)" in shown.stdout
    assert "Traceback (most recent call last)" in shown.stdout
    assert "ValueError: exploded: on purpose" in shown.stdout
    document = json.loads(
        (await acli("jobs", "show", job.id, "--json", "--database-url", db_url)).stdout
    )
    assert "ValueError" in document["attempts"][0]["traceback"]


async def test_jobs_cancel_wait_returns_once_the_job_has_stopped(
    app: Conveyor, db_url: str, worker: subprocess.Popen[bytes]
) -> None:
    job = await app.submit("sleepy", {})

    async def running() -> bool:
        return (await job.refresh()).status is Status.RUNNING

    await eventually(running, timeout=60)
    cancelled = await acli(
        "jobs", "cancel", job.id, "--wait", "--timeout", "1m", "--database-url", db_url
    )
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"job {job.id} cancelled and stopped" in cancelled.stdout
    assert (await job.refresh()).status is Status.CANCELLED


# -- lines off a terminal ------------------------------------------------------------------


async def test_ids_and_messages_are_never_wrapped_off_a_terminal(
    app: Conveyor, db_url: str
) -> None:
    long_id = "order-" + "0123456789" * 9
    await app.submit("build_report", {"months": 3}, id=long_id)
    listed = await acli("jobs", "list", "--database-url", db_url)
    assert any(long_id in line for line in listed.stdout.splitlines()), listed.stdout
    missing = await acli("jobs", "show", "x" * 150, "--database-url", db_url)
    assert missing.returncode == 3
    assert len(missing.stderr.strip().splitlines()) == 1


# -- messages that say what to do ---------------------------------------------------------


def test_a_read_command_on_a_missing_sqlite_file_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "reprts.db"
    listed = cli("jobs", "list", "--database-url", f"sqlite:///{typo}")
    assert listed.returncode == 2
    assert f"no database at {typo}" in listed.stderr and "--database-url" in listed.stderr
    assert "nothing was created" in listed.stderr
    bare = cli("jobs", "list", cwd=tmp_path)  # no --app, no URL: sqlite:///conveyor.db
    assert bare.returncode == 2 and "no database at" in bare.stderr
    for command in (["status"], ["tokens", "list"], ["schedules", "list"], ["jobs", "show", "x"]):
        assert cli(*command, cwd=tmp_path).returncode == 2
    assert list(tmp_path.iterdir()) == []


def test_a_module_that_fails_to_import_shows_its_real_error(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import nonexistent_dep\n")
    (tmp_path / "jobs.py").write_text("from conveyor import Conveyor\napp = Conveyor()\n")
    broken = cli("worker", "broken:app", cwd=tmp_path)
    assert broken.returncode == 2
    assert (
        "module 'broken' was found but importing it failed: ModuleNotFoundError: "
        "No module named 'nonexistent_dep'" in broken.stderr
    )
    assert "Traceback (most recent call last)" in broken.stderr
    assert 'broken.py", line 1' in broken.stderr

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise RuntimeError('bad settings')\n")
    (tmp_path / "pkg" / "jobs.py").write_text("")
    package = cli("worker", "pkg.jobs:app", cwd=tmp_path)
    assert package.returncode == 2
    assert "module 'pkg.jobs' was found but importing it failed: RuntimeError" in package.stderr

    absent = cli("worker", "jbos:app", cwd=tmp_path)
    assert absent.returncode == 2 and "cannot find module 'jbos'" in absent.stderr

    typo = cli("worker", "jobs:ap", cwd=tmp_path)
    assert typo.returncode == 2
    assert "module 'jobs' has no attribute 'ap' (Conveyor instances there: app)" in typo.stderr


def test_serve_on_a_busy_port_exits_2_saying_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = cli(
            "serve", APP, "--port", str(port), "--database-url", f"sqlite:///{tmp_path / 'c.db'}"
        )
    assert served.returncode == 2
    assert f"port {port} is in use on 127.0.0.1" in served.stderr
    assert "Started server process" not in served.stderr


async def test_ctrl_c_during_submit_wait_says_the_job_keeps_running(db_url: str) -> None:
    submit = ("submit", "build_report", "-p", '{"months": 1}', "--app", APP, "--wait")
    async with _ctrl_c_target(*submit, "--database-url", db_url) as proc, asyncio.timeout(60):
        assert proc.stdout is not None and proc.stderr is not None
        line = (await proc.stdout.readline()).decode()
        assert line.startswith("submitted "), line
        job_id = line.split()[1]
        # Waiting has begun once the no-worker warning is out.
        while not (line := (await proc.stderr.readline()).decode()).startswith("warning:"):
            assert line, "the command ended before it began to wait"
        assert line.startswith("warning: no worker has heartbeated"), line
        proc.send_signal(signal.SIGINT)
        rest = (await proc.stderr.read()).decode()
        assert await proc.wait() == 130
    assert f"stopped waiting; job {job_id} is still queued and keeps going" in rest
    assert f"`conveyor jobs show {job_id} --follow`" in rest
    assert f"`conveyor jobs cancel {job_id}`" in rest
    check = Conveyor(db_url)
    try:
        assert (await check.get(job_id)).status is Status.QUEUED
    finally:
        await check.close()


def test_a_misspelled_job_type_gets_a_did_you_mean(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    typo = cli("submit", "build_reprot", "-p", '{"months": 1}', "--app", APP, "--database-url", url)
    assert typo.returncode == 2
    assert "unknown job type 'build_reprot' (did you mean 'build_report'?)" in typo.stderr


def test_postgres_url_mistakes_are_configuration_errors_naming_the_flag() -> None:
    bogus = cli("jobs", "list", "--database-url", "postgresql://u@127.0.0.1/db?sslmode=bogus")
    assert bogus.returncode == 2
    assert "sslmode 'bogus' is not one of disable, allow, prefer" in bogus.stderr
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, not listening: connections are refused
        refused = cli("jobs", "list", "--database-url", f"postgresql://u@127.0.0.1:{port}/db")
    assert refused.returncode == 4
    assert "(--database-url)" in refused.stderr and "CONVEYOR_DATABASE_URL" not in refused.stderr


def test_through_a_server_json_and_hints_work_and_httpx_logs_nothing(db_url: str) -> None:
    app = Conveyor(db_url)

    async def prepare() -> tuple[str, str]:
        store = await app.store()
        await store.submit([NewJob(id="remote-job", type="build_report", payload={"months": 1})])
        _, secret = await app.create_token(tenant="default", role="admin")
        await app.close()
        return "remote-job", secret

    job_id, secret = asyncio.run(prepare())
    with serving(app, api_for_tests(app)) as server:
        remote = ("--url", server.base_url, "--token", secret)
        listed = cli("jobs", "list", "--json", *remote)
        shown = cli("jobs", "show", job_id, *remote)
    assert listed.returncode == 0, listed.stderr
    assert [j["id"] for j in json.loads(listed.stdout)["jobs"]] == [job_id]
    assert "no worker has heartbeated on this database" in shown.stdout
    for done in (listed, shown):
        assert "HTTP Request" not in done.stderr


async def test_rest_422_for_an_unknown_type_speaks_to_the_api_client(app: Conveyor) -> None:
    _, secret = await app.create_token(tenant="default", role="write")
    transport = httpx.ASGITransport(app=api_for_tests(app))
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        r = await client.post(
            "/jobs",
            json={"type": "build_reprot", "payload": {"months": 1}},
            headers={"Authorization": f"Bearer {secret}"},
        )
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail.startswith("unknown job type 'build_reprot' (did you mean 'build_report'?)")
    assert "this server runs: build_report, explode, part, parts, sleepy" in detail
    assert "@app.job" not in detail


def test_shell_completion_is_generated_by_the_documented_variable() -> None:
    env = _env() | {"_CONVEYOR_COMPLETE": "bash_source"}
    done = subprocess.run(
        [sys.executable, "-c", "from conveyor.cli import main; main(prog_name='conveyor')"],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "_conveyor_completion" in done.stdout
    readme = (ROOT / "README.md").read_text()
    assert 'eval "$(_CONVEYOR_COMPLETE=bash_source conveyor)"' in readme


async def test_ctrl_c_while_following_a_job_exits_130_and_leaves_it_alone(
    app: Conveyor, db_url: str
) -> None:
    job = await app.submit("build_report", {"months": 1})
    follow = ("jobs", "show", job.id, "--follow", "--database-url", db_url)
    async with _ctrl_c_target(*follow) as proc, asyncio.timeout(60):
        assert proc.stderr is not None
        while not (line := (await proc.stderr.readline()).decode()).startswith("warning:"):
            assert line, "the command ended before it began to follow"
        proc.send_signal(signal.SIGINT)
        rest = (await proc.stderr.read()).decode()
        assert await proc.wait() == 130
    assert f"stopped waiting; job {job.id} is still queued and keeps going" in rest
    assert (await job.refresh()).status is Status.QUEUED


async def test_bulk_jobs_in_the_cli_list_show_and_retry_a_tree(app: Conveyor, db_url: str) -> None:
    root = await app.submit("parts", {"n": 3})
    async with running_worker(app):
        await settled(root, Status.FAILED)
    at = ("--database-url", db_url)
    top = json.loads((await acli("jobs", "list", "--json", *at)).stdout)["jobs"]
    every = json.loads((await acli("jobs", "list", "--children", "--json", *at)).stdout)["jobs"]
    parent = await acli("jobs", "list", "--parent", root.id, "--json", *at)
    tree = await acli("jobs", "list", "--root", root.id, "--json", *at)
    assert [j["id"] for j in top] == [root.id] and len(every) == 4
    assert len(json.loads(parent.stdout)["jobs"]) == len(json.loads(tree.stdout)["jobs"]) == 3
    shown = await acli("jobs", "show", root.id, *at)
    assert "3/3 done: 2 succeeded, 1 failed" in shown.stdout, shown.stdout
    assert "submitted by  local" in shown.stdout and f"{root.id}.2" in shown.stdout
    document = json.loads((await acli("jobs", "show", root.id, "--json", *at)).stdout)
    assert document["below"]["total"] == 3 and len(document["children"]) == 3
    retried = await acli("jobs", "retry", "--failed-children", root.id, *at)
    assert retried.returncode == 0, retried.stderr
    assert f"job {root.id}.0 retried as" in retried.stdout
    assert f"1 failed job(s) below {root.id} retried" in retried.stdout
    assert (await app.get(root.id)).status is Status.WAITING


async def test_jobs_show_lists_sub_jobs_in_natural_order(app: Conveyor, db_url: str) -> None:
    """Issue #30 item 11: they read .0, .1, .10, .11, .2."""
    root = await app.submit("parts", {"n": 12})
    async with running_worker(app):
        await settled(root, Status.FAILED)
    at = ("--database-url", db_url)
    document = json.loads((await acli("jobs", "show", root.id, "--json", *at)).stdout)
    assert [c["id"] for c in document["children"]] == [f"{root.id}.{i}" for i in range(12)]


async def test_a_job_in_a_queue_no_live_worker_serves_is_pointed_out(
    app: Conveyor, db_url: str, worker: subprocess.Popen[bytes]
) -> None:
    """Issue #30 item 9: status and jobs show said nothing of it."""

    async def live() -> bool:
        return (await app.health()).counts.live_workers == 1

    await eventually(live, timeout=60)
    stray = await app.submit("build_report", {"months": 1}, queue="stray")
    at = ("--database-url", db_url)
    document = json.loads((await acli("status", "--json", *at)).stdout)
    assert document["unserved_queues"] == {"stray": 1}
    said = "queued in queue 'stray', which no live worker serves: start a worker with"
    table = " ".join((await acli("status", *at)).stdout.split())
    assert f"note: 1 job {said} `--queues stray`" in table, table
    shown = " ".join((await acli("jobs", "show", stray.id, *at)).stdout.split())
    assert f"this job is {said}" in shown, shown
    # Through a server too: its /workers says which workers are live.
    _, secret = await app.create_token(tenant="default", role="admin")
    served = Conveyor(db_url)  # the server's own, on the server's event loop
    with serving(served, api_for_tests(served)) as server:
        remote = ("--url", server.base_url, "--token", secret)
        done = await acli("jobs", "show", stray.id, *remote)
    shown = " ".join(done.stdout.split())
    assert f"this job is {said}" in shown, (shown, done.stderr)


def test_tenant_limits_are_taken_from_the_command_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    good = ("--tenant-limit", "acme:concurrency=2,rate=10/s", "--tenant-limit", "*:max_queued=5")
    burst = cli("worker", APP, "--database-url", url, "--burst", *good)
    assert burst.returncode == 0, burst.stderr
    bad = cli("worker", APP, "--database-url", url, "--burst", "--tenant-limit", "acme:speed=9")
    assert bad.returncode == 2
    assert "invalid tenant limit 'acme:speed=9'" in bad.stderr and "concurrency=N" in bad.stderr
