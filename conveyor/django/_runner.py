"""How a conveyor worker runs a Django task: the handler registered for its job type.

A sync task runs on one of the worker's handler threads, between two calls of Django's
``close_old_connections`` (as a request runs between ``request_started`` and
``request_finished``): a connection left broken, in a transaction, or past
``CONN_MAX_AGE`` by one job is closed before the next job on that thread uses it. An
async task runs on the worker's event loop, in a ``ThreadSensitiveContext`` of its own
(as Django's ASGI handler runs a request), so its ``sync_to_async`` calls get a thread
and connections of their own, closed the same way.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.db import close_old_connections
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

import conveyor
from conveyor.django._context import ConveyorTaskContext

if TYPE_CHECKING:
    from conveyor.django.backend import ConveyorBackend


class Runner:
    """Runs one Django task as conveyor job attempts."""

    def __init__(self, backend: ConveyorBackend, task: Task) -> None:
        self.backend = backend
        self.task = task
        self.non_retryable: tuple[type[BaseException], ...] = tuple(
            backend.options_of(task).get("non_retryable") or ()
        )

    def handler(self) -> Callable[..., Any]:
        """The job type's handler: async for an async task, else sync (run in a thread)."""
        runner = self

        if iscoroutinefunction(self.task.func):

            async def run_async(
                ctx: conveyor.JobContext,
                args: list[Any] | None = None,
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                async with ThreadSensitiveContext():
                    await sync_to_async(close_old_connections)()
                    try:
                        return await runner.call_async(ctx, args or [], kwargs or {})
                    finally:
                        await sync_to_async(close_old_connections)()

            return run_async

        def run_sync(
            ctx: conveyor.JobContext,
            args: list[Any] | None = None,
            kwargs: dict[str, Any] | None = None,
        ) -> Any:
            close_old_connections()
            try:
                return runner.call_sync(ctx, args or [], kwargs or {})
            finally:
                close_old_connections()

        return run_sync

    def call_sync(self, ctx: conveyor.JobContext, args: list[Any], kwargs: dict[str, Any]) -> Any:
        history = self.backend.app.sync.attempts(ctx.id) if ctx.attempt > 1 else []
        result = self.running(ctx, history)
        task_started.send(type(self.backend), task_result=result)
        try:
            if self.task.takes_context:
                context = ConveyorTaskContext(task_result=result, job=ctx)
                value = normalize_json(self.task.func(context, *args, **kwargs))
            else:
                value = normalize_json(self.task.func(*args, **kwargs))
        except BaseException as exc:
            # Inside the handler, so that the log receiver finds the exception.
            task_finished.send(type(self.backend), task_result=self.ended(result, ctx, exc))
            raise
        task_finished.send(type(self.backend), task_result=self.ended(result, ctx, None, value))
        return value

    async def call_async(
        self, ctx: conveyor.JobContext, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        history = await self.backend.app.attempts(ctx.id) if ctx.attempt > 1 else []
        result = self.running(ctx, history)
        await task_started.asend(type(self.backend), task_result=result)
        try:
            if self.task.takes_context:
                context = ConveyorTaskContext(task_result=result, job=ctx)
                value = normalize_json(await self.task.func(context, *args, **kwargs))
            else:
                value = normalize_json(await self.task.func(*args, **kwargs))
        except BaseException as exc:
            ended = self.ended(result, ctx, exc)
            await task_finished.asend(type(self.backend), task_result=ended)
            raise
        ended = self.ended(result, ctx, None, value)
        await task_finished.asend(type(self.backend), task_result=ended)
        return value

    def running(self, ctx: conveyor.JobContext, history: list[conveyor.Attempt]) -> TaskResult:
        """The task's result as it runs on this worker (its attempt not recorded yet)."""
        return self.backend.result_of(self.task, ctx.job, history, running_on=ctx.worker_id)

    def ended(
        self,
        result: TaskResult,
        ctx: conveyor.JobContext,
        exc: BaseException | None,
        value: Any = None,
    ) -> TaskResult:
        """The result once this attempt ended: SUCCESSFUL, or FAILED with its error (READY
        when conveyor will try it again)."""
        if exc is None:
            ended = _changed(result, status=TaskResultStatus.SUCCESSFUL, finished_at=timezone.now())
            object.__setattr__(ended, "_return_value", value)
            return ended
        final = isinstance(exc, (conveyor.Cancel, *self.non_retryable)) or (
            ctx.attempt >= ctx.job.max_attempts and not isinstance(exc, conveyor.Retry)
        )
        kind = type(exc)
        error = TaskError(
            exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
            traceback="".join(traceback.format_exception(exc)),
        )
        return _changed(
            result,
            status=TaskResultStatus.FAILED if final else TaskResultStatus.READY,
            finished_at=timezone.now() if final else None,
            errors=[*result.errors, error],
        )


def _changed(result: TaskResult, **changes: Any) -> TaskResult:
    fields = {
        name: getattr(result, name)
        for name in (
            "task",
            "id",
            "status",
            "enqueued_at",
            "started_at",
            "finished_at",
            "last_attempted_at",
            "args",
            "kwargs",
            "backend",
            "errors",
            "worker_ids",
        )
    }
    return TaskResult(**(fields | changes))
