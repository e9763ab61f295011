"""conveyor's schema in a Django project: applied by ``manage.py migrate``.

conveyor's own numbered migrations (forward only) do the work; Django's migration
``conveyor.0001_schema`` and the app's ``post_migrate`` receiver run them on the database
each conveyor backend keeps its jobs in.
"""

from __future__ import annotations

import sys

from django.db import DEFAULT_DB_ALIAS
from django.tasks import task_backends


def migrate_database(alias: str, *, verbosity: int = 1) -> list[str]:
    """Apply conveyor's pending migrations for the backends whose jobs are in ``alias``.

    A backend with its own ``OPTIONS["URL"]`` is migrated with Django's default database.
    Returns the names of the migrations applied.
    """
    from conveyor.django.backend import ConveyorBackend

    applied: list[str] = []
    done: set[str] = set()
    for backend in task_backends.all():
        if not isinstance(backend, ConveyorBackend):
            continue
        home = DEFAULT_DB_ALIAS if backend.url is not None else backend.database
        url = backend.database_url()
        if home != alias or url in done:
            continue
        done.add(url)
        names = backend.app.sync.migrate()
        if names and verbosity >= 1:
            sys.stdout.write(f"  conveyor ({backend.alias}): applied {', '.join(names)}\n")
        applied += names
    return applied
