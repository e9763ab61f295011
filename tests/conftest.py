"""Shared fixtures: every behavioural test runs against a real SQLite file and a real
PostgreSQL database created for it (and dropped afterwards)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conveyor import Conveyor
from conveyor.store import Store, create_store
from tests.helpers import FakeClock
from tests.processes import WorkerProcesses

POSTGRES_URL = os.environ.get(
    "CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
BACKENDS = [b for b in os.environ.get("CONVEYOR_TEST_BACKENDS", "sqlite,postgres").split(",") if b]


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    return f"{base}/{name}"


@contextlib.contextmanager
def _new_postgres_database() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    name = f"conveyor_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            raise RuntimeError(
                f"PostgreSQL is unreachable at {POSTGRES_URL} ({exc}); start it or set "
                "CONVEYOR_TEST_POSTGRES_URL"
            ) from exc
        pytest.skip(f"PostgreSQL unreachable at {POSTGRES_URL}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_database(POSTGRES_URL, name)
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A new, uniquely named PostgreSQL database; dropped at the end of the test."""
    with _new_postgres_database() as url:
        yield url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A URL of a fresh database on the backend under test."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'conveyor.db'}"
    if backend == "postgres":
        return str(request.getfixturevalue("postgres_database"))
    raise ValueError(f"unknown backend {backend!r} in CONVEYOR_TEST_BACKENDS")


@pytest.fixture
def second_db_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """Another fresh database on the same backend, for tests that compare two."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'second.db'}"
    else:
        with _new_postgres_database() as url:
            yield url


@pytest.fixture
async def app(db_url: str) -> AsyncIterator[Conveyor]:
    """An application on a fresh database, closed after the test."""
    application = Conveyor(db_url)
    yield application
    await application.close()


@pytest.fixture
def clock() -> FakeClock | None:
    """The time stores under test run on: pinned, so lease expiry is deterministic.

    A module that tests the database's own clock overrides this with ``None``.
    """
    return FakeClock()


@pytest.fixture
async def store(db_url: str, clock: FakeClock | None) -> AsyncIterator[Store]:
    """An open store on a fresh database, on the ``clock`` fixture's time."""
    s = create_store(db_url, clock=clock)
    await s.open()
    yield s
    await s.close()


@pytest.fixture
def workers(db_url: str, tmp_path: Path) -> Iterator[WorkerProcesses]:
    """Real worker processes on the test's database; killed at the end of the test."""
    procs = WorkerProcesses(db_url, tmp_path / "runs.log", tmp_path)
    yield procs
    procs.stop_all()


@pytest.fixture
async def procs_app(db_url: str) -> AsyncIterator[Conveyor]:
    """The application the worker processes run (tests/apps/procs.py), migrated."""
    from tests.apps import procs

    application = procs.app
    application.url = db_url
    await application.migrate()
    yield application
    await application.close()


def pytest_configure(config: pytest.Config) -> None:
    # Fails a run of the whole store contract that never called some store operation.
    from tests.store.recording import ContractCheck

    config.pluginmanager.register(ContractCheck(config), "conveyor-store-contract")
