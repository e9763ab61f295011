"""The job row, declared once: each column of conveyor_jobs, how each dialect stores it,
and the readers and writers both stores derive from that declaration.

:data:`JOB_TABLE` is the one list of the job row's columns. Each column has a
:class:`Kind` (how its values are stored: SQLite and PostgreSQL have a type per kind,
:data:`SQL_TYPES`), whether it may be null, the attribute of :class:`~conveyor.core.model.Job`
it is read into, and whether a submit writes it from the :class:`~conveyor.core.model.NewJob`
attribute of that name. A test checks it against a freshly migrated database of each
backend, so a column added by a migration and not here (or here and not there) fails.

A claim turns up to ``concurrency`` rows into Jobs many times a second, and a submit writes
every job it takes: the readers and writers are therefore not loops over the columns, but
functions generated once from the declaration (:func:`job_reader`, :func:`job_writer`),
with one keyword per column as a hand-written one would have. The columns are picked out
of a row by position with one ``itemgetter``: a fraction of a look-up by name per column
(sqlite3.Row compares every column name in turn, a dict row is built per row).
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from conveyor.core.lifecycle import Status
from conveyor.core.model import Job, NewJob, Progress


class Kind(enum.Enum):
    """How a column's values are stored; each dialect has a type and a conversion per kind."""

    TEXT = "text"
    INT = "int"
    BIGINT = "bigint"  # a counter that must not wrap (the lease token)
    FLOAT = "float"
    BOOL = "bool"
    JSON = "json"  # a JSON document
    TIME = "time"  # an instant, UTC
    IDS = "ids"  # a list of job ids, read as a tuple (empty when null)
    STATUS = "status"  # a Status, by its value


@dataclass(frozen=True, slots=True)
class Column:
    """One column of conveyor_jobs."""

    name: str
    kind: Kind
    null: bool = False
    # The Job attribute it is read into (default: its name); "progress.done" names a part
    # of the Progress read from several columns (null when its first column is).
    field: str = ""
    # Whether a submit writes it from the NewJob attribute of ``field``'s name; the other
    # columns are decided by the store (status, times) or start at their default.
    submitted: bool = False
    # Whether submits usually leave it empty (None, 0): a bulk insert may bind it only
    # when some job of its batch sets it.
    sparse: bool = False

    @property
    def attribute(self) -> str:
        return self.field or self.name


_T, _I, _F = Kind.TEXT, Kind.INT, Kind.FLOAT

JOB_TABLE = (
    Column("id", _T, submitted=True),
    Column("type", _T, submitted=True),
    Column("queue", _T, submitted=True),
    Column("tenant", _T, null=True, submitted=True, sparse=True),
    Column("payload", Kind.JSON, submitted=True),
    Column("status", Kind.STATUS),
    Column("priority", _I, submitted=True),
    Column("attempt", _I),
    Column("max_attempts", _I, submitted=True),
    Column("run_at", Kind.TIME),
    Column("created_at", Kind.TIME),
    Column("timeout", _F, null=True, submitted=True, sparse=True),
    Column("lease_seconds", _F, null=True, field="lease", submitted=True, sparse=True),
    Column("backoff_base", _F, submitted=True),
    Column("backoff_cap", _F, submitted=True),
    Column("progress_done", _F, null=True, field="progress.done"),
    Column("progress_total", _F, null=True, field="progress.total"),
    Column("progress_message", _T, null=True, field="progress.message"),
    Column("state", Kind.JSON, null=True, submitted=True, sparse=True),
    Column("result", Kind.JSON, null=True),
    Column("result_ref", _T, null=True),
    Column("error", _T, null=True),
    Column("parent_id", _T, null=True, submitted=True, sparse=True),
    Column("root_id", _T, null=True, submitted=True, sparse=True),
    Column("depends_on", Kind.IDS, null=True, submitted=True, sparse=True),
    Column("unique_key", _T, null=True, submitted=True, sparse=True),
    Column("concurrency_key", _T, null=True, submitted=True, sparse=True),
    Column("retry_of", _T, null=True, submitted=True, sparse=True),
    Column("started_at", Kind.TIME, null=True),
    Column("finished_at", Kind.TIME, null=True),
    Column("lease_owner", _T, null=True),
    Column("lease_expires_at", Kind.TIME, null=True),
    Column("lease_token", Kind.BIGINT),
    Column("cancel_requested", Kind.BOOL),
    Column("trace_context", _T, null=True, submitted=True, sparse=True),
    Column("retry_count", _I, submitted=True, sparse=True),
    Column("retried_by", _T, null=True),
    Column("submitted_by", _T, submitted=True),
)

