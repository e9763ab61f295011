"""A client of a conveyor server's REST API, for the CLI's ``--url``: the same commands,
run against a remote server instead of the database. It needs httpx only, not FastAPI.

Errors come back as conveyor's own exceptions (a 404 is :class:`JobNotFound`, an
unreachable server :class:`DatabaseUnavailable`), with the server's problem ``detail``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from conveyor.app.handles import JobView
from conveyor.core.filter import JobFilter
from conveyor.core.lifecycle import Status
from conveyor.core.model import Attempt, Job, Outcome, Progress, TreeCounts
from conveyor.errors import (
    ConfigurationError,
    ConveyorError,
    DatabaseUnavailable,
    InvalidState,
    JobNotFound,
)
from conveyor.store.protocol import QueueInfo


def job_from_resource(data: Mapping[str, Any]) -> Job:
    """Rebuild a job record from the API's job resource."""
    p = data.get("progress")
    return Job(
        id=data["id"],
        type=data["type"],
        queue=data["queue"],
        tenant=data.get("tenant"),
        payload=data.get("payload") or {},
        status=Status(data["status"]),
        priority=data["priority"],
        attempt=data["attempts"],
        max_attempts=data["max_attempts"],
        run_at=datetime.fromisoformat(data["run_at"]),
        created_at=datetime.fromisoformat(data["created_at"]),
        timeout=data.get("timeout"),
        progress=Progress(p["done"], p.get("total"), p.get("message")) if p else None,
        result=data.get("result"),
        result_ref=data.get("result_ref"),
        error=data.get("error"),
        parent_id=data.get("parent_id"),
        root_id=data.get("root_id"),
        depends_on=tuple(data.get("depends_on") or ()),
        unique_key=data.get("unique_key"),
        retry_of=data.get("retry_of"),
        retry_count=int(data.get("retry_count") or 0),
        retried_by=data.get("retried_by"),
        submitted_by=data.get("submitted_by") or "local",
        below=_below(data.get("below")),
        started_at=_time(data.get("started_at")),
        finished_at=_time(data.get("finished_at")),
        cancel_requested=bool(data.get("cancel_requested")),
    )


def _below(data: Mapping[str, Any] | None) -> TreeCounts | None:
    if not data:
        return None
    names = ("pending", "queued", "running", "waiting", "succeeded", "failed", "cancelled")
    return TreeCounts(**{name: int(data.get(name) or 0) for name in names})


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


class RemoteJob(JobView):
    """A job read over HTTP, with the reading methods of a local job handle."""

    def __init__(self, client: RemoteClient, record: Job) -> None:
        super().__init__(record)
        self._client = client

    async def refresh(self) -> RemoteJob:
        self.record = (await self._client.get(self.id)).record
        return self

    async def attempts(self) -> list[Attempt]:
        return await self._client.attempts(self.id)


