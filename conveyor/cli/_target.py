"""Where a job command acts: the database (through the application) or a conveyor
server's REST API (``--url``), behind one :class:`JobsTarget` protocol."""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import click

from conveyor.cli._common import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    T,
    app_from,
    app_option,
    fail,
    resolve_token,
    run_command,
    server_option,
    token_file_option,
    token_option,
    url_option,
)
from conveyor.core.ids import check_job_id
from conveyor.errors import ConfigurationError

# The rest is imported where used: `conveyor --help` and a worker's start-up load only
# what they need (tests/test_architecture.py checks what --help imports).
if TYPE_CHECKING:
    from conveyor.app.health import Health
    from conveyor.cli._console import ShownJob
    from conveyor.core.filter import JobFilter
    from conveyor.core.model import Attempt
    from conveyor.store import QueueInfo

# -- where the job commands act -------------------------------------------------------------


class JobsTarget(Protocol):
    """Where the job commands act: the database through the facade (:class:`Conveyor`), or
    a conveyor server through its API (:class:`~conveyor.cli._remote.RemoteClient`)."""

    async def submit(
        self,
        type: str,
        payload: Mapping[str, Any],
        *,
        id: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        delay: float | None = None,
    ) -> ShownJob: ...

    async def get(self, job_id: str) -> ShownJob: ...

    async def list_jobs(self, filter: JobFilter, *, limit: int = 50) -> Sequence[ShownJob]: ...

    async def attempts(self, job_id: str) -> list[Attempt]: ...

    async def cancel(self, job_id: str) -> ShownJob: ...

    async def retry(self, job_id: str) -> ShownJob: ...

    async def retry_failed_children(self, job_id: str) -> Sequence[ShownJob]: ...

    async def children(self, job_id: str, *, limit: int = ...) -> Sequence[ShownJob]: ...

    async def queues(self) -> list[QueueInfo]: ...

    async def pause(self, queue: str) -> None: ...

    async def resume(self, queue: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Target:
    """The target a job command was given, chosen once from its options."""

    jobs: JobsTarget
    close: Callable[[], Awaitable[None]]
    remote: bool
    app_spec: str | None

    @property
    def has_app(self) -> bool:
        return bool(self.app_spec)

    @classmethod
    def choose(
        cls,
        app_spec: str | None,
        database_url: str | None,
        server_url: str | None,
        token: str | None,
        *,
        must_exist: bool = True,
    ) -> Target:
        """A server's API given --url (its token from --token), else the database."""
        from conveyor.cli._remote import RemoteClient

        if server_url:
            try:
                client = RemoteClient(server_url, token)
            except ConfigurationError as exc:
                fail(str(exc), EXIT_USAGE)
            return cls(client, client.close, remote=True, app_spec=app_spec)
        app = app_from(app_spec, database_url, must_exist=must_exist)
        return cls(app, app.close, remote=False, app_spec=app_spec)

    async def no_worker_hint(self, queue: str | None = None) -> str | None:
        """Say so when no worker is live to run a queued job, or (on the database) when
        none serves its ``queue``; None when one will."""
        from conveyor.app.client import Conveyor
        from conveyor.cli._remote import RemoteClient
        from conveyor.core.health import no_live_worker, queue_not_served, unserved_queues

        if isinstance(self.jobs, Conveyor):
            health = await self.jobs.health()
            hint = no_worker_hint(health, self.app_spec)
            if hint is None and queue is not None:
                now = health.counts.now
                live = [w.queues for w in await self.jobs.workers() if w.state(now) == "live"]
                if unserved_queues({queue: 1}, live):
                    hint = queue_not_served(queue, "this job is")
            return hint
        if isinstance(self.jobs, RemoteClient):
            ready = await self.jobs.health()
            if ready.get("live_workers"):
                if queue is not None and unserved_queues({queue: 1}, await self.jobs.live_queues()):
                    return queue_not_served(queue, "this job is")
                return None
            return no_live_worker(
                workers=int(ready.get("workers") or 0),
                heartbeat_age=ready.get("heartbeat_age"),
                app=self.app_spec,
            )
        return None

    def run(self, action: Callable[[JobsTarget], Awaitable[T]]) -> T:
        """Run ``action`` on the target, then close it; conveyor's errors become exit codes."""

        async def go() -> T:
            try:
                return await action(self.jobs)
            finally:
                await self.close()

        return run_command(go())


def jobs_target(
    command: Callable[..., None] | None = None, *, creates: bool = False
) -> Callable[..., Any]:
    """Give a job command the --app/--database-url and --url/--token options, resolved
    once into its ``target`` argument. Unless ``creates``, a SQLite file must exist."""

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(command)
        def with_target(
            *args: Any,
            app_spec: str | None,
            database_url: str | None,
            server_url: str | None,
            token: str | None,
            token_file: str | None,
            **kwargs: Any,
        ) -> None:
            token = resolve_token(token, token_file)
            target = Target.choose(
                app_spec, database_url, server_url, token, must_exist=not creates
            )
            command(*args, target=target, **kwargs)

        options = (token_file_option, token_option, server_option, url_option, app_option)
        for option in options:
            with_target = option(with_target)
        return with_target

    return decorate(command) if command is not None else decorate


def exit_interrupted(job_id: str | None, status: str | None) -> NoReturn:
    """Ctrl-C while waiting: the job is not touched; say how to follow or cancel it."""
    if job_id is None:
        fail("interrupted", EXIT_INTERRUPTED)
    fail(
        f"stopped waiting; job {job_id} is still {status or 'there'} and keeps going. "
        f"Follow it with `conveyor jobs show {job_id} --follow`, cancel it with "
        f"`conveyor jobs cancel {job_id}`",
        EXIT_INTERRUPTED,
    )


# -- submit ----------------------------------------------------------------------------


def parse_payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            """write e.g. '{"to": "a@b.c"}'""",
            param_hint="--payload",
        ) from None
    if not isinstance(payload, dict):
        raise click.BadParameter(
            "must be a JSON object of keyword arguments, e.g. '{\"n\": 3}'",
            param_hint="--payload",
        )
    return payload


def client_id(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_job_id(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--id") from None


def no_worker_hint(health: Health, app_spec: str | None) -> str | None:
    """The "no live worker" hint, or None when a worker is live."""
    from conveyor.core.health import no_live_worker

    if not health.no_live_worker:
        return None
    return no_live_worker(
        workers=health.counts.workers, heartbeat_age=health.heartbeat_age, app=app_spec
    )
