"""The PostgreSQL backend: many worker processes on many machines sharing one database.

Install it with ``pip install "conveyor[postgres]"`` and point conveyor at a
``postgresql://user:password@host:5432/dbname`` URL. conveyor's tables (``conveyor_*``)
live beside the application's own; ``conveyor migrate`` creates them, and so does the
first worker or client to connect unless ``migrate=False``.

- Claims take several due jobs in one statement with ``FOR UPDATE SKIP LOCKED``, through
  a partial index of queued jobs, so claim cost stays flat with millions of rows.
- Every time that decides anything (lease expiry, due run_at, retries) is the server's
  ``now()``: clock skew between worker machines cannot expire or extend a lease.
- Submits, retries and resumed queues ``NOTIFY conveyor_job_ready`` and cancel requests
  ``NOTIFY conveyor_cancel`` (triggers, delivered on commit): idle workers start new work
  at once and running handlers learn of their cancellation at once; polling remains as a
  fallback.
- ``submit(..., connection=conn)`` writes jobs in the application's own transaction: they
  exist only if it commits. See ``docs/postgres.md``.
- Connections lost (a restart, a failover) are replaced by the pool; an operation made
  meanwhile waits a few seconds for the server, then raises, and the worker retries with
  backoff.
"""

from conveyor.store.postgres.backend import PostgresStore

__all__ = ["PostgresStore"]
