"""Settings of the comparison project: ``BENCH_PG_NAME`` names the PostgreSQL database
(on ``CONVEYOR_TEST_POSTGRES_URL``'s server) both backends keep their tasks in."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_pg = conninfo_to_dict(
    os.environ.get("CONVEYOR_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
)

SECRET_KEY = "bench-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
USE_TZ = True
ROOT_URLCONF = "bench.djangopeer.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["conveyor.django", "django_tasks_db", "bench.djangopeer"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_PG_NAME", "postgres"),
        "USER": _pg.get("user", "postgres"),
        "PASSWORD": _pg.get("password", ""),
        "HOST": _pg.get("host", "127.0.0.1"),
        "PORT": _pg.get("port", "5432"),
        # Persistent connections, as in production: a request does not pay for a new one.
        "CONN_MAX_AGE": 600,
    }
}
TASKS = {
    "default": {"BACKEND": "conveyor.django.ConveyorBackend"},
    "peer": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
