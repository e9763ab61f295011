"""The context a ``takes_context=True`` task is given: Django's, with conveyor's job."""

from __future__ import annotations

from dataclasses import dataclass

from django.tasks import TaskContext

import conveyor


@dataclass(frozen=True, slots=True, kw_only=True)
class ConveyorTaskContext(TaskContext):
    """What a ``takes_context=True`` task gets: Django's context, and conveyor's job.

    ``attempt`` is conveyor's attempt number (1 on the first run, 2 on the first
    retry...); ``job`` is the :class:`conveyor.JobContext`, for progress
    (``context.job.progress(3, 10)``), checkpoints, cancellation and the job's logger.
    """

    job: conveyor.JobContext

    @property
    def attempt(self) -> int:
        return self.job.attempt