class RemoteClient:
    """Calls a conveyor server's API with a bearer token."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"--url takes the server's address such as http://127.0.0.1:8000, not {url!r}"
            )
        if not token:
            raise ConfigurationError(
                "a remote server needs an API token: set CONVEYOR_TOKEN or pass --token-file "
                "(create one on the server with `conveyor tokens create`)"
            )
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RemoteClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(
        self, method: str, path: str, *, job_id: str | None = None, **kw: Any
    ) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise DatabaseUnavailable(
                f"cannot reach the conveyor server at {self.url} ({exc or type(exc).__name__}):"
                " check the address and that `conveyor serve` runs there"
            ) from None
        if response.status_code < 400:
            return response
        try:
            detail = str(response.json().get("detail") or response.reason_phrase)
        except ValueError:
            detail = response.text[:200] or response.reason_phrase
        code = response.status_code
        if code == 404 and job_id is not None:
            raise JobNotFound(job_id)
        if code == 409:
            raise InvalidState(detail)
        if code >= 500:
            raise DatabaseUnavailable(f"the server at {self.url} failed ({code}): {detail}")
        if code in (401, 403):
            raise ConfigurationError(f"the server refused the token ({code}): {detail}")
        if code in (400, 413, 415, 422):
            raise ConfigurationError(detail)
        raise ConveyorError(f"the server answered {code}: {detail}")

    def _job(self, data: Mapping[str, Any]) -> RemoteJob:
        return RemoteJob(self, job_from_resource(data))

    async def submit(
        self,
        type: str,
        payload: Mapping[str, Any],
        *,
        id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
    ) -> RemoteJob:
        body: dict[str, Any] = {"type": type, "payload": dict(payload)}
        for key, value in (("id", id), ("queue", queue), ("priority", priority), ("delay", delay)):
            if value is not None:
                body[key] = value
        response = await self._call("POST", "/jobs", json=body)
        return self._job(response.json())

    async def get(self, job_id: str) -> RemoteJob:
        response = await self._call("GET", _path(job_id), job_id=job_id)
        return self._job(response.json())

    async def list_jobs(self, filter: JobFilter, *, limit: int = 50) -> list[RemoteJob]:
        """Jobs newest first, as :meth:`Conveyor.list_jobs` returns them: ``GET /jobs``,
        top-level ones unless the filter says otherwise, following ``next`` while the
        server's byte limit on pages cut one short of ``limit``."""
        params: list[tuple[str, str]] = [("status", s.value) for s in filter.status]
        filters = (
            ("type", filter.type),
            ("queue", filter.queue),
            ("tenant", filter.tenant),
            ("parent", filter.parent_id),
            ("root", filter.root_id),
            ("created_after", _iso(filter.created_after)),
            ("created_before", _iso(filter.created_before)),
        )
        params += [(k, v) for k, v in filters if v is not None]
        params.append(("include_children", "false" if filter.top_level else "true"))
        params.append(("limit", str(limit)))
        response = await self._call("GET", "/jobs", params=params)
        found = [self._job(j) for j in response.json()["jobs"]]
        following = response.json().get("next")
        while following and len(found) < limit:
            # The link is the server's own path (with any mount prefix): join it absolutely.
            response = await self._call("GET", str(httpx.URL(self.url).join(following)))
            found += [self._job(j) for j in response.json()["jobs"]]
            following = response.json().get("next")
        return found[:limit]

    async def attempts(self, job_id: str) -> list[Attempt]:
        response = await self._call("GET", f"{_path(job_id)}/attempts", job_id=job_id)
        return [
            Attempt(
                job_id=a["job_id"],
                number=a["number"],
                worker_id=a.get("worker_id"),
                started_at=_time(a.get("started_at")),
                finished_at=_time(a.get("finished_at")),
                outcome=Outcome(a["outcome"]),
                error=a.get("error"),
                traceback=a.get("traceback"),
            )
            for a in response.json()["attempts"]
        ]

    async def health(self) -> dict[str, Any]:
        """The server's ``GET /health/ready`` document (a 503 answer is a verdict too)."""
        try:
            response = await self._http.get("/health/ready")
        except httpx.HTTPError as exc:
            raise DatabaseUnavailable(
                f"cannot reach the conveyor server at {self.url} ({exc or type(exc).__name__})"
            ) from None
        try:
            document = response.json()
        except ValueError:
            return {}
        return document if isinstance(document, dict) else {}

    async def live_queues(self) -> list[tuple[str, ...]]:
        """The queues of each live worker (``GET /workers``)."""
        data = (await self._call("GET", "/workers")).json()
        return [tuple(w["queues"]) for w in data["workers"] if w.get("live")]

    async def cancel(self, job_id: str) -> RemoteJob:
        response = await self._call("POST", f"{_path(job_id)}/cancel", job_id=job_id)
        return self._job(response.json())

    async def retry(self, job_id: str) -> RemoteJob:
        response = await self._call("POST", f"{_path(job_id)}/retry", job_id=job_id)
        return self._job(response.json())

    async def retry_failed_children(self, job_id: str) -> list[RemoteJob]:
        path = f"{_path(job_id)}/retry-failed-children"
        response = await self._call("POST", path, job_id=job_id)
        return [self._job(j) for j in response.json()["retried"]]

    async def children(self, job_id: str, *, limit: int = 50) -> list[RemoteJob]:
        params = [("limit", str(limit))]
        response = await self._call(
            "GET", f"{_path(job_id)}/children", job_id=job_id, params=params
        )
        return [self._job(j) for j in response.json()["jobs"]]

    async def queues(self) -> list[QueueInfo]:
        response = await self._call("GET", "/queues")
        return [_queue(q) for q in response.json()["queues"]]

    async def pause(self, queue: str) -> None:
        await self._call("POST", f"/queues/{quote(queue, safe='')}/pause")

    async def resume(self, queue: str) -> None:
        await self._call("POST", f"/queues/{quote(queue, safe='')}/resume")


def _queue(data: Mapping[str, Any]) -> QueueInfo:
    return QueueInfo(str(data["name"]), bool(data["paused"]), dict(data.get("counts") or {}))


def _path(job_id: str) -> str:
    return f"/jobs/{quote(job_id, safe='')}"


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()
