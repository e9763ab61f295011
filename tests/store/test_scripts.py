"""The shared transaction scripts, driven with canned rows: no database, no dialect's SQL.

A script is a generator of named queries (conveyor/store/scripts/). :class:`Canned`
answers each query with the rows a test gives for it and keeps what was asked, so each
test states which queries a script asks for, with what, and what it makes of the answers:
the dialect-free logic, apart from either backend's SQL (which the contract beside this
module runs on both databases).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from conveyor.core.lifecycle import Status
from conveyor.core.model import JSON, Job, NewJob, Outcome, Settlement
from conveyor.errors import InvalidState
from conveyor.store import scripts
from conveyor.store.protocol import Limits, Retention, Submitted
from conveyor.store.scripts import Row, Script

AT = datetime(2030, 1, 1, tzinfo=UTC)


class Canned:
    """An executor of named queries that answers from canned rows, in order per name."""

    def __init__(self, answers: Mapping[str, Iterable[list[Row]]] | None = None) -> None:
        self.answers = {name: deque(rows) for name, rows in (answers or {}).items()}
        self.asked: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, name: str, params: dict[str, Any]) -> list[Any]:
        self.asked.append((name, params))
        queued = self.answers.get(name)
        return list(queued.popleft()) if queued else []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.asked]

    def params(self, name: str) -> list[dict[str, Any]]:
        return [params for asked, params in self.asked if asked == name]


class Values:
    """A dialect whose stored values are Python's own: times as datetimes, JSON as is."""

    def time(self, value: Any) -> datetime | None:
        return value if value is None or isinstance(value, datetime) else None

    def json(self, value: Any) -> JSON:
        return value

    def strings(self, value: Any) -> tuple[str, ...]:
        return tuple(value)

    def job(self, row: Row) -> Job:
        return Job(
            id=row["id"],
            type="t",
            queue="default",
            payload={},
            status=Status(row["status"]),
            priority=0,
            attempt=0,
            max_attempts=3,
            run_at=AT,
            created_at=AT,
            parent_id=row.get("parent_id"),
            retried_by=row.get("retried_by"),
        )

    def submit(self, jobs: Sequence[NewJob]) -> Script[list[Submitted]]:
        yield "submit", {"ids": [j.id for j in jobs]}
        return [Submitted(j.stored(Status.QUEUED, AT, AT), created=True) for j in jobs]


DIALECT = Values()


def counts(**n: int) -> dict[str, Any]:
    """A row of conveyor_job_counts for job ``p``."""
    row: dict[str, Any] = dict.fromkeys(scripts.COUNTERS, 0)
    return {"job_id": "p", **row, **n}


# -- the settle's carry-on rule (after_settle) -------------------------------------------


def test_jobs_without_parent_or_dependents_are_carried_nowhere() -> None:
    db = Canned({"awaited": [[]]})
    ends = [("a", None, Status.SUCCEEDED), ("b", None, Status.QUEUED)]
    scripts.drive(scripts.after_settle(DIALECT, ends), db)
    # Only the ended job is looked up; a retry queued again waits for nothing.
    assert db.asked == [("awaited", {"ids": ["a"]})]


def test_a_batch_of_retries_asks_nothing() -> None:
    db = Canned()
    scripts.drive(scripts.after_settle(DIALECT, [("a", None, Status.QUEUED)]), db)
    assert db.asked == []


def test_awaited_jobs_found_with_the_settle_are_not_looked_up_again() -> None:
    db = Canned({"pending_dependents": [[{"id": "d"}]], "unmet_dependencies": [[{"n": 0}]]})
    ends = [("a", None, Status.SUCCEEDED), ("b", None, Status.SUCCEEDED)]
    scripts.drive(scripts.after_settle(DIALECT, ends, awaited={"a"}), db)
    assert db.names == ["pending_dependents", "unmet_dependencies", "release_pending"]
    assert db.params("pending_dependents") == [{"id": "a"}]  # not b: nothing waits for it
    assert db.params("release_pending") == [{"id": "d"}]


def test_a_failed_job_cancels_its_pending_dependents() -> None:
    cancelled: list[Row] = [{"id": "d", "parent_id": None}]
    db = Canned({"pending_dependents": [[{"id": "d"}]], "cancel_pending": [cancelled]})
    scripts.drive(scripts.after_settle(DIALECT, [("a", None, Status.FAILED)], awaited={"a"}), db)
    assert db.params("cancel_pending") == [{"id": "d", "reason": "dependency a failed"}]
    # d ended too: its own dependents are looked for, in the next round.
    assert db.params("pending_dependents") == [{"id": "a"}, {"id": "d"}]


