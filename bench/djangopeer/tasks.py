"""The benchmark's task: does nothing, so that the figures are the backends' own."""

from __future__ import annotations

from django.tasks import task


@task
def noop(n: int) -> None:
    return None
