"""Settings of the test project: a SQLite file (alias ``default``) and a PostgreSQL
database (alias ``pg``), each with a conveyor task backend.

The tests point the databases at fresh ones per test: in-process by changing the
connection's ``settings_dict`` (as Django's test runner does), and for worker processes
through ``TESTPROJECT_SQLITE`` and ``TESTPROJECT_PG_NAME``.
"""

from __future__ import annotations

import os
import tempfile

from psycopg.conninfo import conninfo_to_dict

_pg = conninfo_to_dict(
    os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
)

SECRET_KEY = "test-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["conveyor.django", "tests.djangoproject"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ROOT_URLCONF = "tests.djangoproject.urls"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get(
            "TESTPROJECT_SQLITE", os.path.join(tempfile.gettempdir(), "testproject-unused.db")
        ),
    },
    "pg": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("TESTPROJECT_PG_NAME", _pg.get("dbname", "postgres")),
        "USER": _pg.get("user", "postgres"),
        "PASSWORD": _pg.get("password", ""),
        "HOST": _pg.get("host", "127.0.0.1"),
        "PORT": _pg.get("port", "5432"),
    },
}

# Short backoffs, so that a retried task's next attempt comes within a test.
_DEFAULTS = {"backoff": ("100ms", "500ms")}

TASKS = {
    "default": {
        "BACKEND": "conveyor.django.ConveyorBackend",
        "QUEUES": ["default", "other"],
        "OPTIONS": {"TASK_DEFAULTS": _DEFAULTS},
    },
    "pg": {
        "BACKEND": "conveyor.django.ConveyorBackend",
        "QUEUES": ["default", "other"],
        "OPTIONS": {"DATABASE": "pg", "TASK_DEFAULTS": _DEFAULTS},
    },
}
