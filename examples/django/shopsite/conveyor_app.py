"""The task backend's conveyor application, for conveyor's own commands:

    DJANGO_SETTINGS_MODULE=shopsite.settings conveyor serve shopsite.conveyor_app:app

serves conveyor's dashboard and REST API beside the Django site, on the same database.
"""

import django

django.setup()

from django.tasks import task_backends  # noqa: E402

app = task_backends["default"].app
