"""The fault scenarios. Each drives real workers on a fresh database and injects faults;
the checker then judges the run log and the database. A scenario may add violations of
its own (a worker that died of a crashing child, an untranslated storage error, a missed
cron tick)."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from chaos.app import GLOBAL_LIMIT, KEY_LIMIT
from chaos.harness import ROOT, Run, Worker, WorkerOptions
from chaos.infra import SmallDisk, faketime_env
from conveyor.errors import ConveyorError
from tests.pgbouncer import pgbouncer

BOTH = ("sqlite", "postgres")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    guarantees: tuple[str, ...]
    body: Callable[[Run], Awaitable[None]]
    backends: tuple[str, ...] = BOTH
    short: bool = True  # part of the short (CI) mode
    options: WorkerOptions = WorkerOptions()  # noqa: RUF009 - frozen, shared safely
    needs_small_disk: bool = False
    # Runs on a private primary with a synchronous standby of its own (chaos.infra),
    # not on the PostgreSQL server the other scenarios share.
    replicated: bool = False


def scale(run: Run, short: int, full: int) -> int:
    return full if run.full else short


def rng(run: Run) -> random.Random:
    return random.Random(f"{run.seed}:{run.scenario}:{run.backend}")


async def _busy_worker(run: Run, r: random.Random, timeout: float = 60) -> Worker | None:
    """A live worker with a run in progress (from the run log), or None when all is done."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = [w for w in run.alive() if run.running_on(w)]
        if busy:
            return r.choice(busy)
        if await _all_terminal(run):
            return None
        await asyncio.sleep(0.1)
    return None


async def _all_terminal(run: Run) -> bool:
    rows = await run.asql_retrying(
        "SELECT count(*) AS n FROM conveyor_jobs WHERE status NOT IN "
        "('succeeded', 'failed', 'cancelled')"
    )
    return int(rows[0]["n"]) == 0


async def _finish(run: Run, timeout: float = 180) -> None:
    if not await run.wait_terminal(timeout):
        run.notes.append(f"not every job ended within {timeout}s")


# -- SIGKILL during drains -----------------------------------------------------------------


async def kill_drain(run: Run) -> None:
    run.check_lease_at_start = True
    r = rng(run)
    for _ in range(3):
        await run.start_worker()
    n = scale(run, 150, 1500)
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(n)])
    await run.submit(
        "work", [{"steps": 8, "period": 0.2, "every": 3} for _ in range(scale(run, 8, 40))]
    )
    kills = scale(run, 4, 25)
    for _ in range(kills):
        await asyncio.sleep(r.uniform(0.3, 1.5))
        victim = await _busy_worker(run, r)
        if victim is None:
            break
        run.kill(victim)
        await run.start_worker(ready=False)
    await _finish(run)


# -- SIGSTOP zombies -----------------------------------------------------------------------


async def sigstop_zombie(run: Run) -> None:
    r = rng(run)
    for _ in range(2):
        await run.start_worker()
    jobs = scale(run, 6, 24)
    await run.submit("work", [{"steps": 20, "period": 0.15, "every": i % 2} for i in range(jobs)])
    lease = run.options.lease_seconds
    for _ in range(scale(run, 2, 8)):
        victim = await _busy_worker(run, r)
        if victim is None:
            break
        held = run.running_on(victim)
        run.freeze(victim)
        # Stay frozen until another worker has taken over one of its jobs, or 3 leases.
        deadline = time.monotonic() + 3 * lease
        while time.monotonic() < deadline:
            taken = {
                rec.job
                for rec in run.records()
                if rec.event == "start" and rec.pid != victim.pid and rec.job in held
            }
            if taken:
                break
            await asyncio.sleep(0.1)
        run.thaw(victim)
        await asyncio.sleep(r.uniform(0.5, 1.5))
    await _finish(run)


# -- event-loop blocking -------------------------------------------------------------------


