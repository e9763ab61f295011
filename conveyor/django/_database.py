"""Which database a backend's jobs live in: a conveyor URL made from Django's settings."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

# Keys of a PostgreSQL database's OPTIONS that are libpq connection parameters, carried
# into conveyor's URL. The others (pool, isolation_level, server_side_binding, ...) are
# Django's own and say nothing about where the database is.
_LIBPQ_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "connect_timeout",
    "options",
    "target_session_attrs",
    "passfile",
    "service",
    "application_name",
)


def url_of(settings: Mapping[str, Any], alias: str) -> str:
    """The conveyor URL of a Django database (its ``settings_dict``), or raise ValueError.

    A SQLite database's jobs live in a file of their own beside it (``db.sqlite3``:
    ``db-conveyor.sqlite3``): SQLite has one writer at a time per file, and a worker's
    writes would otherwise queue behind the application's, and the other way round.

    >>> url_of({"ENGINE": "django.db.backends.sqlite3", "NAME": "/srv/app/db.sqlite3"}, "x")
    'sqlite:////srv/app/db-conveyor.sqlite3'
    >>> url_of({"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "app",
    ...         "PASSWORD": "p@ss", "HOST": "db", "PORT": "5432", "OPTIONS": {}}, "x")
    'postgresql://app:p%40ss@db:5432/shop'
    >>> url_of({"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
    ...         "HOST": "/run/postgresql", "OPTIONS": {"sslmode": "disable"}}, "x")
    'postgresql:///shop?host=%2Frun%2Fpostgresql&sslmode=disable'
    """
    engine = str(settings.get("ENGINE", ""))
    if engine.endswith("sqlite3"):
        name = str(settings.get("NAME") or "")
        if not name or name == ":memory:" or "mode=memory" in name:
            raise ValueError(
                f"database {alias!r} is SQLite in memory, which conveyor's worker (another "
                "process) cannot open: give it a file (for tests, DATABASES[...]['TEST']"
                "['NAME'] = a file path), or give the backend its own OPTIONS['URL']"
            )
        path = Path(os.path.abspath(name))
        return f"sqlite:///{path.with_name(f'{path.stem}-conveyor{path.suffix}')}"
    if engine.endswith("postgresql"):
        return _postgres_url(settings)
    raise ValueError(
        f"database {alias!r} uses {engine or 'no ENGINE'}: conveyor runs on PostgreSQL and "
        "SQLite; give the backend its own OPTIONS['URL'] (sqlite:///jobs.db or "
        "postgresql://user@host/db)"
    )


def _postgres_url(settings: Mapping[str, Any]) -> str:
    options = settings.get("OPTIONS") or {}
    user = str(settings.get("USER") or "")
    password = str(settings.get("PASSWORD") or "")
    host = str(settings.get("HOST") or "")
    port = str(settings.get("PORT") or "")
    query = {key: str(options[key]) for key in _LIBPQ_OPTIONS if key in options}
    netloc = ""
    if user:
        netloc = quote(user, safe="") + (f":{quote(password, safe='')}" if password else "")
        netloc += "@"
    if host.startswith("/"):
        # A Unix socket's folder cannot stand in the authority part of a URL.
        query = {"host": host, **({"port": port} if port else {}), **query}
    elif host:
        netloc += f"[{host}]" if ":" in host else host
        netloc += f":{port}" if port else ""
    name = quote(str(settings.get("NAME") or ""), safe="")
    return f"postgresql://{netloc}/{name}" + (f"?{urlencode(query)}" if query else "")
