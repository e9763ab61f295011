"""Bad input gets a clear error and stores nothing."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor import (
    ConfigurationError,
    Conveyor,
    DatabaseUnavailable,
    IdempotencyConflict,
    InvalidPayload,
    JobContext,
    NotAConveyorDatabase,
    UnknownJobType,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def typed(app: Conveyor) -> Conveyor:
    @app.job()
    async def resize(ctx: JobContext, path: str, width: int, keep_ratio: bool = True) -> None:
        return None

    return app


async def nothing_stored(app: Conveyor) -> bool:
    return await app.list_jobs() == []


async def test_unknown_job_type(typed: Conveyor) -> None:
    with pytest.raises(UnknownJobType, match=r"unknown job type 'rezise'.*known types: resize"):
        await typed.submit("rezise", {"path": "a.png", "width": 3})
    assert await nothing_stored(typed)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"path": "a.png"}, r"width: Field required"),
        ({"path": "a.png", "width": "wide"}, r"width: Input should be a valid integer"),
        ({"path": "a.png", "width": 3, "colour": "red"}, r"colour: unexpected argument"),
        (["a.png", 3], r"a JSON object of keyword arguments"),
    ],
)
async def test_payload_not_matching_the_signature(
    typed: Conveyor, payload: object, message: str
) -> None:
    with pytest.raises(InvalidPayload, match=message):
        await typed.submit("resize", payload)  # type: ignore[arg-type]
    assert await nothing_stored(typed)


async def test_payload_that_is_not_json(app: Conveyor) -> None:
    @app.job()
    async def anything(ctx: JobContext, value: object) -> None:
        return None

    with pytest.raises(InvalidPayload, match="not JSON-serialisable"):
        await app.submit("anything", {"value": object()})
    with pytest.raises(InvalidPayload, match="must be finite"):
        await app.submit("anything", {"value": float("nan")})
    with pytest.raises(InvalidPayload, match="NUL"):
        await app.submit("anything", {"value": "a\x00b"})
    assert await nothing_stored(app)


async def test_bulk_submit_with_one_bad_job_stores_none(typed: Conveyor) -> None:
    from conveyor import Submission

    good = Submission("resize", {"path": "a.png", "width": 3})
    bad = Submission("resize", {"path": "b.png"})
    with pytest.raises(InvalidPayload):
        await typed.submit_many([good, bad])
    assert await nothing_stored(typed)


async def test_same_id_with_another_payload_conflicts(typed: Conveyor) -> None:
    first = await typed.submit("resize", {"path": "a.png", "width": 3}, id="req-1")
    again = await typed.submit("resize", {"path": "a.png", "width": 3}, id="req-1")
    assert again.id == first.id
    with pytest.raises(IdempotencyConflict, match="use a new id"):
        await typed.submit("resize", {"path": "b.png", "width": 3}, id="req-1")
    assert len(await typed.list_jobs()) == 1


@pytest.mark.parametrize(
    "url", ["mysql://localhost/db", "sqlite:/relative.db", "sqlite:///", "not a url"]
)
def test_malformed_database_url(url: str) -> None:
    with pytest.raises(ConfigurationError, match=r"sqlite:///"):
        Conveyor(url)


async def test_memory_database_is_refused_with_a_reason() -> None:
    with pytest.raises(ConfigurationError, match="cannot be shared"):
        Conveyor("sqlite:///:memory:")


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/nonexistent-folder/x/conveyor.db", "does not exist"),
        ("/proc/conveyor.db", "cannot open SQLite database"),
    ],
)
async def test_unwritable_database_path(path: str, message: str) -> None:
    app = Conveyor(f"sqlite:///{path}")
    with pytest.raises((ConfigurationError, DatabaseUnavailable), match=message):
        await app.list_jobs()


async def test_database_path_that_is_a_folder(tmp_path: Path) -> None:
    app = Conveyor(f"sqlite:///{tmp_path}")
    with pytest.raises(ConfigurationError, match="is a directory"):
        await app.list_jobs()


async def test_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database" * 100)
    app = Conveyor(f"sqlite:///{path}")
    with pytest.raises(NotAConveyorDatabase, match="is not a SQLite database"):
        await app.list_jobs()
    assert path.read_bytes().startswith(b"these are my notes")


async def test_sqlite_database_of_another_application(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    app = Conveyor(f"sqlite:///{path}")
    with pytest.raises(NotAConveyorDatabase, match=r"not conveyor's.*orders"):
        await app.list_jobs()
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"orders"}


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_reports_errors_with_exit_codes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    app = ("--app", "examples.app:app", "--database-url", url)

    unknown = cli("submit", "nope", *app)
    assert unknown.returncode == 2
    assert "unknown job type 'nope'" in unknown.stderr

    bad_json = cli("submit", "add", "--payload", "{a: 1}", *app)
    assert bad_json.returncode == 2
    assert "not valid JSON" in bad_json.stderr

    mismatch = cli("submit", "add", "--payload", '{"a": 1}', *app)
    assert mismatch.returncode == 2
    assert "b: Field required" in mismatch.stderr

    assert cli("migrate", "--database-url", url).returncode == 0
    missing = cli("jobs", "show", "no-such-id", "--database-url", url)
    assert missing.returncode == 3
    assert "no job with id 'no-such-id'" in missing.stderr

    bad_url = cli("jobs", "list", "--database-url", "mysql://x/y")
    assert bad_url.returncode == 2
    assert "malformed database URL" in bad_url.stderr

    bad_app = cli("worker", "examples.app")
    assert bad_app.returncode == 2
    assert "module:attribute" in bad_app.stderr

    listed = cli("jobs", "list", "--database-url", url)
    assert listed.returncode == 0 and "0 job(s)" in listed.stdout


def test_cli_submit_and_wait_runs_end_to_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    app = ("--app", "examples.app:app", "--database-url", url)
    submitted = cli("submit", "add", "--payload", '{"a": 2, "b": 3}', *app)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[1]
    worked = cli("worker", "examples.app:app", "--database-url", url, "--burst")
    assert worked.returncode == 0, worked.stderr
    shown = cli("jobs", "show", job_id, "--database-url", url)
    assert shown.returncode == 0
    assert "succeeded" in shown.stdout and "5" in shown.stdout