async def blocked_loop(run: Run) -> None:
    for _ in range(2):
        await run.start_worker()
    seconds = 3 * run.options.lease_seconds
    blockers = scale(run, 4, 10)
    # A steady stream of short jobs keeps settles in flight when a handler blocks the loop.
    await run.submit("work", [{"steps": 1, "period": 0.01} for _ in range(scale(run, 60, 200))])
    for i in range(blockers):
        await run.submit("blocker", [{"seconds": seconds, "steps": 6, "every": i % 2}])
        await run.submit("work", [{"steps": 1, "period": 0.01} for _ in range(40)])
        await run.submit("sync_work", [{"steps": 5, "period": 0.2}])
        await asyncio.sleep(1.0)
    await _finish(run)
    await _no_lost_attempts(run, "a handler blocked the event loop")


async def _no_lost_attempts(run: Run, cause: str) -> None:
    """Every worker stayed up, unfrozen and connected: no lease may have expired."""
    rows = await run.asql("SELECT job_id FROM conveyor_attempts WHERE outcome = 'lost'")
    if rows:
        run.violations.append(
            f"[heartbeat] {len(rows)} attempts were rescued as lost although every worker "
            f"was alive and the database up ({cause}): leases were not renewed"
        )


# -- claims delayed past the lease (held locks) --------------------------------------------


async def held_lock(run: Run) -> None:
    run.check_lease_at_start = True
    for _ in range(2):
        await run.start_worker()
    hold = 2.5 * run.options.lease_seconds
    for _ in range(scale(run, 3, 8)):
        # Jobs fall due just after the lock is taken: idle workers' claims, sent on their
        # next poll, then wait behind the lock for longer than a lease.
        payloads = [{"steps": 12, "period": 0.25, "every": i % 2 * 4} for i in range(4)]
        ids = await run.submit("work", payloads, delay=1)
        marks = ",".join("?" * len(ids))
        rows = await run.asql(
            f"SELECT min(run_at) AS due FROM conveyor_jobs WHERE id IN ({marks})", ids
        )
        due = rows[0]["due"]
        due = due.timestamp() if hasattr(due, "timestamp") else float(due)
        await asyncio.sleep(max(0.0, due - time.time() - 0.03))
        await run.hold_write_lock(hold)
        await _finish(run)


# -- PostgreSQL stop / restart -------------------------------------------------------------


async def _pg_outage(run: Run, down: float, mode: str) -> None:
    run.check_lease_at_start = True
    assert run.pg is not None
    for _ in range(2):
        await run.start_worker()
    run.supervise(keep=2)
    await run.submit("work", [{"steps": 15, "period": 0.2} for _ in range(scale(run, 6, 16))])
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(scale(run, 40, 300))])
    r = rng(run)
    for _ in range(scale(run, 1, 3)):
        if await _busy_worker(run, r) is None:
            break
        run.fault("pg-stop", detail=f"{mode}, down {down:g}s")
        await asyncio.to_thread(run.pg.stop, mode)
        await asyncio.sleep(down)
        await asyncio.to_thread(run.pg.start)
        run.fault("pg-start")
        await asyncio.sleep(r.uniform(1, 2))
    await _finish(run)
    await run.stop_supervising()


async def pg_restart_short(run: Run) -> None:
    await _pg_outage(run, 0.5 * run.options.lease_seconds, "fast")


async def pg_restart_long(run: Run) -> None:
    await _pg_outage(run, 3 * run.options.lease_seconds, "immediate")


# -- SQLite locked past the busy timeout, SQLite disk full ---------------------------------


async def _submit_expecting_conveyor_error(run: Run, label: str) -> None:
    """A submit during the fault must fail with a conveyor error, or succeed."""
    app = await run.client()
    try:
        handle = await app.submit("work", {"steps": 1, "period": 0.01})
        run.expected[handle.id] = "succeeded"
    except ConveyorError as exc:
        run.notes.append(f"{label}: submit refused with {type(exc).__name__}")
    except Exception as exc:
        run.violations.append(
            f"[storage error] {label}: submit raised {type(exc).__module__}."
            f"{type(exc).__name__} ({exc}), not a conveyor error"
        )


