"""Server CPU per job of a claim and a settle on PostgreSQL: ``python -m bench.pg_costs``.

Drains ``--jobs`` queued no-op jobs in batches of 100 (``--batch`` sets it for the store's
variants, as a worker's ``--concurrency`` does) on one connection, with no worker
around it, and reads the CPU time of the serving backend from ``/proc`` around each
claim and each settle. Each variant runs on a fresh database holding conveyor's schema;
the variants are interleaved, ``--rounds`` times. Variants:

- ``store``: ``PostgresStore.claim`` and ``settle`` as they are (also the client's CPU);
- ``fillfactor``: the same after ``fillfactor = 50`` on ``conveyor_jobs`` (prints the
  HOT updates: ``status`` is in index predicates, so there are none);
- ``fewer-indexes``: the same without four secondary indexes of ``conveyor_jobs``;
- ``raw``: the bare protocol in SQL on the same table (a ``SKIP LOCKED`` claim; a lock,
  the update and the attempt row in one pipelined transaction);
- ``raw-nolock``, ``raw-exists``: ``raw`` without the lock, with the settle's probes;
- ``narrow``: a prototype that claims from a narrow ``ready`` table into a ``leases``
  table and writes the wide row once, at settle.

Needs PostgreSQL at ``--url`` (a server URL; databases ``conveyor_pgcosts_*`` are made
and dropped). Only the server's figures are comparable between variants. ``/proc`` counts
CPU in clock ticks (10 ms), so drains shorter than about 10,000 jobs read as noise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from bench.app import build
from conveyor import Conveyor, Submission
from conveyor.core.lifecycle import Status
from conveyor.core.model import Outcome, Settlement

BATCH = 100
DROPPED = ("created", "tenant_created", "finished_at", "prunable")
RAW_CLAIM = """
UPDATE conveyor_jobs SET status = 'running', attempt = attempt + 1,
    lease_token = lease_token + 1, lease_owner = 'w',
    lease_expires_at = clock_timestamp() + interval '60s',
    started_at = clock_timestamp(), cancel_requested = false
WHERE id = ANY(ARRAY(
    SELECT id FROM conveyor_jobs WHERE status = 'queued' AND queue = 'default'
      AND run_at <= now() ORDER BY priority, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED))
RETURNING *"""
RAW_LOCK = "SELECT id FROM conveyor_jobs WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE"
RAW_SETTLE = """
WITH s AS (
    UPDATE conveyor_jobs j SET status = 'succeeded', result = NULL, finished_at = now(),
        lease_expires_at = NULL
    FROM unnest(%(ids)s::text[], %(tokens)s::bigint[]) e (id, token)
    WHERE j.id = e.id AND j.lease_token = e.token AND j.status = 'running' {probes}
    RETURNING j.id, j.attempt, j.lease_owner, j.started_at)
INSERT INTO conveyor_attempts (job_id, number, worker_id, started_at, finished_at, outcome)
SELECT id, attempt, lease_owner, started_at, now(), 'succeeded' FROM s"""
PROBES = """
    AND NOT EXISTS (SELECT 1 FROM conveyor_job_counts c WHERE c.job_id = j.id)
    AND NOT EXISTS (SELECT 1 FROM conveyor_dependencies d JOIN conveyor_jobs p
                    ON p.id = d.job_id WHERE d.depends_on_id = j.id AND p.status = 'pending')"""
NARROW_SETUP = """
CREATE TABLE ready (queue text, priority int, run_at timestamptz, id text PRIMARY KEY);
CREATE INDEX ready_claim ON ready (queue, priority, run_at, id);
CREATE TABLE leases (job_id text PRIMARY KEY, token bigint, owner text, expires_at timestamptz);
CREATE INDEX leases_expiry ON leases (expires_at);
INSERT INTO ready SELECT queue, priority, run_at, id FROM conveyor_jobs;"""
NARROW_CLAIM = """
WITH c AS (
    DELETE FROM ready WHERE id = ANY(ARRAY(
        SELECT id FROM ready WHERE queue = 'default' AND run_at <= now()
        ORDER BY priority, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED))
    RETURNING id),
l AS (
    INSERT INTO leases SELECT id, 1, 'w', clock_timestamp() + interval '60s' FROM c
    RETURNING job_id, token)
SELECT j.*, l.token FROM l JOIN conveyor_jobs j ON j.id = l.job_id"""
NARROW_LOCK = "SELECT job_id FROM leases WHERE job_id = ANY(%(ids)s) ORDER BY job_id FOR UPDATE"
NARROW_SETTLE = """
WITH d AS (
    DELETE FROM leases l USING unnest(%(ids)s::text[], %(tokens)s::bigint[]) e (id, token)
    WHERE l.job_id = e.id AND l.token = e.token RETURNING l.job_id, l.owner),
s AS (
    UPDATE conveyor_jobs j SET status = 'succeeded', attempt = attempt + 1,
        lease_token = lease_token + 1, result = NULL, started_at = now(), finished_at = now()
    FROM d WHERE j.id = d.job_id RETURNING j.id, j.attempt, d.owner, j.started_at)
