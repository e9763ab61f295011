"""The network scenarios: a worker cut off from PostgreSQL, and a database failover.

A worker reaches the database through a :class:`~chaos.netproxy.ProxyProcess` of its own
(the other workers connect directly), so a partition cuts off exactly that worker: its
heartbeats, claims, settles, checkpoints and its LISTEN connection all hang, as they do
when packets are dropped, and what was in flight arrives once the path heals.
"""

from __future__ import annotations

import asyncio
import functools
import time
from urllib.parse import urlsplit

import psycopg

from chaos.harness import Run, Worker
from chaos.netproxy import ProxyProcess
from chaos.runlog import Record
from chaos.scenarios import Scenario, _finish, rng, scale
from conveyor.errors import ConveyorError

# How long after a promotion every worker must be running jobs again: the claim's back-off
# cap (5 s, 7.5 s with jitter) plus a connect timeout (5 s), with room for a busy machine.
RECONNECT_BOUND = 30.0
LIVE = frozenset({"start", "begin", "beat", "ckpt", "step", "block", "unblock", "end"})


async def _proxied_worker(run: Run) -> tuple[Worker, ProxyProcess]:
    """A worker whose every connection goes through a proxy of its own."""
    params = psycopg.conninfo.conninfo_to_dict(run.url)
    target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
    proxy = await ProxyProcess(target).start()
    run.proxies.append(proxy)
    url = urlsplit(run.url)._replace(netloc=f"{params.get('user')}@127.0.0.1:{proxy.port}").geturl()
    return await run.start_worker(url=url), proxy


async def _partition(run: Run, worker: Worker, proxy: ProxyProcess, seconds: float) -> float:
    """Cut ``worker`` off for ``seconds``; return the monotonic time the partition began."""
    await proxy.command("blackhole")
    began = run.fault("partition", worker.pid, f"{seconds:g}s").mono
    await asyncio.sleep(seconds)
    await proxy.command("heal")
    run.fault("heal", worker.pid)
    return began


def _attempts(run: Run) -> dict[str, list[str]]:
    rows = run.sql("SELECT job_id, outcome FROM conveyor_attempts ORDER BY job_id, number")
    spent: dict[str, list[str]] = {}
    for row in rows:
        spent.setdefault(row["job_id"], []).append(row["outcome"])
    return spent


async def _workload(run: Run) -> None:
    # Long checkpointing runs (a partition catches them mid-run) and a stream of short ones.
    await run.submit("work", [{"steps": 15, "period": 0.2} for _ in range(scale(run, 6, 16))])
    await run.submit(
        "work", [{"steps": 20, "period": 0.1, "every": 0} for _ in range(scale(run, 4, 8))]
    )
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(scale(run, 60, 300))])


# -- a partition shorter than a lease --------------------------------------------------


async def partition_short(run: Run) -> None:
    r = rng(run)
    worker, proxy = await _proxied_worker(run)
    await run.start_worker()
    await _workload(run)
    held_through: set[str] = set()
    for _ in range(scale(run, 2, 6)):
        if await _busy_worker_is(run, worker) is False:
            break
        held_through |= run.running_on(worker)
        await _partition(run, worker, proxy, 0.5 * run.options.lease_seconds)
        await asyncio.sleep(r.uniform(1.0, 2.0))
    await _finish(run)
    spent = await asyncio.to_thread(_attempts, run)
    for job_id in run.expected:
        if spent.get(job_id, []) != ["succeeded"]:
            run.violations.append(
                f"[partition] job {job_id}: attempts {spent.get(job_id)}; a partition of half "
                "a lease must not cost an attempt"
            )
    stopped = {
        rec.job
        for rec in run.records()
        if rec.pid == worker.pid and rec.event in ("cancelled", "refused")
    }
    run.metrics["fig runs caught"] = len(held_through)
    # A run whose lease may run out before the partition ends is stopped and its job
    # handed back (no attempt spent): it shows here, not as a violation.
    run.metrics["fig stopped and handed back"] = len(stopped)