# Each kind's column type, as each dialect's schema declares it.
SQL_TYPES: dict[str, dict[Kind, str]] = {
    "sqlite": {
        Kind.TEXT: "TEXT", Kind.INT: "INTEGER", Kind.BIGINT: "INTEGER", Kind.FLOAT: "REAL",
        Kind.BOOL: "INTEGER", Kind.JSON: "TEXT", Kind.TIME: "REAL", Kind.IDS: "TEXT",
        Kind.STATUS: "TEXT",
    },
    "postgres": {
        Kind.TEXT: "text", Kind.INT: "integer", Kind.BIGINT: "bigint",
        Kind.FLOAT: "double precision", Kind.BOOL: "boolean", Kind.JSON: "json",
        Kind.TIME: "timestamp with time zone", Kind.IDS: "text[]", Kind.STATUS: "text",
    },
}  # fmt: skip

# The columns a Job is read from, in the order each store's reader takes them.
JOB_COLUMNS = tuple(c.name for c in JOB_TABLE)
# The columns a submit writes from a NewJob's attributes.
SUBMITTED = tuple(c for c in JOB_TABLE if c.submitted)

# A status by its stored value, without going through Enum's call.
STATUS = {s.value: s for s in Status}


@functools.lru_cache(maxsize=32)
def job_picker(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """Pick the job columns, in JOB_COLUMNS order, out of a row whose columns are ``names``."""
    index = {name: i for i, name in enumerate(names)}
    return operator.itemgetter(*(index[c] for c in JOB_COLUMNS))


def _by_position(arguments: Mapping[str, str]) -> list[str]:
    """The argument lines of a ``Job(...)`` call: each field's value by position (its
    name in a comment) while the fields come in Job's order with none missing, by keyword
    after (a field the row does not give keeps its default). By keyword, the call took
    three times as long: it is made once for every job a claim, a page or a get reads."""
    names = [f.name for f in fields(Job)]
    unknown = set(arguments) - set(names)
    if unknown:
        raise RuntimeError(f"job columns read into no field of Job: {sorted(unknown)}")
    leading = 0
    while leading < len(names) and names[leading] in arguments:
        leading += 1
    return [f"{arguments[n]},  # {n}" for n in names[:leading]] + [
        f"{n}={arguments[n]}," for n in names[leading:] if n in arguments
    ]


# Parts of a value read from several columns: the type built from them.
_COMPOSITES = {"progress": Progress}


def job_reader(
    reads: Mapping[Kind, str], namespace: Mapping[str, Any], at: Callable[[Any], Any]
) -> Callable[..., Job]:
    """Generate a dialect's reader of a job row: a function taking one argument per
    column (JOB_COLUMNS order) and returning the Job, plus a keyword ``at`` that reads
    a time (default ``at``; a caller may pass one that shares equal times).

    ``reads`` gives each kind's conversion of a stored value ``{}`` (which may name
    ``namespace``'s globals and ``at``); a null value of a nullable column stays None
    (a list of ids: an empty tuple), unless the conversion is the value itself.
    """
    arguments = {}
    parts: dict[str, dict[str, str]] = {}
    first: dict[str, str] = {}
    for c in JOB_TABLE:
        read = reads[c.kind]
        value = read.replace("{}", c.name)
        if c.null and read != "{}" and c.kind is not Kind.IDS:
            value = f"None if {c.name} is None else {value}"
        if "." in c.attribute:
            whole, part = c.attribute.split(".")
            parts.setdefault(whole, {})[part] = value
            first.setdefault(whole, c.name)
        else:
            arguments[c.attribute] = value
    for whole, values in parts.items():
        built = ", ".join(f"{k}={v}" for k, v in values.items())
        name = _COMPOSITES[whole].__name__
        arguments[whole] = f"None if {first[whole]} is None else {name}({built})"
    body = "\n        ".join(_by_position(arguments))
    source = (
        f"def job_of({', '.join(JOB_COLUMNS)}, *, at=_at):\n"
        f"    return Job(\n        {body}\n    )\n"
    )
    scope = {"Job": Job, "STATUS": STATUS, "_at": at, **_COMPOSITES_BY_NAME, **namespace}
    exec(compile(source, f"<job reader: {reads[Kind.JSON]}>", "exec"), scope)
    reader: Callable[..., Job] = scope["job_of"]
    reader.__doc__ = f"Read a job row, one argument per column.\n\n{source}"
    return reader


_COMPOSITES_BY_NAME = {t.__name__: t for t in _COMPOSITES.values()}


def job_writer(
    writes: Mapping[Kind, str],
    namespace: Mapping[str, Any],
    *,
    columns: Sequence[Column] = SUBMITTED,
    after: Sequence[str] = (),
    form: str = "dict",
    null: str = "None",
    end: str = "\n",
) -> Callable[..., Any]:
    """Generate a dialect's writer of a submitted job: a function of a NewJob (and of
    the arguments named ``after``) returning the values of ``columns`` (SUBMITTED by
    default) and then of ``after``, as a ``dict`` by column name, a ``tuple``, or a ``copy``
    line (COPY's text format: tab-separated, ending in ``end``).

    ``writes`` gives each kind's conversion of an attribute's value ``{}`` (which may
    name ``namespace``'s globals); a null value of a nullable column (a list of ids: an
    empty one) is written as ``null``, unless the conversion is the value itself.
    """
    values = []
    for c in columns:
        write = writes[c.kind]
        value = write.replace("{}", f"job.{c.attribute}")
        if c.kind is Kind.IDS:
            value = f"{value} if job.{c.attribute} else {null}"
        elif c.null and write != "{}":
            value = f"{null} if job.{c.attribute} is None else {value}"
        values.append(value)
    names = [c.name for c in columns] + list(after)
    values += after
    if form == "dict":
        body = "{" + ", ".join(f'"{n}": {v}' for n, v in zip(names, values, strict=True)) + "}"
    elif form == "tuple":
        body = "(" + ", ".join(values) + ",)"
    elif form == "copy":
        body = (
            'f"'
            + "\\t".join(f"{{{v}}}" for v in values)
            + end.encode("unicode_escape").decode()
            + '"'
        )
    else:
        raise ValueError(f"unknown form {form!r}")
    source = f"def write(job, {', '.join(after)}):\n    return {body}\n"
    scope = dict(namespace)
    exec(compile(source, f"<job writer: {form}, {writes[Kind.JSON]}>", "exec"), scope)
    writer: Callable[..., Any] = scope["write"]
    writer.__doc__ = f"A submitted job's column values ({form}).\n\n{source}"
    return writer


def sets_sparse(columns: Sequence[Column]) -> Callable[[Sequence[NewJob]], bool]:
    """Generate a test of whether any of a batch's jobs sets a sparse one of ``columns``
    (see :attr:`Column.sparse`): a bulk insert binds them only then."""
    tests = []
    for c in columns:
        if c.sparse:
            empty_is_none = c.null and c.kind is not Kind.IDS  # else empty is falsy
            tests.append(
                f"job.{c.attribute} is not None" if empty_is_none else f"job.{c.attribute}"
            )
    source = (
        "def sets_sparse(jobs):\n"
        "    for job in jobs:\n"
        f"        if {' or '.join(tests)}:\n"
        "            return True\n"
        "    return False\n"
    )
    scope: dict[str, Any] = {}
    exec(compile(source, "<sets_sparse>", "exec"), scope)
    test: Callable[[Sequence[NewJob]], bool] = scope["sets_sparse"]
    return test