INSERT INTO conveyor_attempts (job_id, number, worker_id, started_at, finished_at, outcome)
SELECT id, attempt, owner, started_at, now(), 'succeeded' FROM s"""
RAW: dict[str, tuple[str, list[str]]] = {
    "raw": (RAW_CLAIM, [RAW_LOCK, RAW_SETTLE.format(probes="")]),
    "raw-nolock": (RAW_CLAIM, [RAW_SETTLE.format(probes="")]),
    "raw-exists": (RAW_CLAIM, [RAW_LOCK, RAW_SETTLE.format(probes=PROBES)]),
    "narrow": (NARROW_CLAIM, [NARROW_LOCK, NARROW_SETTLE]),
}
VARIANTS = ("store", "fillfactor", "fewer-indexes", *RAW)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes, from /proc."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@contextmanager
def scratch(server: str, name: str) -> Iterator[str]:
    """A new database with conveyor's schema and queued no-op jobs, dropped afterwards."""
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name}")
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def fill(app: Conveyor, jobs: int) -> None:
    for offset in range(0, jobs, 1000):
        await app.submit_many([Submission("noop", {})] * min(1000, jobs - offset))


async def fill_only(url: str, jobs: int) -> None:
    app = build(url)
    try:
        await fill(app, jobs)
    finally:
        await app.close()


def prepare(url: str, variant: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        if variant == "fillfactor":
            conn.execute("ALTER TABLE conveyor_jobs SET (fillfactor = 50)")
            conn.execute("VACUUM FULL conveyor_jobs")
        if variant == "fewer-indexes":
            for index in DROPPED:
                conn.execute(f"DROP INDEX conveyor_jobs_{index}")
        if variant == "narrow":
            conn.execute(NARROW_SETUP)
        conn.execute("VACUUM ANALYZE")
        conn.execute("SELECT pg_stat_reset()")


class Meter:
    """Server CPU spent in claims and in settles, and jobs drained."""

    def __init__(self, pids: list[int]) -> None:
        self.pids, self.claim, self.settle, self.jobs = pids, 0.0, 0.0, 0
        self.started = time.perf_counter()

    def timed(self, phase: str, call: Callable[[], Any]) -> Any:
        before = cpu_seconds(self.pids)
        out = call()
        setattr(self, phase, getattr(self, phase) + cpu_seconds(self.pids) - before)
        return out

    def line(self, variant: str, client: float) -> str:
        n, wall = max(self.jobs, 1), time.perf_counter() - self.started
        return (
            f"{variant:14} {self.jobs} jobs {self.jobs / wall:6.0f}/s  server µs/job: "
            f"claim {self.claim / n * 1e6:3.0f} settle {self.settle / n * 1e6:3.0f} "
            f"total {(self.claim + self.settle) / n * 1e6:3.0f}  client {client / n * 1e6:3.0f}"
        )


def drain_raw(url: str, variant: str) -> str:
    claim, settle = RAW[variant]
    with psycopg.connect(url, autocommit=True) as conn:
        meter = Meter([conn.info.backend_pid])
        cpu = time.process_time()
        while rows := meter.timed("claim", lambda: conn.execute(claim).fetchall()):
            params = {"ids": [row[0] for row in rows], "tokens": [1] * len(rows)}

            def settle_batch(params: dict[str, list[Any]] = params) -> None:
                with conn.pipeline(), conn.transaction():
                    for statement in settle:
                        conn.execute(statement, params)

            meter.timed("settle", settle_batch)
            meter.jobs += len(rows)
        return meter.line(variant, time.process_time() - cpu)


async def drain_store(url: str, variant: str, backlog: int, batch: int = BATCH) -> str:
    # The app that submits drains: its connections are open before the first reading.
    app = build(url)
    store = await app.store()
    await fill(app, backlog)
    prepare(url, variant)
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        ]
    meter, cpu = Meter(pids), time.process_time()
    try:
        while True:
            before = cpu_seconds(pids)
            jobs = await store.claim(
                worker_id="w",
                queues=["default"],
                types=app.registry.names(),
                limit=batch,
                lease=60,
            )
            middle = cpu_seconds(pids)
            meter.claim += middle - before
            if not jobs:
                break
            ended = [
                Settlement(j.id, j.lease_token, Status.SUCCEEDED, Outcome.SUCCEEDED) for j in jobs
            ]
            await store.settle(ended)
            meter.settle += cpu_seconds(pids) - middle
            meter.jobs += len(jobs)
    finally:
        await app.close()
    line = meter.line(variant, time.process_time() - cpu)
    with psycopg.connect(url, autocommit=True) as conn:
        time.sleep(0.7)  # the statistics collector's delay
        updates, hot = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
            " WHERE relname = 'conveyor_jobs'"
        ).fetchone() or (0, 0)
    return f"{line}  updates {updates}, HOT {hot}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--batch", type=int, default=BATCH, help="jobs per claim and settle (store variants)"
    )
    parser.add_argument("variants", nargs="*", choices=[*VARIANTS, []], help="default: all")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    for number in range(args.rounds):
        for variant in args.variants or VARIANTS:
            name = f"conveyor_pgcosts_{variant.replace('-', '_')}_{number}"
            with scratch(args.url, name) as url:
                if variant in RAW:
                    asyncio.run(fill_only(url, args.jobs))
                    prepare(url, variant)
                    print(drain_raw(url, variant), flush=True)
                else:
                    print(asyncio.run(drain_store(url, variant, args.jobs, args.batch)), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
