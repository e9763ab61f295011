"""PostgreSQL's values: reading its rows, and driving scripts on its cursors.

Times are timestamptz, documents jsonb and lists arrays, all passed natively; ``now`` is
None unless the clock is pinned, and the queries then use the server's ``now()``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, overload

import psycopg
from psycopg.adapt import Buffer, Loader
from psycopg.pq import ExecStatus
from psycopg.rows import tuple_row
from psycopg.types.datetime import TimestamptzLoader

from conveyor.core.jsontext import loads
from conveyor.core.model import Job, Progress
from conveyor.store._queries import load_queries
from conveyor.store._rows import JOB_COLUMNS, Kind, job_picker, job_reader
from conveyor.store.protocol import Lease
from conveyor.store.scripts import (
    Script,
    drive,
    drive_async,
)

T = TypeVar("T")

Q = load_queries("conveyor.store.postgres")


@overload
def utc(value: datetime) -> datetime: ...
@overload
def utc(value: None) -> None: ...
def utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if value.tzinfo is UTC:
        return value
    return value.astimezone(UTC)


_pick_job = operator.itemgetter(*JOB_COLUMNS)  # a dict row's job columns, by name


def returned_rows(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the cursor's last statement returned rows (a query, or RETURNING).

    Read off the result's status: ``cursor.description`` builds a Column object for each
    column on every call, 45 of them for a job row (a third of a job read's client CPU).
    """
    result = cursor.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


def fetch_jobs(conn: psycopg.Connection[Any], query: str, params: Mapping[str, Any]) -> list[Job]:
    """Run a query of conveyor_jobs and read its rows as Jobs, as tuples (no dict per row)."""
    with conn.cursor(row_factory=tuple_row) as cursor:
        cursor.execute(query, params)
        rows = cursor.fetchall()
        result = cursor.pgresult
        if not rows or result is None:
            return []
        pick = job_picker(tuple((result.fname(i) or b"").decode() for i in range(result.nfields)))
        return [_job_of(*pick(row)) for row in rows]


def job_of_row(row: Mapping[str, Any]) -> Job:
    return _job_of(*_pick_job(row))


# How PostgreSQL's values arrive (conveyor/store/_rows.py): documents already read by
# JsonText, lists of ids as lists, times as datetimes (made UTC), booleans as bool.
_READS = {kind: "{}" for kind in Kind} | {
    Kind.TIME: "at({})",
    Kind.IDS: "tuple({}) if {} else ()",
    Kind.STATUS: "STATUS[{}]",
}
_job_of = job_reader(_READS, {}, at=utc)


class JsonText(Loader):
    """Reads a json column with :func:`~conveyor.core.jsontext.loads`, the C scanner alone.

    psycopg's own loader hands the bytes to ``json.loads``, which guesses their encoding
    and matches the whitespace around the document with two regular expressions: more
    than the scan itself for a small payload, once per payload of every job claimed or
    read. PostgreSQL sends json in the client encoding, UTF-8 on conveyor's connections.
    """

    def load(self, data: Buffer) -> Any:
        return loads(str(data, "utf-8"))


def our_loaders(adapters: psycopg.adapt.AdaptersMap) -> None:
    """Read json and timestamptz conveyor's way: on its own connections, and on an
    application's cursor that writes conveyor's rows.

    Frameworks register their own loaders (Django reads json as text, and timestamps
    naive when USE_TZ is off); a cursor's own adapters override them for our rows only.
    """
    adapters.register_loader("json", JsonText)
    adapters.register_loader("timestamptz", TimestamptzLoader)


def run_script(cursor: psycopg.Cursor[Any], script: Script[T], now: datetime | None) -> T:
    """Drive a script on a blocking cursor, in whatever transaction its connection is in:
    each step's query with ``now`` (the pinned time, or None for the server's)."""

    def execute(name: str, params: dict[str, Any]) -> list[Any]:
        cursor.execute(Q[name], params | {"now": now})
        return cursor.fetchall() if returned_rows(cursor) else []

    return drive(script, execute)


async def run_script_async(
    cursor: psycopg.AsyncCursor[Any], script: Script[T], now: datetime | None
) -> T:
    """Drive a script on an async cursor, as :func:`run_script` does on a blocking one."""

    async def execute(name: str, params: dict[str, Any]) -> list[Any]:
        await cursor.execute(Q[name], params | {"now": now})
        return await cursor.fetchall() if returned_rows(cursor) else []

    return await drive_async(script, execute)


def heartbeat_params(
    worker_id: str,
    leases: Sequence[Lease],
    lease: float,
    progress: Mapping[Lease, Progress],
    now: datetime | None,
) -> dict[str, Any]:
    """The parameters of one heartbeat: every lease held or with progress to write."""
    keys = list(dict.fromkeys([*leases, *progress]))
    held = set(leases)
    return {
        "worker_id": worker_id,
        "lease": float(lease),
        "now": now,
        "ids": text_array([k.job_id for k in keys]),
        "tokens": number_array([k.token for k in keys]),
        "renew": bool_array([k in held for k in keys]),
        "done": number_array([float(progress[k].done) if k in progress else None for k in keys]),
        "total": number_array(
            [as_float(progress[k].total) if k in progress else None for k in keys]
        ),
        "message": text_array([progress[k].message if k in progress else None for k in keys]),
    }


def as_float(value: float | None) -> float | None:
    return None if value is None else float(value)


# Arrays of a batch (a settle's, a heartbeat's) are passed as PostgreSQL's text form of an
# array, which the query casts (%(ids)s::text[]): psycopg's list dumper adapts each element
# in Python, 8 ms of client CPU for a settle of 1,000 jobs's twelve arrays; joined here,
# 1.5 ms. Each text is quoted, with its backslashes and double quotes escaped, so any text
# reads back as itself ("NULL" too); None is the unquoted NULL.


def text_array(values: Iterable[str | None]) -> str:
    r"""PostgreSQL's text form of a one-dimensional array of ``values`` (texts or None).

    >>> print(text_array(["a", None, 'say "hi"', "back\\slash", "NULL", "{,}"]))
    {"a",NULL,"say \"hi\"","back\\slash","NULL","{,}"}
    >>> text_array([])
    '{}'
    """
    return "{" + ",".join([_quoted(v) for v in values]) + "}"


def _quoted(value: str | None) -> str:
    if value is None:
        return "NULL"
    if "\\" in value or '"' in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'


def number_array(values: Iterable[float | None]) -> str:
    """PostgreSQL's text form of a one-dimensional array of numbers (ints, floats or
    None), for a ``bigint[]`` or ``float8[]`` cast.

    >>> number_array([1, None, 2.5, float("inf"), -float("inf"), 1e-07])
    '{1,NULL,2.5,Infinity,-Infinity,1e-07}'
    """
    return "{" + ",".join([_number(v) for v in values]) + "}"


def _number(value: float | None) -> str:
    if value is None:
        return "NULL"
    if type(value) is float and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return repr(value)


def bool_array(values: Iterable[bool]) -> str:
    """PostgreSQL's text form of a one-dimensional array of booleans.

    >>> bool_array([True, False])
    '{t,f}'
    """
    return "{" + ",".join(["t" if v else "f" for v in values]) + "}"
