"""conveyor's Django backend beside django-tasks-db, on one machine and one database.

Run it in a Python 3.12+ environment with Django 6 and django-tasks-db::

    .venv-3.12/bin/pip install django-tasks-db
    .venv-3.12/bin/python -m bench.django_peer --requests 1000 --tasks 10000

It makes a fresh PostgreSQL database (on ``CONVEYOR_TEST_POSTGRES_URL``'s server),
migrates the project in bench/djangopeer (both backends' tables), then measures:

- **enqueue from a view**: Django's test client posts to a view that enqueues one no-op
  task inside ``transaction.atomic()`` (the whole request: URL routing, the view, the
  transaction and its commit), the two backends interleaved round by round;
- **drain**: 10,000 no-op tasks enqueued, then one worker process of each backend runs
  them all (``conveyor_worker --burst``; ``db_worker --batch``): the time from the first
  task's start to the last one's end, as the database recorded them, and the worker
  process's wall time (its start-up included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get(
    "CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
BACKENDS = {"conveyor": "default", "django-tasks-db": "peer"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="view requests a round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of requests")
    parser.add_argument(
        "--tasks", type=int, default=10_000, help="tasks to drain (0: measure only the view)"
    )
    args = parser.parse_args()

    import psycopg

    name = f"conveyor_bench_django_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    os.environ["BENCH_PG_NAME"] = name
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.djangopeer.settings"
    try:
        report(name, args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def report(name: str, args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import django_tasks_db

    print(
        f"Django {django.get_version()}, django-tasks-db {django_tasks_db.__version__}, "
        f"Python {sys.version.split()[0]}, PostgreSQL database {name}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    views = enqueue_from_a_view(args.requests, args.rounds)
    print("\n| enqueue from a view (µs a request) | rounds | median |")
    print("|---|---|---|")
    for label, rounds in views.items():
        shown = ", ".join(f"{r:.0f}" for r in rounds)
        print(f"| {label} | {shown} | {statistics.median(rounds):.0f} |")
    if not args.tasks:
        return
    print(
        f"\n| drain of {args.tasks:,} no-op tasks, one worker process | enqueue loop "
        "(µs a task) | first start → last end | tasks/s | worker process wall time |"
    )
    print("|---|---|---|---|---|")
    for label, alias in BACKENDS.items():
        enqueue_us, span, wall, done = drain(alias, args.tasks)
        assert done == args.tasks, f"{label}: {done} of {args.tasks} tasks succeeded"
        print(
            f"| {label} | {enqueue_us:.0f} | {span:.1f} s | {args.tasks / span:,.0f} | "
            f"{wall:.1f} s |"
        )


def enqueue_from_a_view(requests: int, rounds: int) -> dict[str, list[float]]:
    from django.test import Client

    client = Client()
    found: dict[str, list[float]] = {label: [] for label in BACKENDS}
    for alias in BACKENDS.values():  # warm up: connections, pools, imports
        for _ in range(20):
            assert client.post(f"/enqueue/{alias}/").status_code == 201
    for number in range(rounds):
        order = list(BACKENDS.items())
        if number % 2:
            order.reverse()
        for label, alias in order:
            start = time.perf_counter()
            for _ in range(requests):
                client.post(f"/enqueue/{alias}/")
            found[label].append((time.perf_counter() - start) / requests * 1e6)
    return found


def drain(alias: str, count: int) -> tuple[float, float, float, int]:
    from bench.djangopeer.tasks import noop

    clear(alias)
    task = noop.using(backend=alias)
    start = time.perf_counter()
    for n in range(count):
        task.enqueue(n)
    enqueue_us = (time.perf_counter() - start) / count * 1e6
    if alias == "default":
        command = ["conveyor_worker", "--burst"]
    else:
        command = ["db_worker", "--batch", "--backend", "peer", "--interval", "0"]
        command += ["--no-startup-delay", "--no-reload"]
    env = dict(os.environ) | {"PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "django", *command, "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    span, done = spans(alias)
    return enqueue_us, span, wall, done


def clear(alias: str) -> None:
    from django.db import connection

    table = "conveyor_jobs" if alias == "default" else "django_tasks_database_dbtaskresult"
    with connection.cursor() as cursor:
        if alias == "default":
            cursor.execute("DELETE FROM conveyor_attempts")
        cursor.execute(f"DELETE FROM {table}")


def spans(alias: str) -> tuple[float, int]:
    from django.db import connection

    query: dict[str, Any] = {
        "default": "SELECT min(started_at), max(finished_at), count(*) FROM conveyor_jobs "
        "WHERE status = 'succeeded'",
        "peer": "SELECT min(started_at), max(finished_at), count(*) FROM "
        "django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'",
    }
    with connection.cursor() as cursor:
        cursor.execute(query[alias])
        first, last, done = cursor.fetchone()
    return (last - first).total_seconds(), int(done)


if __name__ == "__main__":
    main()
