"""The ``{job_id:job}`` path parameter: a job's id as the caller names it.

A tenant's token names its jobs by their bare ids (no ``/``); an admin names a tenant's job
by its stored id, ``tenant/id`` (conveyor/core/ids.py), with exactly one ``/``. So a job id
in a path is one segment or two, never more: ``/jobs/acme/x/cancel`` is job ``acme/x``'s
cancel, and a GET of it is not a read of a job called ``acme/x/cancel``.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor


class JobIdConvertor(Convertor[str]):
    regex = "[^/]+(?:/[^/]+)?"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("job", JobIdConvertor())
