"""The values of a job listing's query, read once for the REST API and the dashboard.

``GET /jobs`` and the dashboard's jobs page take the same filters. Both read them here, so
that a value one of them refuses the other refuses too, with the same message (a
:class:`ConfigurationError`: the API's ``422`` problem, the dashboard's ``422`` page), and
that no value reaches a query the database cannot run: text holding NUL characters or
unpaired surrogates, a time that falls outside what a datetime holds once converted to
UTC, a status that does not exist. Cursors are opened by the one
:class:`~conveyor.web._pages.CursorSigner` for the scope :func:`cursor_scope` names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from conveyor.core.auth import Principal
from conveyor.core.filter import JobFilter
from conveyor.core.lifecycle import Status
from conveyor.core.model import as_utc
from conveyor.errors import ConfigurationError

_STATUSES = {s.value: s for s in Status}
# The most characters of each text filter (the API's document states the same).
TEXT_LIMITS = {"type": 200, "queue": 100, "parent": 200, "root": 200, "tenant": 100, "id": 301}


def cursor_scope(principal: Principal) -> str:
    """Whose cursors a principal's are: its tenant's, or every tenant's for an admin."""
    return "*" if principal.is_admin else principal.tenant


def text(name: str, value: str | None) -> str | None:
    """A text filter: None when absent or blank; refused when the database could not
    compare it faithfully (NUL, an unpaired surrogate) or it is longer than its limit.

    >>> text("queue", " media ")
    'media'
    >>> text("type", "a\\x00b")
    Traceback (most recent call last):
    ...
    conveyor.errors.ConfigurationError: type: holds a NUL character; send text without it
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    if "\x00" in value:
        raise ConfigurationError(f"{name}: holds a NUL character; send text without it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(
            f"{name}: holds an unpaired surrogate, which is not text; send UTF-8"
        ) from None
    most = TEXT_LIMITS.get(name, 200)
    if len(value) > most:
        raise ConfigurationError(f"{name}: at most {most} characters, not {len(value)}")
    return value


def moment(name: str, value: str | datetime | None) -> datetime | None:
    """A time filter in UTC: ISO 8601 text or a datetime, read as UTC when it names no
    zone; a time outside what a datetime holds once in UTC (year 1 at +05:00) is the
    first or last instant there is, which every job is after or before.

    >>> moment("created_after", "2026-03-01T10:00")
    datetime.datetime(2026, 3, 1, 10, 0, tzinfo=datetime.timezone.utc)
    >>> moment("created_after", "0001-01-01T00:00+05:00").year
    1
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        written = value
        try:
            value = datetime.fromisoformat(written.strip())
        except ValueError:
            raise ConfigurationError(
                f"{name}: {written[:40]!r} is not a date and time; send ISO 8601, such as "
                "2026-03-01T10:00 (UTC) or 2026-03-01T10:00+01:00"
            ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        return as_utc(value)
    except OverflowError:
        edge = datetime.min if value.year < 5000 else datetime.max
        return edge.replace(tzinfo=UTC)


def statuses(values: Iterable[str | Status]) -> tuple[Status, ...]:
    """The statuses asked for (blank ones left out); an unknown one is refused."""
    out: list[Status] = []
    for value in values:
        if isinstance(value, Status):
            out.append(value)
        elif value.strip():
            found = _STATUSES.get(value.strip())
            if found is None:
                raise ConfigurationError(
                    f"status: {value[:40]!r} is not a status; use one of {', '.join(_STATUSES)}"
                )
            out.append(found)
    return tuple(out)


def job_filters(
    *,
    status: Sequence[str | Status] = (),
    type: str | None = None,
    queue: str | None = None,
    tenant: str | None = None,
    parent: str | None = None,
    root: str | None = None,
    created_after: str | datetime | None = None,
    created_before: str | datetime | None = None,
    include_children: bool = False,
) -> dict[str, Any]:
    """The arguments of :meth:`TenantView.page` for a listing's filters, each checked."""
    return {
        "status": statuses(status),
        "type": text("type", type),
        "queue": text("queue", queue),
        "tenant": text("tenant", tenant),
        "parent_id": text("parent", parent),
        "root_id": text("root", root),
        "created_after": moment("created_after", created_after),
        "created_before": moment("created_before", created_before),
        "include_children": include_children,
    }


def as_job_filter(filters: Mapping[str, Any]) -> JobFilter:
    """The :class:`JobFilter` of :func:`job_filters`' arguments."""
    try:
        return JobFilter.of(**filters)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def job_filter(**fields: Any) -> JobFilter:
    """The :class:`JobFilter` of a listing's filters (:func:`job_filters`), each checked."""
    return as_job_filter(job_filters(**fields))
