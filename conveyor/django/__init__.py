"""conveyor as Django's task backend (``django.tasks``, Django 6): the ``conveyor.django`` app.

::

    INSTALLED_APPS += ["conveyor.django"]
    TASKS = {"default": {"BACKEND": "conveyor.django.ConveyorBackend"}}

``python manage.py migrate`` creates conveyor's tables in Django's database and
``python manage.py conveyor_worker`` runs the tasks; see docs/django.md.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded when first used, so that listing the app in INSTALLED_APPS imports nothing of
# django.tasks or of conveyor's client before Django has set itself up.
_EXPORTS = {
    "ConveyorBackend": "conveyor.django.backend",
    "ConveyorTask": "conveyor.django.backend",
    "ConveyorTaskContext": "conveyor.django._context",
}

__all__ = ["ConveyorBackend", "ConveyorTask", "ConveyorTaskContext"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'conveyor.django' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
