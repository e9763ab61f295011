"""conveyor as Django's task backend: a real Django project (tests/djangoproject) on a
real SQLite file and a real PostgreSQL database made per test, its tasks run by real
``manage.py conveyor_worker`` processes.

Django 6 needs Python 3.12 or later: under an older Python, or without Django, the
module is skipped (``.ci/run`` runs it in a Python 3.12 environment with Django).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

django = pytest.importorskip(
    "django", minversion="6.0", reason="Django 6 (Python 3.12+) runs conveyor.django's tests"
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.djangoproject.settings")
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.tasks import TaskResultStatus, task_backends  # noqa: E402
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist  # noqa: E402
from django.utils import timezone  # noqa: E402

from conveyor.django import ConveyorBackend  # noqa: E402
from tests.djangoproject import tasks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ALIASES = {"sqlite": "default", "postgres": "pg"}
# A lease long enough for a heartbeat on a busy machine (one that misses a small part of
# its lease stops the run), short enough that a killed worker's task is rescued soon.
FAST = ("--lease", "4", "--rescue-interval", "0.2", "--poll-interval", "0.1")

pytestmark = pytest.mark.processes


@dataclass
class Project:
    """The test project on this test's database: its task backend, and its workers."""

    alias: str
    name: str  # the database's name (a file path on SQLite)
    url: str
    folder: Path

    @property
    def backend(self) -> ConveyorBackend:
        found = task_backends[self.alias]
        assert isinstance(found, ConveyorBackend)
        return found

    def env(self) -> dict[str, str]:
        key = "TESTPROJECT_SQLITE" if self.alias == "default" else "TESTPROJECT_PG_NAME"
        return dict(os.environ) | {
            "DJANGO_SETTINGS_MODULE": "tests.djangoproject.settings",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            key: self.name,
        }

    def start_worker(self, *args: str) -> subprocess.Popen[bytes]:
        log = open(self.folder / f"worker-{time.monotonic_ns()}.log", "wb")  # noqa: SIM115
        command = [sys.executable, "-m", "django", "conveyor_worker", "--backend", self.alias]
        proc = subprocess.Popen(
            [*command, *FAST, *args], cwd=ROOT, env=self.env(), stdout=log, stderr=log
        )
        log.close()
        return proc

    def burst(self, *args: str) -> str:
        """Run a burst worker to its end; return its log."""
        proc = self.start_worker("--burst", *args)
        try:
            code = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
        logs = self.logs()
        assert code == 0, logs
        return logs

    def run_until_finished(self, result_id: str) -> Any:
        """Run a worker until the task has finished (retries included); its result."""
        proc = self.start_worker()
        try:
            return self.wait_for(result_id)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.folder.glob("worker-*.log")))

    def wait_for(self, result_id: str, *, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = self.backend.get_result(result_id)
            if result.is_finished:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{result_id} still {result.status}:\n{self.logs()}")
            time.sleep(0.05)


@pytest.fixture
def project(backend: str, db_url: str, tmp_path: Path) -> Iterator[Project]:
    alias = ALIASES[backend]
    name = db_url.removeprefix("sqlite:///") if backend == "sqlite" else db_url.rsplit("/", 1)[1]
    connection = connections[alias]
    saved = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = name
    try:
        call_command("migrate", database=alias, verbosity=0)
        url = task_backends[alias].database_url()  # on SQLite, the file beside Django's
        yield Project(alias, name, url, tmp_path)
    finally:
        task_backends[alias].app.sync.close()
        connection.close()
        connection.settings_dict["NAME"] = saved


def _visible_to_django(project: Project, job_id: str) -> bool:
    with connections[project.alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM conveyor_jobs WHERE id = %s", [job_id])
        (count,) = cursor.fetchone()
    return bool(count)


# -- same database, same transaction ----------------------------------------------------


def test_migrate_creates_conveyors_tables(project: Project) -> None:
    if project.alias == "pg":  # in Django's own database
        with connections[project.alias].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM conveyor_migrations")
            (applied,) = cursor.fetchone()
        assert applied > 0
    else:  # in a file beside Django's
        assert project.url.endswith("-conveyor.db")
        assert Path(project.url.removeprefix("sqlite:///")).exists()
    assert project.backend.app.sync.migrate() == []  # all applied
    call_command("migrate", database=project.alias, verbosity=0)  # again: nothing to do


def test_a_rolled_back_transaction_leaves_no_task(project: Project) -> None:
    backend = project.backend
    with pytest.raises(RuntimeError, match="roll back"), transaction.atomic(using=project.alias):
        result = tasks.add.using(backend=project.alias).enqueue(2, 3)
        if project.alias == "pg":
            # Written on Django's connection, in its transaction: Django sees it, conveyor's
            # own connections (another session) do not until it commits.
            assert _visible_to_django(project, result.id)
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result.id)
        raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result.id)
    if project.alias == "pg":
        assert not _visible_to_django(project, result.id)
    project.burst()
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result.id)


def test_a_committed_task_runs_in_conveyor_worker(project: Project) -> None:
    before = timezone.now()
    with transaction.atomic(using=project.alias):
        result = tasks.add.using(backend=project.alias).enqueue(2, 3)
        with pytest.raises(TaskResultDoesNotExist):
            project.backend.get_result(result.id)  # nothing visible before the commit
    assert result.status == TaskResultStatus.READY
    queued = project.backend.get_result(result.id)
    assert queued.status == TaskResultStatus.READY
    assert queued.args == [2, 3]
    project.burst()
    done = project.backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 5
    assert done.enqueued_at is not None and done.enqueued_at >= before - timedelta(seconds=1)
    assert done.started_at is not None and done.finished_at is not None
    assert done.last_attempted_at == done.started_at
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert len(done.worker_ids) == 1 and done.errors == []
    assert tasks.add.using(backend=project.alias).get_result(result.id).return_value == 5


