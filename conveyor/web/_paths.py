"""The ``{job_id:job}`` and ``{job_id:job_itself}`` path parameters: a job's id as the
caller names it.

A tenant's token names its jobs by their bare ids (no ``/``); an admin names a tenant's job
by its stored id, ``tenant/id`` (conveyor/core/ids.py), with exactly one ``/``. So a job id
in a path is one segment or two, never more: ``/jobs/acme/x/cancel`` is job ``acme/x``'s
cancel, and a GET of it is not a read of a job called ``acme/x/cancel``.

Two segments whose second is one of a job's sub-resources or actions (``/jobs/acme/retry``)
are that sub-resource or action of the job named by the first, whatever the method: the job
itself (``{job_id:job_itself}``, the routes of the job's own resource) never matches them.
Otherwise a GET of ``/jobs/acme/retry`` would read a job ``acme/retry``, and a 405 on the
path would advertise ``Allow: GET`` for what the document calls a POST-only action.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor

# The last segments of the routes below a job (web/_api.py, web/ui/_routes.py).
BELOW_A_JOB = ("attempts", "children", "events", "cancel", "retry", "retry-failed-children")


class JobIdConvertor(Convertor[str]):
    regex = "[^/]+(?:/[^/]+)?"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class JobItselfConvertor(JobIdConvertor):
    """A job id at the end of a path, unless its second segment names a route below a job."""

    regex = "[^/]+(?:/(?!(?:" + "|".join(BELOW_A_JOB) + ")$)[^/]+)?"


register_url_convertor("job", JobIdConvertor())
register_url_convertor("job_itself", JobItselfConvertor())
