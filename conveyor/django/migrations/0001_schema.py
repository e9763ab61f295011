"""Create conveyor's tables (conveyor's own migrations, forward only)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations


def create(apps: Any, schema_editor: Any) -> None:
    from conveyor.django.schema import migrate_database

    migrate_database(schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    # conveyor migrates on a connection of its own, under its own lock: Django's
    # transaction around a migration would only hold SQLite's write lock against it.
    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(create, elidable=False)]
