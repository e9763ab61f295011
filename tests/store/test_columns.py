"""The job row's declaration (conveyor/store/_rows.py) agrees with each backend's schema,
and the readers and writers generated from it read and write what a store does."""

from __future__ import annotations

import dataclasses
import re
import sqlite3
from datetime import UTC, datetime

import psycopg
import pytest

from conveyor.core.lifecycle import Status
from conveyor.core.model import Job, NewJob
from conveyor.store import Store
from conveyor.store._queries import load_queries
from conveyor.store._rows import JOB_COLUMNS, JOB_TABLE, SQL_TYPES, SUBMITTED, _by_position
from conveyor.store.sqlite._codec import job_of_row
from conveyor.store.sqlite.backend import parse_sqlite_url


async def test_the_declared_columns_are_those_of_a_freshly_migrated_database(
    store: Store, db_url: str, backend: str
) -> None:
    # ``store`` has opened, so migrated, the database.
    if backend == "sqlite":
        conn = sqlite3.connect(parse_sqlite_url(db_url))
        try:
            found = {
                name: (kind, not notnull and not primary)  # a key is never null
                for _, name, kind, notnull, _, primary in conn.execute(
                    "SELECT * FROM pragma_table_info('conveyor_jobs')"
                )
            }
        finally:
            conn.close()
        # SQLite's own key, the job's creation microsecond, which no job field reads
        # (created_at holds the same time).
        assert found.pop("created_us") == ("INTEGER", False)
    else:
        async with await psycopg.AsyncConnection.connect(db_url) as pg:
            cursor = await pg.execute(
                "SELECT column_name, format_type(atttypid, atttypmod), is_nullable "
                "FROM information_schema.columns "
                "JOIN pg_attribute ON attrelid = 'conveyor_jobs'::regclass "
                "AND attname = column_name "
                "WHERE table_schema = current_schema() AND table_name = 'conveyor_jobs'"
            )
            found = {name: (kind, null == "YES") for name, kind, null in await cursor.fetchall()}
    types = SQL_TYPES[backend]
    declared = {c.name: (types[c.kind], c.null) for c in JOB_TABLE}
    assert found == declared


def test_every_field_of_a_job_is_read_and_every_field_of_a_new_job_written() -> None:
    read = {c.attribute.partition(".")[0] for c in JOB_TABLE}
    assert read == {f.name for f in dataclasses.fields(Job)} - {"below"}  # below: counts
    written = {c.attribute for c in SUBMITTED}
    # run_at and delay decide the run_at column; the store decides the status;
    # payload_text is the payload column's text, when the submit's check wrote it.
    assert written == {f.name for f in dataclasses.fields(NewJob)} - {
        "run_at",
        "delay",
        "payload_text",
    }
    assert len(set(JOB_COLUMNS)) == len(JOB_COLUMNS)


# What a submit's INSERT leaves out of the SUBMITTED columns, and why.
_LEFT_OUT = {
    ("postgres", "submit_one"): {"depends_on"},  # a job without dependencies
}


# The columns the store decides, not a NewJob: the status, the run time and the creation
# time (on SQLite also as the table's key, the creation microsecond).
_DECIDED = {
    "sqlite": {"status", "run_at", "created_us", "created_at"},
    "postgres": {"status", "run_at", "created_at"},
}


def test_each_submit_statement_names_the_declared_columns() -> None:
    for backend, package, names in [
        ("sqlite", "conveyor.store.sqlite", ["insert_job", "insert_jobs"]),
        ("postgres", "conveyor.store.postgres", ["submit", "submit_one"]),
    ]:
        expected = {c.name for c in SUBMITTED} | _DECIDED[backend]
        queries = load_queries(package)
        for name in names:
            match = re.search(r"INSERT INTO conveyor_jobs \(([^)]*)\)", queries[name])
            assert match, name
            columns = {c.strip() for c in match.group(1).split(",")}
            assert columns == expected - _LEFT_OUT.get((backend, name), set()), (backend, name)


def test_a_row_is_read_into_the_job_field_of_each_of_its_columns() -> None:
    # Every column holds a value of its own (a time a second apart from the others, a
    # number its position...), read back by SQLite's reader: each lands in its own field,
    # whatever order the generated reader passes them to Job in (by position).
    values: dict[str, object] = {}
    expected: dict[str, object] = {}
    for i, c in enumerate(JOB_TABLE):
        kind = c.kind.value
        if kind == "text":
            values[c.name] = expected[c.name] = f"{c.name}-value"
        elif kind in ("int", "bigint"):
            values[c.name] = expected[c.name] = 100 + i
        elif kind == "float":
            values[c.name] = expected[c.name] = 100 + i + 0.5
        elif kind == "bool":
            values[c.name], expected[c.name] = 1, True
        elif kind == "json":
            values[c.name], expected[c.name] = f'{{"of": "{c.name}"}}', {"of": c.name}
        elif kind == "time":
            values[c.name] = 1_700_000_000 + i
            expected[c.name] = datetime.fromtimestamp(1_700_000_000 + i, UTC)
        elif kind == "ids":
            values[c.name], expected[c.name] = f'["{c.name}-id"]', (f"{c.name}-id",)
        else:  # a status
            values[c.name], expected[c.name] = "running", Status.RUNNING
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    try:
        select = ", ".join(f"? AS {name}" for name in values)
        row = conn.execute(f"SELECT {select}", list(values.values())).fetchone()
    finally:
        conn.close()
    job = job_of_row(row)
    for c in JOB_TABLE:
        whole, _, part = c.attribute.partition(".")
        read = getattr(getattr(job, whole), part) if part else getattr(job, whole)
        assert read == expected[c.name], c.name
    assert job.below is None  # counts of a tree, which no column holds


def test_a_job_field_no_column_gives_turns_the_reader_s_later_fields_to_keywords() -> None:
    # Positions hold only while the fields come in Job's order with none missing: after a
    # gap (a field added to Job without a column), the rest are passed by keyword.
    names = [f.name for f in dataclasses.fields(Job) if f.name != "below"]
    arguments = {name: f"v_{name}" for name in names if name != "queue"}
    lines = _by_position(arguments)
    assert lines[:2] == ["v_id,  # id", "v_type,  # type"]
    assert lines[2:] == [f"{name}=v_{name}," for name in names[3:]]
    with pytest.raises(RuntimeError, match="no_such_field"):
        _by_position({**arguments, "no_such_field": "x"})