def test_a_childs_end_is_counted_and_decides_its_waiting_parent_from_the_new_counts() -> None:
    db = Canned(
        {
            "awaited": [[]],
            "count_moves": [[counts(succeeded=2)]],
            "finish_waiting": [[{"id": "p", "parent_id": None, "status": "succeeded"}]],
            "fire_callbacks": [[]],
        }
    )
    scripts.drive(scripts.after_settle(DIALECT, [("c", "p", Status.SUCCEEDED)]), db)
    assert db.names == [
        "awaited",
        "count_moves",
        "finish_waiting",
        "fire_callbacks",
        "pending_dependents",
    ]
    (moves,) = db.params("count_moves")
    assert moves == {"moves": '[{"parent":"p","src":"active","dst":"succeeded","n":1}]'}
    # The counts the move returned decide the parent: no second read, no lock_counts.
    assert db.params("finish_waiting") == [{"id": "p", "status": "succeeded", "error": None}]
    # The child waits for nothing (not awaited); the parent that ended is looked up.
    assert db.params("pending_dependents") == [{"id": "p"}]


def test_a_parent_decided_from_its_children_fires_its_callbacks_and_skips_the_lookup() -> None:
    """The rule both backends now share: a decided parent is carried on (its callbacks
    fire), but its dependents are looked for only if the settle found some."""
    db = Canned({"awaited": [[]], "lock_counts": [[counts(failed=1)]], "fire_callbacks": [[]]})
    ends = [("p", None, Status.FAILED)]
    scripts.drive(scripts.after_settle(DIALECT, ends, parents={"p"}), db)
    assert db.names == ["awaited", "lock_counts", "fire_callbacks"]
    assert db.params("fire_callbacks") == [{"job_id": "p", "kinds": ["complete"]}]


def test_a_parent_still_with_work_below_it_waits() -> None:
    db = Canned({"lock_counts": [[counts(active=1, succeeded=1)]]})
    returned = Settlement("p", 7, Status.SUCCEEDED, Outcome.SUCCEEDED)
    (decided,) = scripts.drive(scripts.decide_from_children(DIALECT, [returned]), db)
    assert decided.status is Status.WAITING and decided.token == 7
    db = Canned({"lock_counts": [[counts(succeeded=1, failed=2)]]})
    (decided,) = scripts.drive(scripts.decide_from_children(DIALECT, [returned]), db)
    assert decided.status is Status.FAILED and "2" in (decided.error or "")


def test_a_cancelled_parent_with_work_below_it_stops_that_work_and_waits() -> None:
    """Its handler raised the cancel itself: the cancel is recorded as asked for (so the
    parent ends cancelled, not failed from its cancelled children), and the running
    child is asked to stop."""
    db = Canned(
        {
            "get": [[{"id": "p", "status": "running", "cancel_requested": False}]],
            "unfinished_descendants": [[{"id": "p.0", "status": "running"}]],
            "lock_counts": [[counts(active=1)]],
        }
    )
    stopped = Settlement("p", 7, Status.CANCELLED, Outcome.CANCELLED, error="enough")
    (decided,) = scripts.drive(scripts.decide_from_children(DIALECT, [stopped]), db)
    assert decided.status is Status.WAITING and decided.outcome is Outcome.CANCELLED
    assert db.params("request_cancel") == [
        {"id": "p", "reason": "enough"},
        {"id": "p.0", "reason": "parent p cancelled"},
    ]
    # Nothing left unfinished below it: it ends cancelled now, its cancel already asked.
    db = Canned(
        {
            "get": [[{"id": "p", "status": "running", "cancel_requested": True}]],
            "unfinished_descendants": [[]],
            "lock_counts": [[counts(cancelled=2)]],
        }
    )
    (decided,) = scripts.drive(scripts.decide_from_children(DIALECT, [stopped]), db)
    assert decided.status is Status.CANCELLED
    assert db.names == ["get", "unfinished_descendants", "lock_counts"]


# -- other scripts -------------------------------------------------------------------------


def test_cancel_of_a_missing_job_asks_one_query_and_returns_none() -> None:
    db = Canned()
    assert scripts.drive(scripts.cancel(DIALECT, "gone", "why"), db) is None
    assert db.names == ["lock_job"]


def test_a_running_job_is_asked_to_cancel_rather_than_cancelled() -> None:
    running = {"id": "a", "status": "running", "parent_id": None}
    db = Canned({"lock_job": [[running]], "request_cancel": [[{"id": "a"}]], "get": [[running]]})
    job = scripts.drive(scripts.cancel(DIALECT, "a", "stop"), db)
    # Asked, then whatever it spawned is stopped too: here, nothing below it.
    assert db.names == [
        "lock_job",
        "cancel_unstarted",
        "request_cancel",
        "unfinished_descendants",
        "get",
    ]
    assert job is not None and job.status is Status.RUNNING


