"""Settings of the example shop: SQLite by default, PostgreSQL with ``SHOP_POSTGRES``.

``SHOP_POSTGRES=postgresql://postgres@127.0.0.1:5432/shop`` puts the shop (and its
tasks, in the same database and transaction) on PostgreSQL.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-only-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "shopsite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["conveyor.django", "shop"]

_postgres = os.environ.get("SHOP_POSTGRES")
if _postgres:
    _url = urlsplit(_postgres)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": _url.path.lstrip("/"),
            "USER": _url.username or "",
            "PASSWORD": _url.password or "",
            "HOST": _url.hostname or "",
            "PORT": str(_url.port or ""),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "shop.sqlite3",
            # conveyor's worker is another process: tests need a file, not memory.
            "TEST": {"NAME": BASE_DIR / "test-shop.sqlite3"},
        }
    }

TASKS = {
    "default": {
        "BACKEND": "conveyor.django.ConveyorBackend",
        "QUEUES": ["default", "reports"],
        "OPTIONS": {
            # conveyor's options per task path, beside those given to @task(...).
            "TASKS": {"shop.tasks.send_receipt": {"max_attempts": 5, "backoff": ("2s", "5m")}},
        },
    }
}
