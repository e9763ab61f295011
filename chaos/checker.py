"""The invariants, checked from the out-of-band run log and the database afterwards.

A *run* is one claim of a job as its handler saw it: the records of one (job, lease
token, pid). A run is **live** from its first record to its last record of activity
(``start``, ``begin``, ``beat``, ``ckpt``, ``step``, ``block``, ``unblock``, ``end``; a ``refused``
or ``cancelled`` record marks it stopping and does not extend it). A process frozen by
SIGSTOP executes nothing, so a run frozen while another run of its job started is live
only up to the freeze; what it does after SIGCONT is a *zombie tail*, which must be
short (it ends at its next fenced write or heartbeat) and must have no write accepted.

Violations, each with the evidence:

- **lost**: a submitted job did not end in the expected state (still queued/running,
  or failed where it should have succeeded).
- **double run**: two live runs of one job overlap in time (monotonic clock of the
  machine, shared by every process).
- **stale write**: a checkpoint sent after a newer run of the job had started was
  accepted; or the stored result or checkpoint was not written by the final token's
  run; or a run resumed from a checkpoint older than one already accepted (a lost
  checkpoint).
- **zombie**: a zombie tail wrote an accepted step or ran longer than the bound.
- **recovery**: a job whose worker was SIGKILLed was not claimable again (rescued as a
  ``lost`` attempt, read from the database) within lease + rescue interval + slack. When
  it then ran again (from the run log) is reported too: in a long queue a rescued job
  waits its turn behind the jobs due before it.
- **lease**: a run began with its lease already expired (a claim that waited past the
  lease stored an expired lease, so another worker may rescue and run the job alongside);
  checked where nothing delays a handler's start (no blocked loop, no frozen process).
- **limit**: more live runs of a limited type (or key) at once than its limit.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.harness import Run
from chaos.runlog import Record

LIVE = frozenset({"start", "begin", "beat", "ckpt", "step", "block", "unblock", "end"})
STOPPING = frozenset({"refused", "cancelled"})
# Slack on top of lease + rescue interval before a recovery counts as late: a loaded
# 2-core machine can take seconds to schedule a process; the figure itself is reported.
RECOVERY_SLACK = 10.0


@dataclass
class Span:
    job: str
    type: str
    token: int
    pid: int
    attempt: int
    records: list[Record] = field(default_factory=list)
    live_start: float = 0.0
    live_end: float = 0.0
    zombie_tail: list[Record] = field(default_factory=list)

    @property
    def start_step(self) -> int | None:
        for r in self.records:
            if r.event == "start":
                return int(r.extra.get("step", 0))
        return None

    def accepted(self) -> list[tuple[Record, float]]:
        """Accepted checkpoints: each ``step`` record with the time its ``ckpt`` was sent."""
        sent: dict[int, float] = {}
        out = []
        for r in self.records:
            if r.event == "ckpt":
                sent[int(r.extra["step"])] = r.mono
            elif r.event == "step":
                out.append((r, sent.get(int(r.extra["step"]), r.mono)))
        return out


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)

    def add(self, kind: str, text: str) -> None:
        self.violations.append(f"[{kind}] {text}")


def spans_of(run: Run, records: list[Record]) -> dict[str, list[Span]]:
    spans: dict[tuple[str, int, int], Span] = {}
    for r in records:
        if not r.job:
            continue
        key = (r.job, r.token, r.pid)
        if key not in spans:
            spans[key] = Span(r.job, r.type, r.token, r.pid, r.attempt)
        spans[key].records.append(r)
    by_job: dict[str, list[Span]] = defaultdict(list)
    for span in spans.values():
        by_job[span.job].append(span)
    freezes = _freezes(run)
    for job_spans in by_job.values():
        job_spans.sort(key=lambda s: (s.records[0].mono, s.token))
        for span in job_spans:
            _live_interval(span, job_spans, freezes.get(span.pid, []))
    return by_job


def _freezes(run: Run) -> dict[int, list[tuple[float, float]]]:
    """Per pid, the [SIGSTOP, SIGCONT] windows (open-ended if never continued)."""
    out: dict[int, list[tuple[float, float]]] = defaultdict(list)
    stopped: dict[int, float] = {}
    for f in run.faults:
        if f.kind == "stop":
            stopped[f.pid] = f.mono
        elif f.kind in ("cont", "kill") and f.pid in stopped:
            out[f.pid].append((stopped.pop(f.pid), f.mono))
    for pid, at in stopped.items():
        out[pid].append((at, float("inf")))
    return out


def _live_interval(span: Span, siblings: list[Span], freezes: list[tuple[float, float]]) -> None:
    live = [r for r in span.records if r.event in LIVE] or span.records
    span.live_start = live[0].mono
    span.live_end = live[-1].mono
    for stop, cont in freezes:
        if not (span.live_start < stop < span.live_end):
            continue
        # Frozen mid-run. If a newer run of the job started meanwhile, what this run does
        # after SIGCONT is a zombie tail, not a live run.
        newer = [s for s in siblings if s.token > span.token and s.records[0].mono < span.live_end]
        if not newer:
            continue
        before = [r for r in live if r.mono <= stop]
        span.live_end = before[-1].mono if before else span.live_start
        span.zombie_tail = [r for r in span.records if r.mono >= cont]
        return


def check(
    run: Run,
    records: list[Record],
    jobs: dict[str, dict[str, Any]],
    lost: dict[tuple[str, int], float] | None = None,
) -> Verdict:
    verdict = Verdict()
    records = sorted(records, key=lambda r: r.mono)
    by_job = spans_of(run, records)
    _check_outcomes(run, jobs, by_job, verdict)
    _check_overlaps(by_job, verdict)
    _check_writes(run, jobs, by_job, verdict)
    _check_zombies(run, by_job, verdict)
    _check_recovery(run, by_job, lost or {}, verdict)
    _check_limits(run, jobs, by_job, verdict)
    _check_leases(run, by_job, verdict)
    verdict.metrics["runs"] = sum(len(s) for s in by_job.values())
    verdict.metrics["refused"] = sum(1 for r in records if r.event == "refused")
    for text in run.violations:
        verdict.violations.append(text)
    return verdict


def _check_outcomes(
    run: Run, jobs: dict[str, dict[str, Any]], by_job: dict[str, list[Span]], verdict: Verdict
) -> None:
    for job_id, expected in run.expected.items():
        row = jobs.get(job_id)
        if row is None:
            verdict.add("lost", f"job {job_id} is not in the database")
        elif row["status"] != expected:
            verdict.add(
                "lost",
                f"job {job_id} ({row['type']}) is {row['status']} after attempt "
                f"{row['attempt']}, expected {expected}",
            )


def _check_overlaps(by_job: dict[str, list[Span]], verdict: Verdict) -> None:
    worst = 0.0
    for job_id, spans in by_job.items():
        for i, a in enumerate(spans):
            for b in spans[i + 1 :]:
                overlap = min(a.live_end, b.live_end) - max(a.live_start, b.live_start)
                if overlap > 0:
                    worst = max(worst, overlap)
                    verdict.add(
                        "double run",
                        f"job {job_id} ({a.type}): run token {a.token} pid {a.pid} and run "
                        f"token {b.token} pid {b.pid} were live at once for {overlap:.2f}s",
                    )
    verdict.metrics["max_overlap"] = round(worst, 3)


def _check_writes(
    run: Run, jobs: dict[str, dict[str, Any]], by_job: dict[str, list[Span]], verdict: Verdict
) -> None:
    for job_id, spans in by_job.items():
        # A checkpoint sent after a newer run had started must have been refused.
        for span in spans:
            newer_starts = [s.records[0].mono for s in spans if s.token > span.token]
            if not newer_starts:
                continue
            first_newer = min(newer_starts)
            for rec, sent in span.accepted():
                if sent > first_newer:
                    verdict.add(
                        "stale write",
                        f"job {job_id}: checkpoint step {rec.extra['step']} of token "
                        f"{span.token} (pid {span.pid}) was accepted although it was sent "
                        f"{sent - first_newer:.2f}s after a newer run had started",
                    )
        # No checkpoint lost: each run resumes from the newest accepted one before it.
        best = 0
        pending: set[int] = set()
        for span in sorted(spans, key=lambda s: s.token):
            first = span.start_step
            if first is not None and span.type not in ("tick",):
                if first < best:
                    verdict.add(
                        "stale write",
                        f"job {job_id}: run token {span.token} resumed from step {first} "
                        f"although step {best} had been checkpointed (a checkpoint was lost "
                        "or overwritten by a stale run)",
                    )
                elif first > best and first not in pending:
                    verdict.add(
                        "stale write",
                        f"job {job_id}: run token {span.token} resumed from step {first}, "
                        f"which no earlier run checkpointed (newest accepted: {best})",
                    )
            for r in span.records:
                if r.event == "step":
                    best = max(best, int(r.extra["step"]))
                elif r.event == "ckpt":
                    pending.add(int(r.extra["step"]))
        # The stored result and checkpoint come from the final token's run.
        row = jobs.get(job_id)
        if row is None or row["status"] != "succeeded":
            continue
        result = row["result"] if isinstance(row["result"], dict) else {}
        token = result.get("token")
        if token is None:
            continue
        if token != row["lease_token"]:
            verdict.add(
                "stale write",
                f"job {job_id}: result written by token {token}, "
                f"but the job's final token is {row['lease_token']}",
            )
        final = [s for s in spans if s.token == token]
        if not any(r.event == "end" for s in final for r in s.records):
            verdict.add(
                "stale write", f"job {job_id}: result of token {token}, whose run never ended"
            )
        state = row["state"] if isinstance(row["state"], dict) else {}
        made_steps = any(r.event == "step" for s in final for r in s.records)
        if made_steps and state.get("token") != token:
            verdict.add(
                "stale write",
                f"job {job_id}: stored checkpoint from token {state.get('token')}, "
                f"final run's token is {token}",
            )


def _check_zombies(run: Run, by_job: dict[str, list[Span]], verdict: Verdict) -> None:
    bound = run.options.lease_seconds + 2.0
    conts = [f for f in run.faults if f.kind == "cont"]
    tails = 0
    longest = 0.0
    for spans in by_job.values():
        for span in spans:
            if not span.zombie_tail:
                continue
            tails += 1
            resumed = min(
                (f.mono for f in conts if f.pid == span.pid and f.mono >= span.live_end),
                default=span.zombie_tail[0].mono,
            )
            active = [r for r in span.zombie_tail if r.event in LIVE]
            length = (active[-1].mono - resumed) if active else 0.0
            longest = max(longest, length)
            for r in span.zombie_tail:
                if r.event == "step":
                    verdict.add(
                        "zombie",
                        f"job {span.job}: zombie run token {span.token} (pid {span.pid}) had "
                        f"checkpoint step {r.extra['step']} accepted after SIGCONT",
                    )
            if length > bound:
                verdict.add(
                    "zombie",
                    f"job {span.job}: zombie run token {span.token} (pid {span.pid}) kept "
                    f"running {length:.2f}s after SIGCONT (bound {bound:g}s)",
                )
    verdict.metrics["zombie_tails"] = tails
    verdict.metrics["longest_zombie_tail"] = round(longest, 3)


def _check_recovery(
    run: Run, by_job: dict[str, list[Span]], lost: dict[tuple[str, int], float], verdict: Verdict
) -> None:
    o = run.options
    bound = o.lease_seconds + o.rescue_seconds + RECOVERY_SLACK
    rescued: list[float] = []
    reran: list[float] = []
    for kill in (f for f in run.faults if f.kind == "kill"):
        for job_id, spans in by_job.items():
            hit = [
                s
                for s in spans
                if s.pid == kill.pid
                and s.live_start < kill.mono
                and not any(r.event in ("end", *STOPPING) for r in s.records)
            ]
            if not hit:
                continue
            later = [s.live_start for s in spans if s.live_start > kill.mono]
            if later:
                reran.append(min(later) - kill.mono)
            at = lost.get((job_id, hit[0].attempt))
            if at is None:
                if run.expected.get(job_id) == "succeeded":
                    verdict.add(
                        "recovery",
                        f"job {job_id}: attempt {hit[0].attempt} ran on killed worker "
                        f"{kill.pid} and was never rescued as lost",
                    )
                continue
            figure = at - run.db_clock_offset - kill.wall
            rescued.append(figure)
            if figure > bound:
                verdict.add(
                    "recovery",
                    f"job {job_id}: rescued {figure:.1f}s after its worker was killed "
                    f"(bound {bound:.1f}s = lease + rescue interval + {RECOVERY_SLACK:g}s slack)",
                )
    if rescued:
        verdict.metrics["recovery_median"] = round(statistics.median(rescued), 2)
        verdict.metrics["recovery_max"] = round(max(rescued), 2)
        verdict.metrics["recoveries"] = len(rescued)
    if reran:
        verdict.metrics["rerun_median"] = round(statistics.median(reran), 2)
        verdict.metrics["rerun_max"] = round(max(reran), 2)


def _check_limits(
    run: Run, jobs: dict[str, dict[str, Any]], by_job: dict[str, list[Span]], verdict: Verdict
) -> None:
    def peak(spans: list[Span]) -> tuple[float, int]:
        events = sorted(
            [(s.live_start, 1) for s in spans] + [(s.live_end, -1) for s in spans],
            key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
        )
        now = best = 0
        at = 0.0
        for when, delta in events:
            now += delta
            if now > best:
                best, at = now, when
        return at, best

    all_spans = [s for spans in by_job.values() for s in spans]
    for job_type, limit in run.limits.items():
        _, most = peak([s for s in all_spans if s.type == job_type])
        verdict.metrics[f"peak_{job_type}"] = most
        if most > limit:
            verdict.add("limit", f"{most} runs of {job_type} live at once (limit {limit})")
    for job_type, limit in run.key_limits.items():
        per_key: dict[str, list[Span]] = defaultdict(list)
        for s in all_spans:
            if s.type == job_type:
                per_key[str((jobs.get(s.job) or {}).get("concurrency_key"))].append(s)
        for key, spans in per_key.items():
            _, most = peak(spans)
            if most > limit:
                verdict.add(
                    "limit", f"{most} runs of {job_type} key {key} live at once (limit {limit})"
                )


def _check_leases(run: Run, by_job: dict[str, list[Span]], verdict: Verdict) -> None:
    left = [
        (float(r.extra["lease_left"]), span)
        for spans in by_job.values()
        for span in spans
        for r in span.records[:1]
        if r.event == "start" and r.extra.get("lease_left") is not None
    ]
    if not run.check_lease_at_start:
        return
    if left:
        verdict.metrics["min_lease_left"] = round(min(v for v, _ in left), 3)
    frozen = [f for f in run.faults if f.kind in ("stop", "cont")]
    for value, span in left:
        if value >= 0:
            continue
        near = run.options.lease_seconds + 1
        if any(f.pid == span.pid and abs(f.mono - span.live_start) < near for f in frozen):
            continue
        verdict.add(
            "lease",
            f"job {span.job}: run token {span.token} (pid {span.pid}) began with its lease "
            f"expired {-value:.2f}s before: the claim stored an already-expired lease",
        )
