"""The REST API: submit jobs over HTTP and follow them, built on the :class:`Conveyor` facade.

``conveyor serve APP`` serves it with uvicorn; an application can also mount it::

    from fastapi import FastAPI
    from conveyor.web import create_api
    from myproject.jobs import app as jobs

    main = FastAPI()
    main.mount("/conveyor", create_api(jobs))   # GET /conveyor/jobs/{id}, ...

    @main.post("/stars")
    async def star(repo: str):
        job = await jobs.submit("count_stars", {"repo": repo})
        return job.accepted(prefix="/conveyor/jobs")   # 202, Location: /conveyor/jobs/{id}

Every route but ``/health/*`` needs a bearer token (``conveyor tokens create``); tokens
belong to a tenant and have a role (``read``, ``write``, ``admin``). See docs/api.md.
"""

from conveyor.web._app import ApiOptions, create_api
from conveyor.web._responses import accepted

__all__ = ["ApiOptions", "accepted", "create_api"]