def test_a_task_enqueued_outside_a_transaction_runs(project: Project) -> None:
    result = tasks.where_am_i.using(backend=project.alias).enqueue(project.alias)
    project.burst("--queues", "other")
    done = project.backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL, project.logs()
    vendor = "sqlite" if project.alias == "default" else "postgresql"
    assert done.return_value == {"vendor": vendor, "one": 1}  # Django's connection, set up
    assert done.task.priority == 50 and done.task.queue_name == "other"


def test_a_failing_task_is_failed_with_its_exception_and_traceback(project: Project) -> None:
    result = tasks.fail.using(backend=project.alias).enqueue("no such order")
    failed = project.run_until_finished(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert len(failed.errors) == 2  # max_attempts=2: both attempts, oldest first
    for error in failed.errors:
        assert error.exception_class_path == "builtins.ValueError"
        assert error.exception_class is ValueError
        assert "raise ValueError(message)" in error.traceback
        assert error.traceback.rstrip().endswith("ValueError: no such order")
    assert len(failed.worker_ids) == 2
    with pytest.raises(ValueError, match="Task failed"):
        failed.return_value  # noqa: B018


def test_run_after_is_honoured(project: Project) -> None:
    now = timezone.now()
    later = tasks.add.using(backend=project.alias, run_after=now + timedelta(hours=1)).enqueue(1, 1)
    soon_at = now + timedelta(seconds=2)
    soon = tasks.add.using(backend=project.alias, run_after=soon_at).enqueue(2, 2)
    project.burst()
    assert project.backend.get_result(later.id).status == TaskResultStatus.READY
    while timezone.now() < soon_at:  # waits for a time, not for a worker
        time.sleep(0.05)
    project.burst()
    done = project.backend.get_result(soon.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.started_at >= soon_at
    assert project.backend.get_result(later.id).status == TaskResultStatus.READY


def test_an_async_task_runs_on_the_workers_loop(project: Project) -> None:
    result = tasks.async_add.using(backend=project.alias).enqueue(a=4, b=5)
    project.burst()
    done = project.backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"sum": 9, "in_loop": True}
    assert done.kwargs == {"a": 4, "b": 5}


def test_a_context_task_gets_conveyors_attempt_number(project: Project) -> None:
    result = tasks.with_context.using(backend=project.alias).enqueue(fail_first=True)
    done = project.run_until_finished(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL, project.logs()
    value = done.return_value
    assert value["attempt"] == 2 and value["result_id"] == result.id
    assert value["errors"] == ["builtins.ValueError"]  # the first attempt's, read back
    assert value["worker_ids"] == done.worker_ids
    job = project.backend.app.sync.get(result.id)
    assert job.record.progress is not None and job.record.progress.message == "half way"


def test_a_sigkilled_workers_task_is_rescued_and_completes_once(project: Project) -> None:
    folder = project.folder / "block"
    folder.mkdir()
    result = tasks.block_until.using(backend=project.alias).enqueue(str(folder))
    first = project.start_worker()
    try:
        deadline = time.monotonic() + 60
        # The file exists once opened: wait for its line, written before the task waits.
        while not (folder / "starts").exists() or not (folder / "starts").read_text():
            assert time.monotonic() < deadline, project.logs()
            assert first.poll() is None, project.logs()
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    (folder / "release").touch()
    second = project.start_worker()
    try:
        done = project.wait_for(result.id)
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=60)
    assert done.status == TaskResultStatus.SUCCESSFUL, project.logs()
    assert done.return_value == "released"
    starts = (folder / "starts").read_text().split()
    ends = (folder / "ends").read_text().split()
    assert len(starts) == 2 and starts[0] == str(first.pid)
    assert ends == [str(second.pid)]  # ran to its end once, on the worker that rescued it
    assert [e.exception_class_path for e in done.errors] == ["conveyor.LeaseLost"]
    assert len(done.worker_ids) == 2 and done.worker_ids[0] != done.worker_ids[1]


def test_the_result_id_is_a_conveyor_job_id(project: Project) -> None:
    result = tasks.add.using(backend=project.alias).enqueue(1, 2)
    listed = subprocess.run(
        [sys.executable, "-m", "conveyor", "jobs", "list", "--json", "--database-url", project.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    jobs = json.loads(listed.stdout)["jobs"]
    [job] = [j for j in jobs if j["id"] == result.id]
    assert job["type"] == "tests.djangoproject.tasks.add"
    assert job["payload"] == {"args": [1, 2], "kwargs": {}}


# -- bad input --------------------------------------------------------------------------


def test_an_unknown_result_id_does_not_exist(project: Project) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        project.backend.get_result("01-no-such-job")


def test_a_conveyor_job_that_is_no_django_task_is_no_task_result(project: Project) -> None:
    app = project.backend.app
    if app.registry.find("plain") is None:
        app.job(name="plain")(lambda ctx: None)
    job = app.sync.submit("plain")
    with pytest.raises(TaskResultDoesNotExist, match="not a Django task"):
        project.backend.get_result(job.id)


def test_bad_enqueues_are_refused_and_store_nothing(project: Project) -> None:
    add = tasks.add.using(backend=project.alias)
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="priority"):
        add.using(priority=101)
    with pytest.raises(TypeError, match="Unsupported type"):
        add.enqueue(object(), 1)
    assert project.backend.app.sync.list_jobs() == []
