"""One view per backend: enqueue a task inside the request's transaction."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path

from bench.djangopeer.tasks import noop


def enqueue(request: HttpRequest, backend: str) -> JsonResponse:
    with transaction.atomic():
        result = noop.using(backend=backend).enqueue(1)
    return JsonResponse({"task": result.id}, status=201)


urlpatterns = [path("enqueue/<str:backend>/", enqueue)]
