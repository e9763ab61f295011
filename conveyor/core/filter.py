"""Which jobs a listing shows: :class:`JobFilter`, one value from each edge to the store.

Every surface that lists jobs (``app.page_jobs``, ``conveyor jobs list``, ``GET /jobs``, the
dashboard's jobs page) parses its own input once into a ``JobFilter`` and passes it down
unchanged: the tenant view narrows its tenant, and the store turns it into one query.

>>> f = JobFilter.of(status=["failed"], type="email")
>>> f.status, f.top_level
((<Status.FAILED: 'failed'>,), True)
>>> JobFilter.of(parent_id="01j").top_level  # a parent's children are not top-level
False
>>> JobFilter.of(status=["done"])  # doctest: +ELLIPSIS
Traceback (most recent call last):
    ...
ValueError: 'done' is not a valid Status; known statuses: pending, queued, ..., cancelled
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict, Unpack

from conveyor.core.lifecycle import Status
from conveyor.core.model import as_utc


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs to list; each field given narrows the list.

    ``JobFilter()`` selects every job, children too; :meth:`of` builds a filter as the
    listings take it, with their default of top-level jobs only.
    """

    status: tuple[Status, ...] = ()  # any of these; () for every status
    type: str | None = None
    queue: str | None = None
    tenant: str | None = None  # one tenant's jobs
    parent_id: str | None = None  # the children of this job
    root_id: str | None = None  # every job below this root
    created_after: datetime | None = None  # inclusive, UTC
    created_before: datetime | None = None  # exclusive, UTC
    top_level: bool = False  # only jobs without a parent

    @classmethod
    def of(cls, **keywords: Unpack[FilterKeywords]) -> JobFilter:
        """A filter from an edge's arguments, checked (``ValueError`` says what is wrong).

        Top-level jobs only, unless ``include_children`` or a ``parent_id``/``root_id``
        asks for jobs spawned by others; ``top_level`` decides it explicitly.
        """
        try:
            statuses = tuple(Status(s) for s in keywords.get("status", ()))
        except ValueError as exc:
            known = ", ".join(s.value for s in Status)
            raise ValueError(f"{exc}; known statuses: {known}") from None
        parent_id, root_id = keywords.get("parent_id"), keywords.get("root_id")
        top_level = keywords.get("top_level")
        if top_level is None:
            top_level = not (keywords.get("include_children") or parent_id or root_id)
        after, before = keywords.get("created_after"), keywords.get("created_before")
        return cls(
            status=statuses,
            type=keywords.get("type"),
            queue=keywords.get("queue"),
            tenant=keywords.get("tenant"),
            parent_id=parent_id,
            root_id=root_id,
            created_after=as_utc(after) if after else None,
            created_before=as_utc(before) if before else None,
            top_level=top_level,
        )


class FilterKeywords(TypedDict, total=False):
    """The keywords that build a :class:`JobFilter` (``app.page_jobs(status=..., ...)``)."""

    status: Iterable[Status | str]
    type: str | None
    queue: str | None
    tenant: str | None
    parent_id: str | None
    root_id: str | None
    created_after: datetime | None
    created_before: datetime | None
    include_children: bool  # also jobs spawned by other jobs
    top_level: bool | None  # decide it explicitly (None: from the other keywords)