async def _busy_worker_is(run: Run, worker: Worker, timeout: float = 60) -> bool:
    """Wait until ``worker`` runs a job; False when everything ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run.running_on(worker):
            return True
        if await _all_done(run):
            return False
        await asyncio.sleep(0.05)
    return False


async def _all_done(run: Run) -> bool:
    rows = await run.asql_retrying(
        "SELECT count(*) AS n FROM conveyor_jobs WHERE status NOT IN "
        "('succeeded', 'failed', 'cancelled')"
    )
    return int(rows[0]["n"]) == 0


# -- a partition of several leases -------------------------------------------------------


async def partition_long(run: Run) -> None:
    lease = run.options.lease_seconds
    worker, proxy = await _proxied_worker(run)
    for _ in range(2):
        await run.start_worker()
    cut_runs: list[tuple[float, float, set[str]]] = []
    back: list[float] = []
    for _ in range(scale(run, 1, 3)):
        # Long runs only, fewer than the workers' slots: the cut-off worker is caught
        # mid-run, and the others have room to take its jobs while it is away.
        await run.submit("work", [{"steps": 15, "period": 0.2} for _ in range(6)])
        await run.submit("work", [{"steps": 30, "period": 0.1, "every": 0} for _ in range(3)])
        if not await _busy_worker_is(run, worker):
            break
        held = run.running_on(worker)
        began = await _partition(run, worker, proxy, 3 * lease)
        healed = time.monotonic()
        cut_runs.append((began, healed, held))
        # Work for everyone once the network heals: the cut-off worker must take its share
        # again by itself (its pools reconnect, its claims go through).
        await run.submit("work", [{"steps": 2, "period": 0.05} for _ in range(40)])
        try:
            await run.wait_for(
                functools.partial(_started_since, run, worker, healed),
                60,
                "a run on the healed worker",
            )
            back.append(min(r.mono for r in run.records() if _started_after(r, worker, healed)))
            back[-1] -= healed
        except TimeoutError:
            run.violations.append(
                "[partition] the cut-off worker started no job within 60 s of the heal"
            )
    await _finish(run)
    records = run.records()
    stops: list[float] = []
    for began, healed, held in cut_runs:
        for job_id in held:
            stops += _judge_cut_run(run, records, worker, job_id, began, healed, lease)
    if stops:
        run.metrics["fig cut-off runs rerun elsewhere during the cut"] = (
            f"{run.metrics.pop('elsewhere', 0)} of {len(stops)}"
        )
        run.metrics["fig cut-off runs stopped"] = (
            f"{min(stops):.2f}-{max(stops):.2f}s into the cut ({len(stops)}, lease {lease:g}s)"
        )
    if back:
        run.metrics["fig healed worker's next start after"] = f"{max(back):.2f}s"


def _started_after(rec: Record, worker: Worker, at: float) -> bool:
    return rec.pid == worker.pid and rec.event == "start" and rec.mono > at


def _started_since(run: Run, worker: Worker, at: float) -> bool:
    return any(_started_after(rec, worker, at) for rec in run.records())


def _judge_cut_run(
    run: Run,
    records: list[Record],
    worker: Worker,
    job_id: str,
    began: float,
    healed: float,
    lease: float,
) -> list[float]:
    """Check the run of ``job_id`` a long partition caught on ``worker``; return when it
    stopped (seconds after the cut), or nothing if it had ended before."""
    starts = [
        rec for rec in records if rec.job == job_id and rec.pid == worker.pid
        and rec.event == "start" and rec.mono <= began
    ]  # fmt: skip
    if not starts:
        return []
    token = starts[-1].token
    mine = [rec for rec in records if rec.job == job_id and rec.token == token]
    if any(rec.event == "end" and rec.mono <= began for rec in mine):
        return []
    during = [rec for rec in mine if rec.mono >= began]
    live = [rec for rec in during if rec.event in LIVE]
    stopped = [rec.mono for rec in during if rec.event in ("cancelled", "refused", "end")]
    # Its last renewal reached the database before the cut, so its lease ends less than
    # a lease after the cut, by the machine's clock (every process here shares it).
    last = max([rec.mono for rec in live] + stopped[:1] + [began])
    if last > began + lease:
        run.violations.append(
            f"[partition] job {job_id}: the cut-off worker's run (token {token}) was still "
            f"active {last - began:.2f}s into the partition, past its {lease:g}s lease"
        )
    for rec in mine:
        if rec.event == "step" and rec.mono > healed:
            run.violations.append(
                f"[partition] job {job_id}: a checkpoint of the cut-off run (token {token}) "
                f"was accepted {rec.mono - healed:.2f}s after the partition healed"
            )
    later = [
        rec for rec in records if rec.job == job_id and rec.token > token
        and rec.event == "start"
    ]  # fmt: skip
    if not later and not any(rec.event == "end" for rec in mine):
        run.violations.append(
            f"[partition] job {job_id}: no other run after its worker was cut off mid-run"
        )
    if any(rec.pid != worker.pid and rec.mono < healed for rec in later):
        run.metrics["elsewhere"] = int(run.metrics.get("elsewhere", 0)) + 1
    return [last - began]


# -- a failover to a synchronous standby -------------------------------------------------


async def pg_failover(run: Run) -> None:
    """Kill -9 the primary mid-drain and promote its synchronous standby."""
    pair = run.replica
    assert pair is not None
    workers = [await run.start_worker() for _ in range(3)]
    await run.submit("work", [{"steps": 10, "period": 0.2} for _ in range(scale(run, 8, 16))])
    await run.submit("work", [{"steps": 2, "period": 0.02} for _ in range(scale(run, 300, 1200))])
    acked: list[tuple[str, float]] = []  # (job id, when its submit returned: monotonic)
    stop = asyncio.Event()
    submitter = asyncio.create_task(_keep_submitting(run, acked, stop))
    # Mid-drain: a good part of the queue done, most of it still to come.
    await run.wait_for(lambda: _ended(run) >= scale(run, 100, 300), 120, "the drain under way")
    killed = await asyncio.to_thread(pair.kill_primary)
    kill = run.fault("pg-kill", detail=f"the primary's {killed} processes, SIGKILL")
    acked_before = {job_id for job_id, at in acked if at < kill.mono}
    # A failover manager notices the dead primary and promotes the standby: a second here.
    await asyncio.sleep(1.0)
    await asyncio.to_thread(pair.promote)
    promoted = run.fault("pg-promote").mono
    run.metrics["fig kill→promoted"] = f"{promoted - kill.mono:.2f}s"
    back: list[float] = []
    for worker in workers:
        try:
            await run.wait_for(
                functools.partial(_started_since, run, worker, promoted),
                RECONNECT_BOUND,
                f"a run on worker {worker.pid} after the promotion",
            )
        except TimeoutError:
            run.violations.append(
                f"[failover] worker {worker.pid} started no job within {RECONNECT_BOUND:g} s "
                "of the promotion"
            )
            continue
        back.append(min(r.mono for r in run.records() if _started_after(r, worker, promoted)))
    if back:
        run.metrics["fig promoted→every worker running again"] = f"{max(back) - promoted:.2f}s"
    # Submitters reconnect by themselves too: a submit acknowledged by the new primary.
    try:
        await run.wait_for(
            lambda: any(at > kill.mono for _, at in acked),
            RECONNECT_BOUND,
            "a submit acknowledged after the failover",
        )
    except TimeoutError:
        run.violations.append(
            f"[failover] no submit was acknowledged within {RECONNECT_BOUND:g} s after every "
            "worker ran again"
        )
    stop.set()
    await submitter
    after = [at for _, at in acked if at > kill.mono]
    if after:
        run.metrics["fig kill→first submit acknowledged"] = f"{min(after) - kill.mono:.2f}s"
    await _finish(run)
    present = {row["id"] for row in await run.asql("SELECT id FROM conveyor_jobs")}
    missing = sorted(acked_before - present)
    run.metrics["fig submits acknowledged before the kill"] = (
        f"{len(acked_before) - len(missing)}/{len(acked_before)} present"
    )
    for job_id in missing[:20]:
        run.violations.append(
            f"[failover] job {job_id}: its submit was acknowledged before the primary died, "
            "and the promoted standby does not have it"
        )
    for worker in workers:
        if not worker.alive():
            run.violations.append(
                f"[failover] worker {worker.pid} exited ({worker.proc.returncode}); workers "
                "must ride out a failover"
            )


def _ended(run: Run) -> int:
    return sum(1 for rec in run.records() if rec.event == "end")


async def _keep_submitting(run: Run, acked: list[tuple[str, float]], stop: asyncio.Event) -> None:
    """Submit one job at a time until told to stop, as an application would; a submit
    that fails (the database is away) is not acknowledged and is not expected."""
    app = await run.client()
    failures = 0
    while not stop.is_set():
        try:
            handle = await app.submit("work", {"steps": 1, "period": 0.01})
        except ConveyorError:
            failures += 1
            await asyncio.sleep(0.1)
            continue
        run.expected[handle.id] = "succeeded"
        acked.append((handle.id, time.monotonic()))
        await asyncio.sleep(0.01)
    run.metrics["fig submits"] = f"{len(acked)} acknowledged, {failures} refused"


NETWORK_SCENARIOS: list[Scenario] = [
    Scenario(
        "partition-short",
        "a worker's every connection is cut (a proxy drops nothing, passes nothing) for "
        "half a lease while it runs jobs, then healed",
        ("no job lost", "one live run", "partition costs nothing"),
        partition_short,
        backends=("postgres",),
    ),
    Scenario(
        "partition-long",
        "a busy worker is cut off from PostgreSQL for 3 leases, then healed",
        ("no job lost", "one live run", "fenced writes", "cut-off runs stop"),
        partition_long,
        backends=("postgres",),
        short=False,
    ),
    Scenario(
        "pg-failover",
        "the primary (synchronous standby from pg_basebackup) is SIGKILLed mid-drain and "
        "the standby promoted; workers and a submitter on a multi-host URL",
        ("no job lost", "one live run", "fenced writes", "failover"),
        pg_failover,
        backends=("postgres",),
        short=False,
        replicated=True,
    ),
]
