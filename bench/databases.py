"""Scratch databases: a fresh, empty database for every benchmark run, removed afterwards."""

from __future__ import annotations

import os
import secrets
import shutil
import sqlite3
import tempfile
import urllib.parse
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
POSTGRES_URL_ENV = "CONVEYOR_BENCH_POSTGRES_URL"


def sqlite_url(path: Path) -> str:
    """Return the URL of an SQLite file (``sqlite:////abs/path.db`` for absolute paths)."""
    return f"sqlite:///{path}"


def sqlite_path(url: str) -> str:
    """Return the file path inside an ``sqlite:///`` URL."""
    if not url.startswith("sqlite:///"):
        raise ValueError(f"not an sqlite URL: {url!r}")
    return url.removeprefix("sqlite:///")


class Scratch(ABC):
    """Hands out fresh databases of one backend and removes them all when closed."""

    @abstractmethod
    @contextmanager
    def fresh(self) -> Iterator[str]:
        """Yield the URL of a new empty database, removed when the block exits."""

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """Return versions and durability settings, for the report."""

    @abstractmethod
    def close(self) -> None:
        """Remove everything this scratch created, even after a failure."""


class SqliteScratch(Scratch):
    """One SQLite file per run inside a private temporary directory."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="conveyor_bench_"))
        self._count = 0

    @contextmanager
    def fresh(self) -> Iterator[str]:
        self._count += 1
        path = self.directory / f"run{self._count}.db"
        try:
            yield sqlite_url(path)
        finally:
            for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                leftover.unlink(missing_ok=True)

    def describe(self) -> dict[str, str]:
        return {
            "sqlite_version": sqlite3.sqlite_version,
            "sqlite_dir": str(self.directory),
            # A tmpfs directory makes fsync free and the figures meaningless.
            "sqlite_dir_filesystem": _filesystem_type(self.directory),
        }

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class PostgresScratch(Scratch):
    """One ``conveyor_bench_<token>_<n>`` database per run on the server at ``base_url``."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.prefix = f"conveyor_bench_{secrets.token_hex(4)}"
        self._created: list[str] = []
        self._admin = psycopg.connect(base_url, autocommit=True)

    @contextmanager
    def fresh(self) -> Iterator[str]:
        name = f"{self.prefix}_{len(self._created) + 1}"
        self._admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._created.append(name)
        try:
            yield _replace_database(self.base_url, name)
        finally:
            self._drop(name)

    def describe(self) -> dict[str, str]:
        settings = (
            "server_version",
            "fsync",
            "synchronous_commit",
            "wal_sync_method",
            "full_page_writes",
        )
        info = {}
        for setting in settings:
            row = self._admin.execute(sql.SQL("SHOW {}").format(sql.Identifier(setting))).fetchone()
            info[f"postgres_{setting}"] = str(row[0]) if row else "?"
        return info

    def close(self) -> None:
        try:
            for name in list(self._created):
                self._drop(name)
        finally:
            self._admin.close()

    def _drop(self, name: str) -> None:
        # FORCE ends connections a crashed or interrupted worker process may have left behind.
        self._admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if name in self._created:
            self._created.remove(name)


@contextmanager
def open_scratch(backend: str) -> Iterator[Scratch]:
    """Yield the scratch for ``backend`` and clean it up on exit, whatever happened."""
    scratch: Scratch
    if backend == "sqlite":
        scratch = SqliteScratch()
    elif backend == "postgres":
        scratch = PostgresScratch(os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL))
    else:
        raise ValueError(f"unknown backend {backend!r}")
    try:
        yield scratch
    finally:
        scratch.close()


def _replace_database(url: str, name: str) -> str:
    """Return ``url`` pointing at database ``name`` instead."""
    return urllib.parse.urlsplit(url)._replace(path=f"/{name}").geturl()


def _filesystem_type(path: Path) -> str:
    """Return the filesystem type of the mount holding ``path``, from /proc/mounts."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    best, kind = "", "unknown"
    resolved = str(path.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = fields[1]
        inside = resolved == mount_point or resolved.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > len(best):
            best, kind = mount_point, fields[2]
    return kind
