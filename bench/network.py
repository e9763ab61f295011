"""Latency between worker and database: one worker's drain and enqueue→start latency with
0, 1, 5 and 20 ms added round-trip time, conveyor and pgqueuer side by side in one run.

The worker's every connection goes through ``chaos.netproxy`` (a proxy process of its
own, on 127.0.0.1), which holds each chunk half the added round-trip time in each
direction; the benchmark's own connections (submitting, reading times) go straight to
the server, so only the worker's path to the database is slowed. The 0 ms row goes
through the proxy too: it is the proxy's own cost, the reference for the others.

Per round, for each added RTT and each peer, on a fresh database:

- **drain**: ``--jobs`` no-op jobs submitted in bulk, then one worker (conveyor:
  ``conveyor worker --burst --concurrency C``; pgqueuer: ``pgqueuer.run`` with
  ``batch_size=C``) drains them. jobs/s from the first claim to the last completion,
  both by the server's clock (conveyor: ``started_at``/``finished_at``; pgqueuer: its
  log's ``picked``/``successful`` rows). Also the worker's reads through the proxy per
  job: about the round trips it made per job.
- **latency**: an idle worker; ``--latency-jobs`` jobs submitted 20 ms apart (on an
  absolute schedule) by the benchmark; p50/p95 of claim time minus insert time, both
  by the server's clock.

pgqueuer needs ``pip install pgqueuer asyncpg uvloop`` (see ``bench/pgq.py``); without it
only conveyor is measured, and the report says so.

    python -m bench.network                         # 0/1/5/20 ms, both peers, 3 rounds
    python -m bench.network --rtt 0,20 --rounds 1 --jobs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.databases import DEFAULT_POSTGRES_URL, POSTGRES_URL_ENV, PostgresScratch
from bench.db import connect
from bench.measure import _finished_times, _percentile, _prepare, _submit_noops, migrate
from bench.procs import Workers
from chaos.netproxy import ProxyProcess

ROOT = Path(__file__).resolve().parent.parent
LATENCY_GAP = 0.020
RUN_TIMEOUT = 600.0
Result = dict[str, float]


class Proxy:
    """A proxy process in front of the benchmark's server, run on a loop of its own."""

    def __init__(self, base_url: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.base_url = base_url
        self.loop = asyncio.new_event_loop()
        self.proc = self.loop.run_until_complete(
            ProxyProcess((parts.hostname or "127.0.0.1", parts.port or 5432)).start()
        )

    def set_rtt(self, ms: float) -> None:
        self.command(f"delay {ms / 2:g} {ms / 2:g}")

    def command(self, line: str) -> str:
        return self.loop.run_until_complete(self.proc.command(line))

    def reads(self) -> int:
        words = self.command("stats").split()
        return int(words[words.index("reads") + 1])

    def url(self, direct: str) -> str:
        """``direct`` (a database on the server) reached through the proxy."""
        parts = urllib.parse.urlsplit(direct)
        user = f"{parts.username}@" if parts.username else ""
        return parts._replace(netloc=f"{user}127.0.0.1:{self.proc.port}").geturl()

    def close(self) -> None:
        self.loop.run_until_complete(self.proc.close())
        self.loop.close()


def _epoch(column: str) -> str:
    return f"extract(epoch FROM {column})"


# --- conveyor ---------------------------------------------------------------------


def conveyor_drain(url: str, proxy: Proxy, jobs: int, concurrency: int) -> Result:
    asyncio.run(_submit_noops(url, jobs))
    workers = Workers(proxy.url(url))
    with connect("postgres", url) as db:
        _prepare(db)
        reads = proxy.reads()
        try:
            workers.start(concurrency=concurrency, burst=True)
            workers.wait_all(RUN_TIMEOUT)
        finally:
            workers.close()
        reads = proxy.reads() - reads
        finished = _finished_times(db)
        if len(finished) != jobs:
            raise RuntimeError(f"conveyor drain: {len(finished)} of {jobs} succeeded")
        first = float(db.value(f"SELECT {_epoch('min(started_at)')} FROM conveyor_jobs"))
    return {"jobs_per_s": jobs / (finished[-1] - first), "reads_per_job": reads / jobs}


def conveyor_latency(url: str, proxy: Proxy, jobs: int, concurrency: int) -> Result:
    migrate(url)
    workers = Workers(proxy.url(url))
    with connect("postgres", url) as db:
        try:
            workers.start(concurrency=concurrency, burst=False)
            registered = "SELECT count(*) FROM conveyor_workers"
            _wait(lambda: db.value(registered) > 0, workers.check_alive)
            time.sleep(1.0)  # its first (empty) claim made, it idles

            async def submit() -> None:
                app = await _open_app(url)
                try:
                    start = time.monotonic()
                    for number in range(jobs):
                        delay = start + number * LATENCY_GAP - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await app.submit("noop", {})
                finally:
                    await app.close()

            asyncio.run(submit())
            done = "SELECT count(*) FROM conveyor_jobs WHERE status = 'succeeded'"
            _wait(lambda: db.value(done) >= jobs, workers.check_alive)
            workers.stop_all()
        finally:
            workers.close()
        waits = [
            float(row[0]) * 1000
            for row in db.rows(
                f"SELECT {_epoch('started_at')} - {_epoch('created_at')} FROM conveyor_jobs"
            )
        ]
    return _latencies(waits)


async def _open_app(url: str) -> Any:
    from bench.app import build

    app = build(url)
    await app.store()
    return app


# --- pgqueuer ---------------------------------------------------------------------


def pgqueuer_available() -> str | None:
    """None when pgqueuer can be measured, else why not."""
    try:
        import pgqueuer  # noqa: F401
        import uvloop  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed: pip install pgqueuer asyncpg uvloop"
    return None


async def _pgq_queries(url: str) -> Any:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(url)
    return conn, Queries(AsyncpgDriver(conn))


def _pgq_install(url: str, jobs: int) -> None:
    async def run() -> None:
        conn, queries = await _pgq_queries(url)
        try:
            await queries.install()
            for offset in range(0, jobs, 1000):
                n = min(1000, jobs - offset)
                await queries.enqueue(["noop"] * n, [b"0"] * n, [0] * n)
        finally:
            await conn.close()

    asyncio.run(run())


def _pgq_worker(dsn: str, batch: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, BENCH_PGQ_DSN=dsn, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "bench.pgq", str(batch)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _alive(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def check() -> None:
        if proc.poll() is not None:
            raise RuntimeError(f"the pgqueuer worker exited with {proc.returncode}")

    return check


def pgqueuer_drain(url: str, proxy: Proxy, jobs: int, batch: int) -> Result:
    _pgq_install(url, jobs)
    with connect("postgres", url) as db:
        db.script("VACUUM ANALYZE pgqueuer")
        reads = proxy.reads()
        proc = _pgq_worker(proxy.url(url), batch)
        try:
            _wait(lambda: db.value("SELECT count(*) FROM pgqueuer") == 0, _alive(proc))
        finally:
            _stop(proc)
        reads = proxy.reads() - reads
        first, last, done = db.rows(
            f"SELECT {_epoch('min(created) FILTER (WHERE status = ' + repr('picked') + ')')}, "
            f"{_epoch('max(created)')}, count(*) FILTER (WHERE status = 'successful') "
            "FROM pgqueuer_log"
        )[0]
    if int(done) != jobs:
        raise RuntimeError(f"pgqueuer drain: {done} of {jobs} successful")
    return {"jobs_per_s": jobs / (float(last) - float(first)), "reads_per_job": reads / jobs}


def pgqueuer_latency(url: str, proxy: Proxy, jobs: int, batch: int) -> Result:
    _pgq_install(url, 1)  # a warm-up job: once it ran, the worker is up and idle
    with connect("postgres", url) as db:
        proc = _pgq_worker(proxy.url(url), batch)
        try:
            _wait(lambda: db.value("SELECT count(*) FROM pgqueuer") == 0, _alive(proc))
            time.sleep(1.0)

            async def submit() -> None:
                conn, queries = await _pgq_queries(url)
                try:
                    start = time.monotonic()
                    for number in range(jobs):
                        delay = start + number * LATENCY_GAP - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await queries.enqueue("noop", b"0")
                finally:
                    await conn.close()

            asyncio.run(submit())
            done = "SELECT count(*) FROM pgqueuer_log WHERE status = 'picked'"
            _wait(lambda: db.value(done) >= jobs + 1, _alive(proc))
        finally:
            _stop(proc)
        waits = [
            float(row[0]) * 1000
            for row in db.rows(
                f"SELECT {_epoch('p.created')} - {_epoch('q.created')} FROM pgqueuer_log p "
                "JOIN pgqueuer_log q ON q.job_id = p.job_id AND q.status = 'queued' "
                "WHERE p.status = 'picked' AND p.job_id > 1"
            )
        ]
    return _latencies(waits)


# --- running ----------------------------------------------------------------------


def _latencies(waits: Sequence[float]) -> Result:
    return {"p50_ms": _percentile(waits, 50), "p95_ms": _percentile(waits, 95)}


def _wait(done: Callable[[], bool], check: Callable[[], None]) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT
    while not done():
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {RUN_TIMEOUT:.0f}s")
        time.sleep(0.02)


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.network", description=__doc__.split("\n")[0])
    p.add_argument("--rtt", default="0,1,5,20", help="added round-trip times in ms (0,1,5,20)")
    p.add_argument("--jobs", type=int, default=5000, help="jobs per drain (5000)")
    p.add_argument("--latency-jobs", type=int, default=100, help="jobs per latency run (100)")
    p.add_argument("--concurrency", type=int, default=100, help="conveyor --concurrency, "
                   "pgqueuer batch_size (100)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="rounds, each over every RTT (3)")
    p.add_argument("--peers", default="conveyor,pgqueuer")
    p.add_argument("--json", type=Path, help="write every measurement here")
    args = p.parse_args(argv)
    rtts = [float(x) for x in args.rtt.split(",")]
    peers = [x for x in args.peers.split(",") if x]
    if "pgqueuer" in peers and (why := pgqueuer_available()):
        print(f"bench.network: pgqueuer not measured: {why}", file=sys.stderr)
        peers.remove("pgqueuer")
    base = os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)
    command = "python -m bench.network " + " ".join(argv if argv is not None else sys.argv[1:])
    load_before = _loadavg()
    scratch = PostgresScratch(base)
    proxy = Proxy(base)
    runs: list[dict[str, Any]] = []
    c = args.concurrency
    measures: dict[str, dict[str, Callable[[str, Proxy], Result]]] = {
        "conveyor": {
            "drain": lambda url, px: conveyor_drain(url, px, args.jobs, c),
            "latency": lambda url, px: conveyor_latency(url, px, args.latency_jobs, c),
        },
        "pgqueuer": {
            "drain": lambda url, px: pgqueuer_drain(url, px, args.jobs, c),
            "latency": lambda url, px: pgqueuer_latency(url, px, args.latency_jobs, c),
        },
    }
    try:
        for number in range(1, args.rounds + 1):
            for rtt in rtts:
                proxy.set_rtt(rtt)
                for peer in peers:
                    for what, measure in measures[peer].items():
                        with scratch.fresh() as url:
                            result = measure(url, proxy)
                        runs.append({"round": number, "rtt_ms": rtt, "peer": peer,
                                     "what": what, **result})  # fmt: skip
                        print(f"[round {number}] {rtt:g} ms {peer} {what}: "
                              + ", ".join(f"{k} {v:.1f}" for k, v in result.items()),
                              file=sys.stderr, flush=True)  # fmt: skip
    finally:
        proxy.close()
        scratch.close()
    load_after = _loadavg()
    print(table(runs, rtts, peers, command, load_before, load_after, args))
    if args.json:
        report = {"command": command, "load": [load_before, load_after], "runs": runs}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def table(
    runs: list[dict[str, Any]],
    rtts: Sequence[float],
    peers: Sequence[str],
    command: str,
    load_before: str,
    load_after: str,
    args: argparse.Namespace,
) -> str:
    """The results as a markdown table: medians over the rounds (range in brackets)."""

    def cell(peer: str, rtt: float, what: str, key: str, digits: int = 0) -> str:
        values = [r[key] for r in runs if r["peer"] == peer and r["rtt_ms"] == rtt
                  and r["what"] == what]  # fmt: skip
        if not values:
            return "-"
        mid = statistics.median(values)
        if len(values) == 1:
            return f"{mid:.{digits}f}"
        return f"{mid:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    def ratio(peer: str, rtt: float) -> str:
        def med(at: float) -> float | None:
            values = [r["jobs_per_s"] for r in runs if r["peer"] == peer and r["rtt_ms"] == at
                      and r["what"] == "drain"]  # fmt: skip
            return statistics.median(values) if values else None

        here, zero = med(rtt), med(rtts[0])
        return "-" if here is None or not zero else f"{here / zero:.2f}"

    head = "| added RTT |"
    rule = "|---:|"
    for peer in peers:
        head += (f" {peer} drain jobs/s | ÷ {rtts[0]:g} ms | reads/job |"
                 f" {peer} enqueue→start p50 ms | p95 ms |")  # fmt: skip
        rule += "---:|---:|---:|---:|---:|"
    lines = [
        f"`{command}`: {args.rounds} rounds, {args.jobs} jobs per drain, "
        f"{args.latency_jobs} jobs 20 ms apart per latency run, conveyor --concurrency "
        f"{args.concurrency}, pgqueuer batch_size {args.concurrency}; load average "
        f"{load_before} before, {load_after} after. Medians (range).",
        "",
        head,
        rule,
    ]
    for rtt in rtts:
        row = f"| {rtt:g} ms |"
        for peer in peers:
            row += (
                f" {cell(peer, rtt, 'drain', 'jobs_per_s')} | {ratio(peer, rtt)} |"
                f" {cell(peer, rtt, 'drain', 'reads_per_job', 2)} |"
                f" {cell(peer, rtt, 'latency', 'p50_ms', 1)} |"
                f" {cell(peer, rtt, 'latency', 'p95_ms', 1)} |"
            )
        lines.append(row)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
