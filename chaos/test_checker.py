"""The checker judged on hand-made run logs: it must flag what it claims to flag.

Not part of the default test run (testpaths is tests/): ``.venv/bin/pytest chaos -q``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.checker import check
from chaos.harness import Fault, Run
from chaos.runlog import Record


def rec(event: str, job: str, token: int, pid: int, at: float, **extra: Any) -> Record:
    return Record(event, pid, at, at, job=job, type="work", attempt=token, token=token, extra=extra)


def job_row(job: str, token: int, status: str = "succeeded", step: int = 2) -> dict[str, Any]:
    return {
        "id": job,
        "type": "work",
        "status": status,
        "attempt": token,
        "lease_token": token,
        "state": {"step": step, "token": token},
        "result": {"token": token},
        "concurrency_key": None,
    }


def make_run(tmp_path: Path, *faults: Fault) -> Run:
    run = Run("unit", "sqlite", "sqlite:///unused", tmp_path, False, 0)
    run.faults.extend(faults)
    run.expected["j"] = "succeeded"
    return run


def a_clean_retry() -> list[Record]:
    return [
        rec("start", "j", 1, 10, 0.0, step=0),
        rec("ckpt", "j", 1, 10, 0.5, step=1),
        rec("step", "j", 1, 10, 0.6, step=1),
        # pid 10 killed at 1.0; pid 11 takes over from the checkpoint
        rec("start", "j", 2, 11, 3.5, step=1),
        rec("ckpt", "j", 2, 11, 3.8, step=2),
        rec("step", "j", 2, 11, 3.9, step=2),
        rec("end", "j", 2, 11, 4.0),
    ]


def test_a_clean_retry_passes_and_reports_recovery(tmp_path: Path) -> None:
    run = make_run(tmp_path, Fault("kill", 1.0, 10, wall=1000.0))
    verdict = check(run, a_clean_retry(), {"j": job_row("j", 2)}, {("j", 1): 1003.0})
    assert verdict.violations == []
    assert verdict.metrics["recovery_max"] == 3.0
    assert verdict.metrics["rerun_max"] == 2.5
    late = check(run, a_clean_retry(), {"j": job_row("j", 2)}, {("j", 1): 1020.0})
    assert [v[:10] for v in late.violations] == ["[recovery]"]


def test_overlapping_runs_are_a_double_run(tmp_path: Path) -> None:
    records = [*a_clean_retry(), rec("beat", "j", 1, 10, 3.6, step=2)]
    verdict = check(make_run(tmp_path), records, {"j": job_row("j", 2)})
    assert any(v.startswith("[double run]") for v in verdict.violations)


def test_a_frozen_run_is_not_live_but_its_accepted_write_is_stale(tmp_path: Path) -> None:
    records = [
        *a_clean_retry(),
        rec("ckpt", "j", 1, 10, 4.5, step=2),
        rec("refused", "j", 1, 10, 4.51, step=2),
    ]
    run = make_run(tmp_path, Fault("stop", 0.7, 10), Fault("cont", 4.4, 10))
    assert check(run, records, {"j": job_row("j", 2)}).violations == []
    records[-1] = rec("step", "j", 1, 10, 4.51, step=2)
    violations = check(run, records, {"j": job_row("j", 2)}).violations
    assert any(v.startswith("[zombie]") for v in violations)
    assert any(v.startswith("[stale write]") for v in violations)


def test_a_lost_checkpoint_and_a_foreign_result_are_flagged(tmp_path: Path) -> None:
    records = a_clean_retry()
    records[3] = rec("start", "j", 2, 11, 3.5, step=0)  # resumed from before step 1
    row = job_row("j", 2) | {"result": {"token": 1}}
    violations = check(make_run(tmp_path), records, {"j": row}).violations
    assert sum(v.startswith("[stale write]") for v in violations) >= 2


def test_a_job_not_done_is_lost(tmp_path: Path) -> None:
    violations = check(make_run(tmp_path), [], {"j": job_row("j", 1, "running")}).violations
    assert violations and violations[0].startswith("[lost]")


def test_limits_count_live_runs(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run.expected.clear()
    run.limits["work"] = 1
    records = [
        rec("start", "a", 1, 10, 0.0, step=0),
        rec("end", "a", 1, 10, 1.0),
        rec("start", "b", 1, 11, 0.5, step=0),
        rec("end", "b", 1, 11, 1.5),
    ]
    violations = check(run, records, {}).violations
    assert violations == ["[limit] 2 runs of work live at once (limit 1)"]
