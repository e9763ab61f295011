"""The ``conveyor.django`` application: conveyor's schema follows ``manage.py migrate``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ConveyorConfig(AppConfig):
    """conveyor's Django app (label ``conveyor``)."""

    name = "conveyor.django"
    label = "conveyor"
    verbose_name = "conveyor"

    def ready(self) -> None:
        # Migration 0001 creates conveyor's tables; conveyor's later migrations (a newer
        # conveyor installed) are applied on every migrate, after Django's own.
        post_migrate.connect(_upgrade, sender=self)


def _upgrade(sender: AppConfig, using: str, **kwargs: Any) -> None:
    from conveyor.django.schema import migrate_database

    migrate_database(using, verbosity=int(kwargs.get("verbosity", 1)))