def test_a_job_is_retried_once_and_only_from_failed_or_cancelled() -> None:
    new = NewJob(id="a2", type="t", payload={}, retry_of="a")
    queued = {"id": "a", "status": "queued"}
    with pytest.raises(InvalidState, match="only failed or cancelled"):
        scripts.drive(scripts.retry(DIALECT, "a", new), Canned({"lock_job": [[queued]]}))
    retried = {"id": "a", "status": "failed", "retried_by": "a1"}
    db = Canned({"lock_job": [[retried]]})
    assert scripts.drive(scripts.retry_many(DIALECT, [("a", new)]), db) == []
    assert db.names == ["lock_job"]  # refused before anything is written
    db = Canned({"lock_job": [[{"id": "a", "status": "failed"}]]})
    job = scripts.drive(scripts.retry(DIALECT, "a", new), db)
    assert job is not None and job.id == "a2"
    assert db.names == ["lock_job", "mark_retried", "submit"]  # no parent: no counts moved


def test_a_lease_held_by_another_owner_is_returned_unchanged() -> None:
    holder = {"name": "x", "owner": "b", "token": 4, "acquired_at": AT, "expires_at": AT}
    db = Canned({"get_lease": [[holder]], "current_lease": [[holder]]})
    record = scripts.drive(scripts.acquire_lease(DIALECT, "x", "a", 10), db)
    assert (record.owner, record.token) == ("b", 4)
    assert db.names == ["get_lease", "take_lease", "current_lease"]
    assert db.params("take_lease") == [{"name": "x", "owner": "a", "ttl": 10.0}]


def test_prune_asks_each_status_per_overridden_type_and_deletes_whole_trees() -> None:
    db = Canned({"prunable_roots": [[{"id": "r1"}], [], [{"id": "r2"}]], "prune_trees": [[{}] * 5]})
    retention = Retention(succeeded=60, per_type={"report": {"failed": 10}})
    assert scripts.drive(scripts.prune(retention, 100), db) == 5
    asked = db.params("prunable_roots")
    assert [(p["status"], p["type"]) for p in asked] == [
        ("succeeded", None),
        ("succeeded", "report"),
        ("failed", None),
        ("failed", "report"),
        ("cancelled", None),
        ("cancelled", "report"),
    ]
    assert asked[0]["excluded_types"] == ["report"] and asked[1]["excluded_types"] == []
    assert db.params("prune_trees") == [{"roots": ["r1", "r2"]}]


def test_nothing_to_prune_deletes_nothing() -> None:
    db = Canned()
    assert scripts.drive(scripts.prune(Retention(), 10), db) == 0
    assert set(db.names) == {"prunable_roots"}


def test_a_limited_claim_leaves_out_a_type_at_its_cluster_limit() -> None:
    candidates: list[Row] = [
        {"id": "a1", "type": "a", "tenant": None, "concurrency_key": None},
        {"id": "b1", "type": "b", "tenant": None, "concurrency_key": None},
    ]
    db = Canned(
        {
            "lock_limited_types": [[{"type": "a"}]],
            "running_per_type": [[{"type": "a", "n": 2}]],
            "claim_candidates": [candidates],
            "claim_ids": [[{"id": "b1"}]],
        }
    )
    params = {
        "worker_id": "w",
        "queues": ["default"],
        "types": ["a", "b"],
        "limit": 5,
        "lease": 30.0,
    }
    claimed = scripts.drive(scripts.claim_limited(params, Limits(cluster={"a": 2})), db)
    assert claimed == [{"id": "b1"}]
    (candidates_asked,) = db.params("claim_candidates")
    assert candidates_asked["types"] == ["b"]  # at its limit: left out of the claim's ranges
    assert db.params("claim_ids")[0]["ids"] == ["b1"]


def test_drive_async_runs_a_script_as_drive_does() -> None:
    import asyncio

    db = Canned({"lock_counts": [[counts(active=1)]]})

    async def execute(name: str, params: dict[str, Any]) -> list[Any]:
        return db(name, params)

    returned = Settlement("p", 1, Status.SUCCEEDED, Outcome.SUCCEEDED)
    (decided,) = asyncio.run(
        scripts.drive_async(scripts.decide_from_children(DIALECT, [returned]), execute)
    )
    assert decided.status is Status.WAITING and db.names == ["lock_counts"]
