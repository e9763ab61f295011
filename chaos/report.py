"""The results of a chaos run: printed, and written into docs/reliability.md."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"

# Each guarantee, how the checker judges it, and the scenario tags that exercise it.
GUARANTEES: list[tuple[str, str, str]] = [
    (
        "no job lost",
        "No job lost",
        "Every submitted job ends in the expected state (succeeded; failed for the "
        "crashing isolated types) once the faults stop; nothing is left queued or running.",
    ),
    (
        "one live run",
        "One live run at a time",
        "From the out-of-band run log: no two runs (job, lease token, pid) of one job are "
        "live at the same moment on the machine's monotonic clock. A run is live from its "
        "first record to its last record of activity; a process frozen by SIGSTOP executes "
        "nothing, so a frozen run is live only up to the freeze once another run of its "
        "job has started.",
    ),
    (
        "fenced writes",
        "No write accepted from a stale token",
        "A checkpoint sent after a newer run of the job started is refused; each run "
        "resumes from the newest accepted checkpoint (none lost, none from a stale run); "
        "a succeeded job's result and checkpoint carry its final lease token, read from "
        "the database.",
    ),
    (
        "lease at start",
        "A run begins with time left on its lease",
        "Each handler logs how long the lease its claim stored had left when it began; "
        "a negative figure (the claim waited past the lease and stored an expired lease) "
        "is a violation where nothing else delays a handler's start.",
    ),
    (
        "zombies stop",
        "Zombies stop",
        "A run frozen past its lease and continued (SIGCONT) has no write accepted and "
        "stops within lease + 2 s of waking.",
    ),
    (
        "recovery",
        "A dead worker's job runs again in time",
        "After SIGKILL, each job the worker was running is rescued (claimable again, read "
        "from the database) within lease + rescue interval (+10 s slack for a loaded "
        "machine). The table gives kill→rescued and kill→running again (in a long queue a "
        "rescued job waits its turn behind the jobs due before it).",
    ),
    (
        "heartbeat not starved",
        "Heartbeats are not starved",
        "Handlers holding the event loop for 3 leases amid a stream of short jobs: no "
        "other worker runs their jobs meanwhile, and no attempt is rescued as `lost` "
        "while every worker is alive and the database up.",
    ),
    (
        "cron once per tick",
        "Cron fires each tick once, none missed",
        "With workers SIGKILLed and replaced (at least two alive at all times), every "
        "second of an every-second schedule has exactly one job, and it succeeds.",
    ),
    (
        "limits never exceeded",
        "Limits never exceeded",
        "Live runs of a global_concurrency=2 type never exceed 2, of a key_concurrency=1 "
        "type never exceed 1 per key, through kills.",
    ),
    (
        "no slot leaked",
        "No slot leaked",
        "Slots held by killed workers come back: every limited job completes.",
    ),
    (
        "storage errors translated",
        "Storage errors are conveyor errors",
        "While the database is full or locked past its busy timeout, a submit raises a "
        "conveyor error (never a raw driver exception) and `conveyor submit` exits 0 or 4 "
        "without a traceback; everything completes once the fault ends.",
    ),
    (
        "database time",
        "Leases follow one clock",
        "PostgreSQL: workers whose clocks disagree by 40 s (libfaketime) still run each job "
        "once. SQLite: leases follow the machine's clock, so skew between workers is outside "
        "the guarantee; a machine clock an hour off (every worker alike) is inside it.",
    ),
    (
        "isolated crashes contained",
        "Isolated crashes are contained",
        "Children that abort, SIGSEGV, run out of memory (RLIMIT_AS) or hang past their "
        "timeout fail their attempt; the worker stays up and keeps serving, and the hung "
        "child is gone.",
    ),
    (
        "hand-back",
        "SIGTERM hands work back",
        "A worker given SIGTERM exits 0 within grace + cancel grace; its jobs go back to "
        "queued without spending an attempt and resume from their checkpoints.",
    ),
    (
        "partition costs nothing",
        "A short partition costs nothing",
        "A worker cut off from PostgreSQL (every connection through a proxy that passes "
        "nothing) for half a lease, six times: no job is rescued or charged an attempt "
        "(each job's attempts, read from the database, are exactly one success); runs "
        "whose leases could have ended were stopped and handed back (counted in the row).",
    ),
    (
        "failover",
        "A failover loses no acknowledged submit",
        "With a synchronous standby, every submit acknowledged before the primary was "
        "SIGKILLed is on the promoted standby; by themselves, every worker runs jobs again "
        "within 30 s of the promotion and the submitter has a submit acknowledged within "
        "30 s more.",
    ),
    (
        "cut-off runs stop",
        "A cut-off worker stops its runs in time",
        "A worker cut off for 3 leases stops each of its runs before the run's lease can "
        "end, by its own clock (its last record comes less than a lease after the cut); "
        "the job runs on another worker meanwhile; no checkpoint the cut-off run sent is "
        "accepted after the network heals; the cut-off worker serves again after it.",
    ),
]


# What conveyor promises when the network between workers and PostgreSQL fails, or the
# database fails over: the scenarios partition-short, partition-long and pg-failover
# check it; docs/deployment.md links here.
PROMISES = [
    "## Partitions and failovers: what conveyor promises",
    "",
    "A worker renews all its leases in one heartbeat every lease/3 and counts each lease "
    "from when the claim or renewal was *sent*, by its own monotonic clock. When no "
    "renewal is confirmed, it stops a run at `renewed + lease - min(lease/6, 2 s)`, "
    "before the database could let another worker take the job (the rescuer waits for "
    "the lease to end by the database's clock, plus its rescue interval). So for a "
    "worker cut off from PostgreSQL (a partition, a stalled network, a dead primary):",
    "",
    "- **Shorter than two thirds of a lease** (the lease less the heartbeat interval: "
    "20 s at the default 30 s lease, 1.3 s at the chaos suite's 2 s; the database's "
    "copy of each lease was renewed at most that long before the cut): no attempt is "
    "spent and no job is rescued. Runs whose "
    "leases could end before a renewal is confirmed are stopped and their jobs handed "
    "back as soon as the database answers (see the next point); the others go on. "
    "Which runs stop depends on where the cut falls between beats: a heartbeat waits at "
    "most half the margin for its answer, then gives the connection up and tries a new "
    "one, so a beat held by the network does not count even if it arrives at the heal "
    "(`partition-short`, half a lease: from none to two thirds of the runs caught were "
    "stopped and handed back in the runs here, see its row).",
    "- **Stopped and handed back**: the worker stops a run at its fence and hands its "
    "job back once the database answers: fenced by the lease token, runnable when the "
    "lease would have ended, **no attempt spent**. It resumes from its last checkpoint, "
    "on any worker.",
    "- **Longer** (from two thirds of a lease, depending on where the cut falls): the "
    "runs are stopped by the worker's own clock before their leases end; another worker "
    "rescues each job (a `lost` attempt, which counts "
    "against `max_attempts`) and runs it from its last checkpoint. Nothing the cut-off "
    "worker sends afterwards is accepted: checkpoints, results and hand-backs carry the "
    "old token, and statements held in the network and delivered after the heal are "
    "refused like any stale write. The cut-off worker then serves again by itself "
    "(`partition-long`).",
    "- In a real partition no RST arrives: conveyor's connections use TCP keepalives "
    "(10 s idle, 3 probes 5 s apart) and a 5 s connect timeout, and each heartbeat "
    "waits at most half the margin; the heartbeat thread stops runs on time whatever "
    "the statements in flight are doing. A handler blocked in `ctx.checkpoint` when "
    "its run is stopped gets its cancellation at once.",
    "",
    "**Failover.** Run PostgreSQL with a *synchronous* standby (`synchronous_commit = on`, "
    "`synchronous_standby_names` naming it): a submit returns only after its COMMIT, "
    "which then waited for the standby, so **every submit acknowledged before the "
    "primary died is on the promoted standby**, and so is every recorded result. With "
    "an asynchronous standby the last commits before the crash can be lost (submits "
    "that were acknowledged; results, whose jobs then run again): conveyor cannot "
    "promise more than the database keeps. For the workers, a failover is a partition "
    "that lasts from the primary's death until they reach the promoted standby; the "
    "rules above apply, never two live runs of a job. Workers reconnect by themselves "
    "(a broken pooled connection is discarded and the statement runs again on a new "
    "one; the LISTEN connection comes back with backoff, polling meanwhile) if their "
    "URL finds the new primary: name both servers with "
    "`target_session_attrs=read-write` (`postgresql://user@db1:5432,db2:5432/jobs"
    "?target_session_attrs=read-write`), or use a name or address that moves. A worker "
    "claims again at most the claim's back-off cap (5 s, 7.5 s with jitter) after the "
    "promoted server takes connections, plus the 5 s connect timeout for each "
    "unreachable host listed before it; `pg-failover` fails if a worker has not started "
    "a job 30 s after the promotion, and its row below gives the measured times: from the "
    "promotion until every worker runs jobs again, and from the primary's death to the "
    "first acknowledged submit. **Leases follow the server's clock**: lease ends are "
    "timestamps written by the primary's `now()` and read by the standby's after "
    "promotion, so the two machines' clocks must agree to well within the margin "
    "(NTP keeps them to milliseconds); a standby clock ahead by more than the margin "
    "would end every lease that much early.",
]


# What the suite found when it was first run, on the code before the fixes of issue #16
# (commit b1e973d): kept here so the table below can be read against it.
HISTORY = [
    "## What the suite found before the #16 fixes",
    "",
    "On the code before the fixes of issue #16 (commit `b1e973d`), full mode, both "
    "backends (seed 12; the short mode finds the same):",
    "",
    "- `held-lock` (both): every claim sent while another connection held the lock "
    "waited past the lease and stored an already-expired lease (runs began 3.0 s after "
    "their lease expired: 28 of 32 jobs on SQLite, 32 of 32 on PostgreSQL); the other "
    "worker's rescuer took the job and ran it while the first run was still going "
    "(overlap 0.04 s on SQLite, 0.55 s on PostgreSQL, until the first worker's next "
    "heartbeat cancelled it). On SQLite only for applications without limited job "
    "types: the limit-counting claim reads the clock after it takes the lock.",
    "- `blocked-loop` (both): PostgreSQL logged `heartbeat failed (no answer from "
    "PostgreSQL)` while a handler held the loop, and 19 attempts of live workers were "
    "rescued as `lost`. SQLite lost 3: a job claimed just before a handler blocked the "
    "loop is not renewed until the loop hands it to the heartbeat (its run began 4 s "
    "after its lease expired).",
    "- `cron-kill` (both): the every-second schedule fired 42 of 91 ticks (SQLite) and "
    "70 of 91 (PostgreSQL) with the default `skip` catch-up.",
    "- `disk-full`, `sqlite-locked` (SQLite): submits raised a raw "
    "`sqlite3.OperationalError`; `conveyor submit` printed a 59-line traceback and exited 1.",
    "- No violation in `kill-drain` (23-25 SIGKILLs in 1,540-job drains), "
    "`sigstop-zombie`, `pg-restart-short`, `pg-restart-long`, `clock-skew`, `limits-kill`, "
    "`isolated-crash`, `sigterm-handback`, `recovery-defaults` (kill→rescued 30-32 s "
    "with the default 30 s lease and 5 s rescue interval).",
    "",
    "## What the suite found on a busy machine (2026-11-24)",
    "",
    "Beside `stress-ng --cpu 2` (CI's `.ci/run` on a fresh clone), `sigterm-handback` on "
    "SQLite reported 8 violations: jobs ran in two workers at once, overlapping by up to "
    "37 ms, and the older runs' checkpoints were refused. Repeated beside a CPU hog and "
    "other agents' disk-heavy work, with `/proc/locks` polled for SQLite's WAL write lock: "
    "a commit held that lock through an fsync for up to 5 s, every other worker's "
    "heartbeat waited for it, and the heartbeat thread, blocked in its beat, could not "
    "stop runs whose leases ran out meanwhile. Fixed: the heartbeat goes on stopping runs "
    "while a beat waits, and wakes at each run's stop time rather than a tick later; a "
    "handler abandoned at shutdown hands its job back runnable only once its lease would have run "
    "out. `sigterm-handback` now runs with a 6 s lease: with 2 s, a 5 s stalled commit "
    "made every worker lose its leases (stopped in time, then rescued), spending "
    "attempts that scenario forbids; lost leases are the other scenarios' subject. "
    "Tried and undone: taking SQLite's write lock by tries every millisecond instead "
    "of SQLite's busy handler (which backs off to 100 ms, so a long waiter loses the "
    "lock to fresh ones): beside the same CPU hog, five idle workers' writes then "
    "stalled for up to 7 s and an every-second cron test missed ticks.",
]


@dataclass
class Result:
    scenario: str
    backend: str
    jobs: int
    runs: int
    faults: int
    seconds: float
    violations: list[str]
    metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kept: str | None = None  # directory kept for inspection

    def figure(self) -> str:
        parts = []
        if "recovery_median" in self.metrics:
            parts.append(
                f"kill→rescued {self.metrics['recovery_median']}s median, "
                f"{self.metrics['recovery_max']}s max ({self.metrics['recoveries']})"
            )
        if "rerun_median" in self.metrics:
            parts.append(
                f"kill→running {self.metrics['rerun_median']}s median, "
                f"{self.metrics['rerun_max']}s max"
            )
        if self.metrics.get("zombie_tails"):
            parts.append(
                f"{self.metrics['zombie_tails']} zombie tails, longest "
                f"{self.metrics['longest_zombie_tail']}s"
            )
        if "ticks" in self.metrics:
            parts.append(f"ticks {self.metrics['ticks']}")
        for key, value in self.metrics.items():
            if key.startswith("peak_"):
                parts.append(f"peak {key[5:]} {value}")
        for key, value in self.metrics.items():
            if key.startswith("fig "):
                parts.append(f"{key[4:]} {value}")
        if "min_lease_left" in self.metrics:
            parts.append(f"least lease left at a start {self.metrics['min_lease_left']}s")
        if self.metrics.get("refused"):
            parts.append(f"{self.metrics['refused']} stale writes refused")
        if self.metrics.get("max_overlap"):
            parts.append(f"worst overlap {self.metrics['max_overlap']}s")
        return "; ".join(parts)


def table(results: list[Result]) -> str:
    lines = [
        "| scenario | backend | runs | jobs | faults | violations | figures | time |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.scenario} | {r.backend} | {r.runs} | {r.jobs} | {r.faults} | "
            f"{len(r.violations)} | {r.figure()} | {r.seconds:.0f}s |"
        )
    return "\n".join(lines)


def print_results(results: list[Result]) -> None:
    print()
    print(table(results))
    bad = [r for r in results if r.violations]
    if not bad:
        print("\nchaos: 0 violations")
        return
    print(f"\nchaos: VIOLATIONS in {len(bad)} of {len(results)} scenario runs")
    for r in bad:
        print(f"\n== {r.scenario} on {r.backend}: {len(r.violations)} violations")
        for v in r.violations[:15]:
            print(f"  - {v}")
        if len(r.violations) > 15:
            print(f"  ... and {len(r.violations) - 15} more")
        if r.kept:
            print(f"  worker logs and run log kept in {r.kept}")


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


SINCE = "## Scenarios run on their own since the latest full run"


def write_doc(
    results: list[Result], command: str, scenarios: list[Any], *, partial: bool = False
) -> None:
    """Regenerate docs/reliability.md from the scenario catalogue and these results.

    ``partial``: the results are of some scenarios only (``--scenario``): the latest full
    run's table stays, and these rows go into a table of their own below it, replacing
    earlier rows of the same scenario and backend there (a full run clears that table).
    """
    previous = DOC.read_text() if DOC.exists() else ""
    by_tag: dict[str, list[str]] = {}
    for sc in scenarios:
        for tag in sc.guarantees:
            by_tag.setdefault(tag, []).append(sc.name)
    out = [
        "# Reliability: the guarantees under faults",
        "",
        "<!-- Generated by `python -m chaos --write-docs` (chaos/report.py); do not edit. -->",
        "",
        "conveyor's guarantees (see the README) are checked by the **chaos suite**: real "
        "`conveyor worker` processes on a fresh database per scenario, faults injected from "
        "outside (SIGKILL, SIGSTOP, held locks, a PostgreSQL server stopped, a full disk, "
        "libfaketime, a worker's network cut by a proxy, a primary killed and its standby "
        "promoted), and a checker that reads an **out-of-band run log** (each handler "
        "appends what it did to a per-process file with `O_APPEND`, never through conveyor) "
        "and the database afterwards. A lost or doubled run shows in the run log even if "
        "conveyor's own records were wrong.",
        "",
        "```sh",
        "scripts/chaos --short        # CI: a subset, small counts, both backends (~6 min)",
        "scripts/chaos --full         # all scenarios, both backends (~18 min); rewrites this file",
        "scripts/chaos --backend sqlite --scenario kill-drain --seed 7",
        "```",
        "",
        "The command exits 1 and prints every violation when any invariant breaks; it keeps "
        "the run log and worker logs of a failing scenario. PostgreSQL scenarios run on a "
        "private, throwaway server (initdb into a temporary directory, its own port, fsync "
        "and synchronous_commit on), so stopping it disturbs nothing else. Workers run with "
        "a 2 s lease, a 0.2 s rescue interval and a 0.2 s poll interval unless stated.",
        "",
        "Every scenario is judged against every invariant; the table below names the "
        "scenarios aimed at each guarantee. `.venv/bin/pytest chaos` tests the checker "
        "itself on hand-made run logs.",
        "",
        "## Guarantees and the scenarios that test them",
        "",
        "| guarantee | how it is checked | scenarios |",
        "|---|---|---|",
    ]
    for tag, title, how in GUARANTEES:
        names = ", ".join(f"`{n}`" for n in by_tag.get(tag, []))
        out.append(f"| **{title}** | {how} | {names} |")
    out += ["", "## Scenarios", "", "| scenario | backends | fault | short mode |"]
    out.append("|---|---|---|---|")
    for sc in scenarios:
        out.append(
            f"| `{sc.name}` | {', '.join(sc.backends)} | {sc.summary} | "
            f"{'yes' if sc.short else 'no'} |"
        )
    out += ["", *PROMISES, "", *HISTORY]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    if partial and "\n## Latest results" in previous:
        latest, _, since = previous[previous.index("\n## Latest results") :].partition(SINCE)
        out += [latest.rstrip(), "", *_since(since, results, command, stamp), ""]
        DOC.write_text("\n".join(out))
        return
    total = sum(len(r.violations) for r in results)
    out += [
        "",
        "## Latest results",
        "",
        f"`{command}` at commit `{_commit()}`, {stamp}: **{total} violations**. *runs* are "
        "handler runs in the run log, *faults* the faults injected (kills, freezes, "
        "SIGTERMs, locks, server stops, disk fills).",
        "",
        table(results),
        "",
    ]
    if total:
        out += ["### Violations", ""]
        for r in results:
            for v in r.violations[:10]:
                out.append(f"- `{r.scenario}` on {r.backend}: {v}")
            if len(r.violations) > 10:
                out.append(f"- `{r.scenario}` on {r.backend}: ... {len(r.violations) - 10} more")
        out.append("")
    DOC.write_text("\n".join(out))


def _since(previous: str, results: list[Result], command: str, stamp: str) -> list[str]:
    """The table of scenarios run on their own: earlier rows, then these results'."""
    rows: dict[tuple[str, str], str] = {}
    for line in previous.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and cells[0] not in ("scenario",):
            rows[(cells[0], cells[1])] = line
    commit = _commit()
    for r in results:
        violations = "; ".join(v.splitlines()[0][:200] for v in r.violations[:3])
        rows[(r.scenario, r.backend)] = (
            f"| {r.scenario} | {r.backend} | {r.runs} | {r.jobs} | {r.faults} | "
            f"{len(r.violations)}{': ' + violations if violations else ''} | {r.figure()} | "
            f"{r.seconds:.0f}s | `{command}` at `{commit}`, {stamp} |"
        )
    return [
        SINCE,
        "",
        "Scenarios added or changed since, each run with `--scenario NAME --write-docs`.",
        "",
        "| scenario | backend | runs | jobs | faults | violations | figures | time | run |",
        "|---|---|---:|---:|---:|---:|---|---:|---|",
        *rows.values(),
    ]
