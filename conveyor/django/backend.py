"""``ConveyorBackend``: Django's task backend (``django.tasks``) on conveyor.

::

    INSTALLED_APPS += ["conveyor.django"]
    TASKS = {
        "default": {
            "BACKEND": "conveyor.django.ConveyorBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"TASKS": {"shop.tasks.send_receipt": {"max_attempts": 5}}},
        }
    }

Each Django task is a conveyor job type named by the task's module path; its arguments
are the job's payload (``{"args": [...], "kwargs": {...}}``) and the task result's id is
the job's id, so the dashboard, the CLI and the REST API see Django's tasks as jobs.
The jobs live in Django's database (``OPTIONS["DATABASE"]``, ``"default"``) or at
another conveyor URL (``OPTIONS["URL"]``). On PostgreSQL, a task enqueued inside
``transaction.atomic()`` is written on Django's own connection: it exists only if that
transaction commits. ``python manage.py conveyor_worker`` runs the tasks.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from asgiref.sync import SyncToAsync, async_to_sync
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

import conveyor
from conveyor.django import _results
from conveyor.django._database import url_of
from conveyor.django._runner import Runner

# The options of a conveyor job type a Django task can set, through OPTIONS["TASKS"],
# OPTIONS["TASK_DEFAULTS"] or @task(...): they are Conveyor.job's keywords.
TYPE_OPTIONS = frozenset(
    {
        "max_attempts",
        "timeout",
        "lease",
        "backoff",
        "non_retryable",
        "concurrency",
        "global_concurrency",
        "key_concurrency",
        "rate_limit",
        "retention",
        "retry_limit",
    }
)
# Options decided per enqueue: a string, or a function of the task's arguments.
SUBMIT_OPTIONS = frozenset({"unique_key", "concurrency_key"})
_ALL_OPTIONS = TYPE_OPTIONS | SUBMIT_OPTIONS


@dataclass(frozen=True, slots=True, kw_only=True)
class ConveyorTask(Task):
    """A Django task with conveyor's options (``@task(max_attempts=5, timeout="2m")``).

    Django 6.1's ``@task`` passes keywords it does not know to the backend's task class:
    these are they. ``unique_key`` and ``concurrency_key`` are strings or functions of
    the task's arguments (``lambda order_id: f"receipt:{order_id}"``).
    """

    max_attempts: int | None = None
    timeout: float | str | None = None
    lease: float | str | None = None
    backoff: Any = None
    non_retryable: tuple[type[BaseException], ...] | None = None
    concurrency: int | None = None
    global_concurrency: int | None = None
    key_concurrency: int | None = None
    rate_limit: str | None = None
    retention: Mapping[str, Any] | None = None
    retry_limit: int | None = None
    unique_key: str | Callable[..., str | None] | None = None
    concurrency_key: str | Callable[..., str | None] | None = None

    def conveyor_options(self) -> dict[str, Any]:
        """The conveyor options set on this task (those left None are not set)."""
        return {
            name: getattr(self, name)
            for name in sorted(_ALL_OPTIONS)
            if getattr(self, name) is not None
        }


# Applications are shared by every thread's backend (Django makes one backend per thread
# and per alias): one conveyor application, and so one set of pools, per database.
_lock = threading.Lock()
_apps: dict[str, conveyor.Conveyor] = {}
# The tasks seen so far, by module path (Task.__post_init__ validates every task with its
# backend): each is a job type of every application, which runs what it is sent.
_tasks: dict[str, Task] = {}
_registered: dict[str, int] = {}  # url: how many of the tasks its application registered


class ConveyorBackend(BaseTaskBackend):
    """Django's task backend on conveyor: enqueue, results, and the tasks' job types."""

    task_class = ConveyorTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        unknown = set(options) - {"DATABASE", "URL", "TASKS", "TASK_DEFAULTS", "TASK_MODULES"}
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}: use DATABASE, "
                "URL, TASKS, TASK_DEFAULTS or TASK_MODULES"
            )
        if "DATABASE" in options and "URL" in options:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] gives both DATABASE and URL: jobs live in one "
                "database, give one of them"
            )
        self.database: str = options.get("DATABASE", "default")
        self.url: str | None = options.get("URL")
        self.task_defaults = _checked(options.get("TASK_DEFAULTS", {}), f"{alias}: TASK_DEFAULTS")
        self.task_options = {
            path: _checked(value, f"{alias}: TASKS[{path!r}]")
            for path, value in dict(options.get("TASKS", {})).items()
        }
        self.task_modules: tuple[str, ...] = tuple(options.get("TASK_MODULES", ()))

    # -- the application ----------------------------------------------------------------

    @property
    def app(self) -> conveyor.Conveyor:
        """The conveyor application this backend's jobs go through (shared per database)."""
        url = self.database_url()
        with _lock:
            app = _apps.get(url)
            if app is None:
                app = _apps[url] = conveyor.Conveyor(url, migrate=False)
            if _registered.get(url) != len(_tasks):
                for path, task in list(_tasks.items()):
                    if app.registry.find(path) is None:
                        self._register(app, task)
                _registered[url] = len(_tasks)
        return app

    def database_url(self) -> str:
        """The conveyor URL of the jobs' database, read from Django's settings each time
        (the test runner renames the database after settings are loaded)."""
        if self.url is not None:
            return self.url
        if self.database not in settings.DATABASES:
            raise ImproperlyConfigured(
                f"TASKS[{self.alias!r}] keeps its jobs in database {self.database!r}, which "
                "is not in DATABASES: set OPTIONS['DATABASE'] to one of "
                f"{sorted(settings.DATABASES)}"
            )
        try:
            return url_of(connections[self.database].settings_dict, self.database)
        except ValueError as exc:
            raise ImproperlyConfigured(str(exc)) from None

    def shares_django_database(self) -> bool:
        """Whether the jobs live in Django's own database (not an OPTIONS['URL'] of their own,
        nor one a test moved the application to)."""
        if self.url is not None:
            return False
        url = self.database_url()
        return _apps.get(url) is None or _apps[url].url == url

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        with _lock:
            _tasks.setdefault(task.module_path, task)

    def options_of(self, task: Task) -> dict[str, Any]:
        """The conveyor options of a task: TASK_DEFAULTS, then @task(...), then TASKS[path]."""
        own = task.conveyor_options() if isinstance(task, ConveyorTask) else {}
        return {**self.task_defaults, **own, **self.task_options.get(task.module_path, {})}

    def _register(self, app: conveyor.Conveyor, task: Task) -> None:
        options = {k: v for k, v in self.options_of(task).items() if k in TYPE_OPTIONS}
        try:
            app.job(name=task.module_path, **options)(Runner(self, task).handler())
        except conveyor.ConfigurationError as exc:
            raise ImproperlyConfigured(f"task {task.module_path}: {exc}") from None

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        """Store a job for the task; in Django's transaction when there is one (see docs)."""
        self.validate_task(task)
        app = self.app
        plain_args: list[Any] = normalize_json(list(args))
        plain_kwargs: dict[str, Any] = normalize_json(dict(kwargs))
        options = self.options_of(task)
        submission = conveyor.Submission(
            type=task.module_path,
            payload={"args": plain_args, "kwargs": plain_kwargs},
            queue=task.queue_name,
            priority=_results.stored_priority(task.priority),
            run_at=_aware(task.run_after),
            unique_key=_per_call(options.get("unique_key"), plain_args, plain_kwargs, "unique_key"),
            concurrency_key=_per_call(
                options.get("concurrency_key"), plain_args, plain_kwargs, "concurrency_key"
            ),
        )
        connection = connections[self.database] if self.url is None else None
        shared = connection is not None and self.shares_django_database()
        if shared and connection is not None and connection.in_atomic_block:
            if connection.vendor == "postgresql":
                connection.ensure_connection()
                raw = connection.connection
                handle = _wait(app, "submit_many", [submission], connection=raw)[0]
                return self._enqueued(task, handle.record)
            # SQLite: one writer at a time, and this transaction may hold the lock.
            return self._after_commit(app, task, submission, connection.alias)
        handle = _wait(app, "submit_many", [submission])[0]
        return self._enqueued(task, handle.record)

    def _after_commit(
        self, app: conveyor.Conveyor, task: Task, submission: conveyor.Submission, using: str
    ) -> TaskResult:
        """On SQLite in a transaction: submit when it commits (nothing if it rolls back).

        Django's transaction may hold the file's write lock, which conveyor's connection
        would wait for until the transaction ends: the job is written once it has. The id
        is chosen now, so the result handed back is the job's.
        """
        submission = replace(submission, id=app.new_job_id())
        transaction.on_commit(lambda: _wait(app, "submit_many", [submission]), using=using)
        result = self._task_result(
            task,
            id=str(submission.id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            payload=dict(submission.payload),
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def _enqueued(self, task: Task, job: Any) -> TaskResult:
        result = self.result_of(task, job, [])
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results ------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task result of a job id; TaskResultDoesNotExist if there is no such task."""
        app = self.app
        try:
            job = _wait(app, "get", result_id).record
        except conveyor.JobNotFound:
            raise TaskResultDoesNotExist(result_id) from None
        except conveyor.ConveyorError as exc:
            raise TaskResultDoesNotExist(f"{result_id}: {exc}") from None
        task = self.task_of(job.type, job.queue, job.priority)
        if task is None:
            raise TaskResultDoesNotExist(
                f"{result_id} is a conveyor job of type {job.type!r}, not a Django task"
            )
        attempts = _wait(app, "attempts", job.id) if job.attempt else []
        return self.result_of(task, job, attempts)

    def task_of(self, path: str, queue: str, priority: int) -> Task | None:
        """The Django task a job of type ``path`` runs, as it was enqueued (None: no task)."""
        task = _tasks.get(path)
        if task is None:
            try:
                task = import_string(path)
            except ImportError:
                return None
            if not isinstance(task, Task):
                return None
        return self._as_enqueued(task, queue, priority)

    def _as_enqueued(self, task: Task, queue: str, priority: int) -> Task:
        """``task`` on this backend with a job's queue and priority (its result's
        ``refresh()`` reads through the task's backend)."""
        wanted = _results.django_priority(priority)
        if (task.backend, task.queue_name, task.priority) == (self.alias, queue, wanted):
            return task
        try:
            found: Task = task.using(backend=self.alias, queue_name=queue, priority=wanted)
        except Exception:  # the queue left QUEUES since: the task as declared
            return task
        return found

    def result_of(
        self, task: Task, job: Any, attempts: list[Any], *, running_on: str | None = None
    ) -> TaskResult:
        """A job and its attempts (oldest first) as Django's TaskResult.

        ``running_on``: the worker running the job now, whose attempt is not recorded yet.
        """
        worker_ids = [a.worker_id for a in attempts if a.worker_id]
        if running_on is not None:
            worker_ids.append(running_on)
        elif job.status in (conveyor.Status.RUNNING, conveyor.Status.WAITING) and job.lease_owner:
            worker_ids.append(job.lease_owner)
        result = self._task_result(
            self._as_enqueued(task, job.queue, job.priority),
            id=job.id,
            status=TaskResultStatus(_results.django_status(job.status)),
            enqueued_at=_local(job.created_at),
            started_at=_local(_results.first_start(attempts, job.started_at)),
            last_attempted_at=_local(job.started_at),
            finished_at=_local(job.finished_at),
            payload=job.payload,
            errors=[
                TaskError(exception_class_path=f.exception_class_path, traceback=f.traceback)
                for f in _results.failures(attempts)
            ],
            worker_ids=worker_ids,
        )
        if job.status is conveyor.Status.SUCCEEDED:
            object.__setattr__(result, "_return_value", job.result)
        return result

    def _task_result(
        self,
        task: Task,
        *,
        id: str,
        status: TaskResultStatus,
        payload: Mapping[str, Any],
        enqueued_at: datetime | None = None,
        started_at: datetime | None = None,
        last_attempted_at: datetime | None = None,
        finished_at: datetime | None = None,
        errors: list[TaskError] | None = None,
        worker_ids: list[str] | None = None,
    ) -> TaskResult:
        return TaskResult(
            task=task,
            id=id,
            status=status,
            enqueued_at=enqueued_at,
            started_at=started_at,
            last_attempted_at=last_attempted_at,
            finished_at=finished_at,
            args=list(payload.get("args") or []),
            kwargs=dict(payload.get("kwargs") or {}),
            backend=self.alias,
            errors=errors or [],
            worker_ids=worker_ids or [],
        )

    # -- checks -------------------------------------------------------------------------

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's system checks: the database conveyor can use, the driver it shares."""
        found: list[checks.CheckMessage] = []
        try:
            self.database_url()
        except ImproperlyConfigured as exc:
            found.append(checks.Error(str(exc), id="conveyor.E001"))
            return found
        if self.url is None and connections[self.database].vendor == "postgresql":
            from django.db.backends.postgresql.psycopg_any import is_psycopg3

            if not is_psycopg3:
                found.append(
                    checks.Error(
                        f"database {self.database!r} runs on psycopg2: conveyor writes tasks in "
                        "Django's transaction through psycopg 3 only",
                        hint='pip install "psycopg[binary]" (Django uses psycopg 3 when '
                        "it is installed)",
                        id="conveyor.E002",
                    )
                )
        return found


def _wait(app: conveyor.Conveyor, method: str, *args: Any, **kwargs: Any) -> Any:
    """Run one of the application's coroutine methods from sync code, and wait for it.

    Sync code that async code called through ``sync_to_async`` (a view under ASGI, a
    test's async client) runs it on that calling event loop, as asgiref's
    ``async_to_sync`` does, with that loop's store; other sync code (WSGI, a
    management command) on conveyor's portal loop (``app.sync``).
    """
    loop = getattr(SyncToAsync.threadlocal, "main_event_loop", None)
    pid = getattr(SyncToAsync.threadlocal, "main_event_loop_pid", None)
    if loop is not None and pid == os.getpid() and loop.is_running():
        return async_to_sync(getattr(app, method))(*args, **kwargs)
    return getattr(app.sync, method)(*args, **kwargs)


def _checked(options: object, where: str) -> dict[str, Any]:
    """A mapping of conveyor options, or ImproperlyConfigured naming the unknown ones."""
    if not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict of conveyor options, not {options!r}")
    unknown = set(options) - _ALL_OPTIONS
    if unknown:
        raise ImproperlyConfigured(
            f"{where} has unknown options {sorted(unknown)}: use {', '.join(sorted(_ALL_OPTIONS))}"
        )
    return dict(options)


def _per_call(value: Any, args: list[Any], kwargs: dict[str, Any], name: str) -> str | None:
    """A submit option: a string as is, or a function's answer for these arguments."""
    if value is None or isinstance(value, str):
        return value
    if callable(value):
        answer = value(*args, **kwargs)
        if answer is not None and not isinstance(answer, str):
            raise TypeError(f"{name} function returned {answer!r}: return a string or None")
        return answer
    raise TypeError(f"{name} is a string or a function of the task's arguments, not {value!r}")


def _aware(when: datetime | None) -> datetime | None:
    """run_after as an aware time (a naive one is in Django's TIME_ZONE, USE_TZ off)."""
    if when is None or timezone.is_aware(when):
        return when
    return timezone.make_aware(when)


def _local(when: datetime | None) -> datetime | None:
    """A time as Django's code expects it: aware with USE_TZ, else naive local time."""
    if when is None or settings.USE_TZ:
        return when
    return timezone.make_naive(when)
