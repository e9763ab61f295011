"""Loading of a backend's named queries from its ``queries.sql``.

Each query is introduced by ``-- name: NAME`` and a one-line purpose comment; the name
matches the backend method that runs it.
"""

from __future__ import annotations

import re
from importlib import resources

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(package: str) -> dict[str, str]:
    """Return the named queries in ``package``'s ``queries.sql``."""
    text = resources.files(package).joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name!r} is defined twice in {package}/queries.sql")
        queries[name] = body.strip().rstrip(";")
    return queries


def load_migrations(package: str) -> list[tuple[int, str, str]]:
    """Return ``(version, name, sql)`` for each numbered migration file, in order."""
    folder = resources.files(package).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [v for v, _, _ in found]
    if versions != list(range(1, len(versions) + 1)):
        raise RuntimeError(f"migrations in {package} are not numbered 1..n: {versions}")
    return found


def statements(sql: str) -> list[str]:
    """The statements of a migration's text, one at a time (for a driver that runs one
    statement a call). Comment lines may hold semicolons: they are dropped first, and the
    rest split at each one.

    >>> statements("-- one; two\\nCREATE TABLE t (a);\\n\\nDROP TABLE t;")
    ['CREATE TABLE t (a)', 'DROP TABLE t']
    """
    code = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in code.split(";") if s.strip()]
