"""The schema of a PostgreSQL database: its version, and the migrations that bring it up.

Both run on a blocking connection of their own, on a thread: migrating is one
transaction under an advisory lock, which no event loop may hold open.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
from psycopg.rows import DictRow

from conveyor.errors import NotAConveyorDatabase
from conveyor.store.postgres._codec import Q


def schema_version(conn: psycopg.Connection[DictRow], where: str) -> int:
    """Return the last migration applied (0: none), or refuse a database not conveyor's."""
    found = conn.execute(Q["schema_tables"]).fetchone()
    if found is None or not found["migrations"]:
        if found is not None and found["jobs"]:
            raise NotAConveyorDatabase(
                f"database {where} has a conveyor_jobs table that conveyor's migrations "
                "did not create: use another database or schema"
            )
        # Other tables are expected: conveyor usually shares the application's database.
        return 0
    row = conn.execute(Q["schema_version"]).fetchone()
    return int(row["version"]) if row is not None else 0


def apply_migrations(
    conn: psycopg.Connection[DictRow],
    migrations: list[tuple[int, str, str]],
    now: datetime | None,
) -> list[str]:
    """Apply the migrations not applied yet, in one transaction; return their names."""
    applied = []
    with conn.transaction():
        conn.execute(Q["lock_migrations"])
        conn.execute(Q["create_migrations_table"])
        done = {row["version"] for row in conn.execute(Q["applied_migrations"]).fetchall()}
        for version, name, sql in migrations:
            if version in done:
                continue
            conn.execute(sql)
            conn.execute(Q["record_migration"], {"version": version, "name": name, "now": now})
            applied.append(name)
    return applied
