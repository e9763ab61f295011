"""pgqueuer, measured beside conveyor by the network benchmark (``bench.network``).

pgqueuer is not a dependency of conveyor: ``pip install pgqueuer asyncpg uvloop`` (the
versions of the shared peer benchmark: 1.6.0, 0.32.0, 0.23.0). Its worker runs as
``python -m bench.pgq BATCH`` with ``BENCH_PGQ_DSN`` naming the database, exactly as
``pgq run`` starts it (``pgqueuer.run`` on uvloop), with one no-op entrypoint.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

DSN_ENV = "BENCH_PGQ_DSN"
ENTRYPOINT = "noop"


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The worker's factory: one connection, one no-op entrypoint."""
    conn = await asyncpg.connect(os.environ[DSN_ENV])
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        """Do nothing: the benchmark measures the queue, not the handler."""

    try:
        yield pgq
    finally:
        await conn.close()


if __name__ == "__main__":
    import pgqueuer
    import uvloop

    uvloop.run(pgqueuer.run("bench.pgq:create_pgqueuer", batch_size=int(sys.argv[1])))