def _cli_submit(run: Run, label: str) -> None:
    """``conveyor submit`` during the fault: exit 0, or 4 (database unavailable), no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "conveyor", "submit", "work", "--app", "chaos.app:app",
         "--database-url", run.url, "--payload", '{"steps": 1, "period": 0.01}'],
        cwd=ROOT, env=run.env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = done.stdout + done.stderr
    if done.returncode not in (0, 4) or "Traceback" in output:
        first = output.strip().splitlines()[-1:] or [""]
        run.violations.append(
            f"[storage error] {label}: `conveyor submit` exited {done.returncode} "
            f"({len(output.splitlines())} lines, last: {first[0][:160]!r}); expected 0 or 4 "
            "without a traceback"
        )
    elif done.returncode == 0:
        run.notes.append(f"{label}: CLI submit succeeded")


async def sqlite_locked(run: Run) -> None:
    for _ in range(2):
        await run.start_worker()
    run.supervise(keep=2)
    await run.submit("work", [{"steps": 10, "period": 0.3} for _ in range(4)])
    await _busy_worker(run, rng(run))
    hold = asyncio.create_task(run.hold_write_lock(35.0))  # past the 30 s busy timeout
    await run.wait_for(lambda: any(f.kind == "lock" for f in run.faults), 60, "the lock")
    await _submit_expecting_conveyor_error(run, "locked past the busy timeout")
    await hold
    await _finish(run)
    await run.stop_supervising()


async def disk_full(run: Run) -> None:
    for _ in range(2):
        await run.start_worker()
    run.supervise(keep=2)
    await run.submit("work", [{"steps": 10, "period": 0.2} for _ in range(6)])
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(100)])
    await _busy_worker(run, rng(run))
    disk = run.metrics["disk"]
    assert isinstance(disk, SmallDisk)
    filled = await asyncio.to_thread(disk.fill)
    run.fault("disk-full", detail=f"{filled} bytes of filler")
    await asyncio.sleep(1.0)
    await _submit_expecting_conveyor_error(run, "disk full")
    await asyncio.to_thread(_cli_submit, run, "disk full")
    await asyncio.sleep(2 * run.options.lease_seconds)
    disk.free()
    run.fault("disk-free")
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(20)])
    await _finish(run)
    await run.stop_supervising()


# -- clock skew ----------------------------------------------------------------------------


async def clock_skew(run: Run) -> None:
    # PostgreSQL: time comes from the database, so workers' clocks may disagree freely.
    # SQLite: the clock is the machine's, so skew between workers is outside the
    # guarantee; a machine whose clock is simply wrong (all workers alike) is inside it.
    offsets = [-20.0, 0.0, 20.0] if run.backend == "postgres" else [3600.0] * 3
    if run.backend == "sqlite":
        run.db_clock_offset = 3600.0
    r = rng(run)
    for offset in offsets:
        await run.start_worker(env=faketime_env(offset) if offset else None)
    await run.submit("work", [{"steps": 10, "period": 0.2} for _ in range(scale(run, 6, 20))])
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(scale(run, 60, 400))])
    for _ in range(scale(run, 1, 4)):
        victim = await _busy_worker(run, r)
        if victim is None:
            break
        run.kill(victim)
        index = run.workers.index(victim) % len(offsets)
        await run.start_worker(env=faketime_env(offsets[index]) if offsets[index] else None)
    await _finish(run)


# -- cron with workers killed ----------------------------------------------------------------


def _tick_time(job_id: str) -> float:
    stamp = job_id.rsplit(":", 3)[-3:]
    return datetime.strptime(":".join(stamp), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


async def cron_kill(run: Run) -> None:
    r = rng(run)
    env = {"CHAOS_CRON": "1"}
    for _ in range(3):
        await run.start_worker(env=env)
    first = int(time.time()) + 2  # every worker is up: ticks from here on must fire
    duration = scale(run, 20, 90)
    end = time.time() + duration
    while time.time() < end:
        await asyncio.sleep(r.uniform(1.5, 4))
        victim = r.choice(run.alive())
        run.kill(victim)
        await run.start_worker(env=env)
    last = int(time.time()) - 2

    def fired_since(at: int) -> bool:
        rows = run.sql("SELECT id FROM conveyor_jobs WHERE type = 'tick'")
        return any(_tick_time(row["id"]) >= at for row in rows)

    # Ticks fire in order: once one at or after `last` has fired, every earlier tick has
    # fired or been skipped. (Waiting on that, not on a fixed sleep.)
    try:
        await run.wait_for(lambda: fired_since(last), 60, f"a tick at or after {last}")
    except TimeoutError:
        run.violations.append("[cron] no tick fired in the last 60 s of the scenario")
    rows = await run.asql("SELECT id, status FROM conveyor_jobs WHERE type = 'tick'")
    fired = {int(_tick_time(row["id"])) for row in rows}
    for row in rows:
        if first <= _tick_time(row["id"]) <= last:
            run.expected[row["id"]] = "succeeded"
    wanted = set(range(first, last + 1))
    missed = sorted(wanted - fired)
    run.metrics["ticks"] = f"{len(wanted & fired)}/{len(wanted)}"
    if missed:
        run.violations.append(
            f"[cron] {len(missed)} of {len(wanted)} every-second ticks never fired "
            f"(first missed: {datetime.fromtimestamp(missed[0], UTC):%H:%M:%S})"
        )
    await _finish(run)


# -- global and key limits with kills ------------------------------------------------------


async def limits_kill(run: Run) -> None:
    run.check_lease_at_start = True
    r = rng(run)
    run.limits["limited"] = GLOBAL_LIMIT
    run.key_limits["keyed"] = KEY_LIMIT
    for _ in range(3):
        await run.start_worker()
    n = scale(run, 24, 150)
    await run.submit("limited", [{"steps": 3, "period": 0.1} for _ in range(n)])
    for key in range(4):
        await run.submit(
            "keyed",
            [{"steps": 3, "period": 0.1} for _ in range(n // 4)],
            concurrency_key=f"k{key}",
        )
    for _ in range(scale(run, 3, 15)):
        await asyncio.sleep(r.uniform(0.5, 2))
        victim = await _busy_worker(run, r)
        if victim is None:
            break
        run.kill(victim)
        await run.start_worker(ready=False)
    await _finish(run, timeout=300)


# -- isolated children crashing -------------------------------------------------------------


async def isolated_crash(run: Run) -> None:
    workers = [await run.start_worker() for _ in range(2)]
    await run.submit("iso_ok", [{} for _ in range(3)])
    for crash in ("iso_abort", "iso_segv", "iso_oom", "iso_hang"):
        await run.submit(crash, [{} for _ in range(scale(run, 2, 5))], expect="failed")
    await _finish(run)
    for w in workers:
        if not w.alive():
            run.violations.append(
                f"[isolation] worker {w.pid} died (code {w.proc.returncode}) while its "
                "isolated children crashed"
            )
    # The workers still serve.
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(6)])
    await _finish(run)
    await _no_lost_attempts(run, "isolated children crashed")
    # A hung child ignoring SIGTERM is killed after the cancel grace; allow it that long.
    hung = {rec.pid for rec in run.records() if rec.type == "iso_hang" and rec.event == "start"}
    deadline = time.monotonic() + run.options.cancel_grace + 15
    while hung and time.monotonic() < deadline:
        hung = {pid for pid in hung if _running(pid)}
        await asyncio.sleep(0.2)
    for pid in hung:
        run.violations.append(
            f"[isolation] hung child {pid} still alive {run.options.cancel_grace + 15:g}s "
            "after its job ended"
        )


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- SIGTERM hand-back with checkpoints -----------------------------------------------------


async def sigterm_handback(run: Run) -> None:
    run.check_lease_at_start = True
    r = rng(run)
    for _ in range(2):
        await run.start_worker()
    ids = await run.submit("work", [{"steps": 40, "period": 0.1} for _ in range(scale(run, 4, 12))])
    ids += await run.submit("sync_work", [{"steps": 10, "period": 0.2} for _ in range(2)])
    o = run.options
    for _ in range(scale(run, 3, 10)):
        victim = await _busy_worker(run, r)
        if victim is None:
            break
        await run.start_worker()  # the replacement first: no moment without a worker
        run.terminate(victim)
        try:
            code = await run.wait_exit(victim, timeout=o.grace + o.cancel_grace + 30)
        except TimeoutError:
            run.violations.append(f"[shutdown] worker {victim.pid} ignored SIGTERM for 30s+")
            run.kill(victim)
            continue
        if code != 0:
            run.violations.append(f"[shutdown] worker {victim.pid} exited {code} on SIGTERM")
    await _finish(run)
    rows = await run.asql("SELECT job_id, outcome FROM conveyor_attempts")
    spent: dict[str, list[str]] = {}
    for row in rows:
        spent.setdefault(row["job_id"], []).append(row["outcome"])
    for job_id in ids:
        if spent.get(job_id, []) != ["succeeded"]:
            run.violations.append(
                f"[shutdown] job {job_id}: attempts {spent.get(job_id)}; a hand-back must "
                "not spend an attempt"
            )


# -- recovery with the default options ------------------------------------------------------


async def recovery_defaults(run: Run) -> None:
    r = rng(run)
    for _ in range(2):
        await run.start_worker()
    await run.submit("work", [{"steps": 8, "period": 1.0} for _ in range(2)])
    for _ in range(2):
        victim = await _busy_worker(run, r)
        if victim is None:
            break
        run.kill(victim)
        await run.start_worker()
    await _finish(run, timeout=240)


# -- workers through PgBouncer in transaction mode, with kills ---------------------------------

# What a worker logs when session state was lost under it (a prepared statement, a session
# SET, LISTEN) through a transaction pooler.
_SESSION_ERRORS = re.compile(
    r"prepared statement|_pg3_|DuplicatePreparedStatement|InvalidSqlStatementName|"
    r"unrecognized configuration parameter|does not exist|cannot (claim|settle|record)"
)


async def pgbouncer_drain(run: Run) -> None:
    """Workers reach the private server through Debian's PgBouncer (pool_mode =
    transaction, 6 server connections) with ``--pooler transaction`` and LISTEN on the
    direct URL; busy workers are SIGKILLed and replaced while they drain."""
    r = rng(run)
    direct = run.url
    env = {"CONVEYOR_POOLER": "transaction", "CONVEYOR_LISTEN_URL": direct}
    with pgbouncer(direct, pool_size=6) as bouncer:
        app = await run.client()
        # Submits go through the pooler too. The harness starts workers on run.url, and the
        # checker reads it once the scenario is over: the pooler's while it runs.
        app.use_database(bouncer.url, pooler="transaction", listen_url=direct)
        run.url = bouncer.url
        try:
            for _ in range(scale(run, 4, 12)):
                await run.start_worker(env=env, ready=False)
            for worker in list(run.workers):
                await run.wait_ready(worker)
            jobs = scale(run, 400, 3000)
            await run.submit("work", [{"steps": 1, "period": 0.01} for _ in range(jobs)])
            await run.submit(
                "work", [{"steps": 6, "period": 0.1, "every": 2} for _ in range(scale(run, 8, 40))]
            )
            for _ in range(scale(run, 2, 6)):
                await asyncio.sleep(r.uniform(0.5, 2.0))
                victim = await _busy_worker(run, r)
                if victim is None:
                    break
                run.kill(victim)
                await run.start_worker(env=env, ready=False)
            await _finish(run)
        finally:
            run.url = direct
            await app.close()
            app.use_database(direct, pooler="none", listen_url="")
    for worker in run.workers:
        lines = worker.log.read_text(errors="replace").splitlines()
        bad = [line for line in lines if _SESSION_ERRORS.search(line)]
        if bad:
            run.violations.append(
                f"worker {worker.pid} logged {len(bad)} session errors through PgBouncer, "
                f"the first: {bad[0]}"
            )


SCENARIOS: list[Scenario] = [
    Scenario(
        "kill-drain",
        "3 workers drain short and long jobs while random busy workers get SIGKILL",
        ("no job lost", "one live run", "fenced writes", "recovery", "lease at start"),
        kill_drain,
    ),
    Scenario(
        "sigstop-zombie",
        "a busy worker is SIGSTOPped past its lease until another worker takes its job, "
        "then SIGCONTed",
        ("one live run", "fenced writes", "zombies stop"),
        sigstop_zombie,
    ),
    Scenario(
        "blocked-loop",
        "async handlers hold the event loop with time.sleep for 3 leases",
        ("one live run", "heartbeat not starved"),
        blocked_loop,
    ),
    Scenario(
        "held-lock",
        "another connection holds the write lock (SQLite) / an EXCLUSIVE table lock "
        "(PostgreSQL) for 2.5 leases while jobs fall due",
        ("one live run", "no job lost", "lease at start"),
        held_lock,
    ),
    Scenario(
        "pg-restart-short",
        "the private PostgreSQL server stops (fast) for half a lease while jobs run",
        ("no job lost", "one live run", "fenced writes"),
        pg_restart_short,
        backends=("postgres",),
        short=False,
    ),
    Scenario(
        "pg-restart-long",
        "the private PostgreSQL server crashes (immediate) for 3 leases while jobs run",
        ("no job lost", "one live run", "fenced writes"),
        pg_restart_long,
        backends=("postgres",),
    ),
    Scenario(
        "sqlite-locked",
        "another connection holds the write lock 35 s, past the 30 s busy timeout",
        ("no job lost", "one live run", "storage errors translated"),
        sqlite_locked,
        backends=("sqlite",),
        short=False,
    ),
    Scenario(
        "disk-full",
        "the database's 24 MB tmpfs fills up while jobs run, then space comes back",
        ("no job lost", "one live run", "storage errors translated"),
        disk_full,
        backends=("sqlite",),
        needs_small_disk=True,
    ),
    Scenario(
        "clock-skew",
        "workers under libfaketime (PostgreSQL: -20 s, 0, +20 s; SQLite: all +1 h), with kills",
        ("one live run", "no job lost", "database time"),
        clock_skew,
    ),
    Scenario(
        "cron-kill",
        "an every-second schedule on 3 workers, one SIGKILLed every 1.5-4 s and replaced",
        ("cron once per tick",),
        cron_kill,
    ),
    Scenario(
        "limits-kill",
        "global_concurrency=2 and key_concurrency=1 types with busy workers SIGKILLed",
        ("limits never exceeded", "no slot leaked"),
        limits_kill,
    ),
    Scenario(
        "isolated-crash",
        "isolation='process' children abort, SIGSEGV, hit an RLIMIT_AS MemoryError, hang "
        "past their timeout",
        ("isolated crashes contained",),
        isolated_crash,
    ),
    Scenario(
        "sigterm-handback",
        "busy workers get SIGTERM (grace 2 s, lease 6 s) mid-run; jobs resume from their "
        "checkpoints",
        ("hand-back", "fenced writes", "no job lost"),
        sigterm_handback,
        # A lease longer than the others': this scenario is about hand-backs, which do not
        # wait for leases, and every attempt spent counts against it. With 2 s, a commit
        # stalled by a busy disk (SQLite holds its write lock through the fsync; seen for
        # 5 s on a shared machine) held up every renewal past the lease: the runs were
        # stopped as they must be, then rescued, spending attempts the scenario forbids.
        # Lost leases are what kill-drain, sigstop-zombie and held-lock are about.
        options=WorkerOptions(lease=6.0),
    ),
    Scenario(
        "recovery-defaults",
        "the recovery figure with the CLI's default options (lease 30 s, rescue 5 s)",
        ("recovery",),
        recovery_defaults,
        short=False,
        options=WorkerOptions(defaults=True),
    ),
    Scenario(
        "pgbouncer-drain",
        "workers x 8 through PgBouncer (transaction mode, 6 server connections), LISTEN on "
        "the direct URL; busy workers SIGKILLed and replaced mid-drain",
        ("no job lost", "one live run", "fenced writes"),
        pgbouncer_drain,
        backends=("postgres",),
        options=WorkerOptions(lease=6.0, concurrency=8),
    ),
]
