-- Jobs stored in creation order. The table's key becomes the job's creation time in
-- microseconds (created_us, an INTEGER PRIMARY KEY: SQLite's rowid), unique to each job,
-- and created_at holds the same time in seconds. The jobs list newest or oldest first,
-- and a time filter is a range, on the table itself: the index by creation time goes,
-- and with it one of the four b-trees every new job was written into (its row, its id's
-- key, the claim index and that one). The id keeps a unique index of its own. Jobs
-- created in the same microsecond (a batch) take the microseconds after it, in
-- submission order.
--
-- created_at stays a stored column, so that a release before this one, which writes
-- created_at and not the key, can still submit during a rolling deploy: SQLite gives
-- such a job the key after the newest job's, so it lists in the order it was written.
--
-- The table is made again and the jobs copied in (SQLite cannot change a table's key in
-- place): on a large table this takes a while, holding every other write back; stop the
-- workers to migrate. A stored creation time keeps its microsecond (times were stored
-- to a fraction of one); one that another job of the same microsecond holds moves to the
-- next free one, in (created_at, id) order, the order the jobs listed in before.
CREATE TABLE conveyor_jobs_by_creation (
    created_us        INTEGER PRIMARY KEY,
    id                TEXT NOT NULL UNIQUE,
    type              TEXT NOT NULL,
    queue             TEXT NOT NULL,
    tenant            TEXT,
    payload           TEXT NOT NULL,
    status            TEXT NOT NULL,
    priority          INTEGER NOT NULL DEFAULT 0,
    attempt           INTEGER NOT NULL DEFAULT 0,
    max_attempts      INTEGER NOT NULL,
    run_at            REAL NOT NULL,
    timeout           REAL,
    lease_seconds     REAL,
    backoff_base      REAL NOT NULL,
    backoff_cap       REAL NOT NULL,
    progress_done     REAL,
    progress_total    REAL,
    progress_message  TEXT,
    state             TEXT,
    result            TEXT,
    result_ref        TEXT,
    error             TEXT,
    parent_id         TEXT,
    root_id           TEXT,
    depends_on        TEXT,
    unique_key        TEXT,
    concurrency_key   TEXT,
    retry_of          TEXT,
    created_at        REAL NOT NULL,
    started_at        REAL,
    finished_at       REAL,
    lease_owner       TEXT,
    lease_expires_at  REAL,
    lease_token       INTEGER NOT NULL DEFAULT 0,
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    trace_context     TEXT,
    retry_count       INTEGER NOT NULL DEFAULT 0,
    retried_by        TEXT,
    submitted_by      TEXT NOT NULL DEFAULT 'local'
);

-- Row r (in (created_at, id) order) of microsecond t takes r + the largest t' - r' of the
-- rows up to it: its own t when no earlier row pushed past it, else one more than the
-- row before; strictly increasing either way.
INSERT INTO conveyor_jobs_by_creation (
    created_us, created_at, id, type, queue, tenant, payload, status, priority, attempt,
    max_attempts, run_at, timeout, lease_seconds, backoff_base, backoff_cap, progress_done,
    progress_total, progress_message, state, result, result_ref, error, parent_id, root_id,
    depends_on, unique_key, concurrency_key, retry_of, started_at, finished_at, lease_owner,
    lease_expires_at, lease_token, cancel_requested, trace_context, retry_count, retried_by,
    submitted_by
)
SELECT
    k, k / 1000000.0, id, type, queue, tenant, payload, status, priority, attempt,
    max_attempts, run_at, timeout, lease_seconds, backoff_base, backoff_cap, progress_done,
    progress_total, progress_message, state, result, result_ref, error, parent_id, root_id,
    depends_on, unique_key, concurrency_key, retry_of, started_at, finished_at, lease_owner,
    lease_expires_at, lease_token, cancel_requested, trace_context, retry_count, retried_by,
    submitted_by
FROM (
    SELECT *, r + max(us - r) OVER (ORDER BY r ROWS UNBOUNDED PRECEDING) AS k
    FROM (
        SELECT *, CAST(round(created_at * 1000000) AS INTEGER) AS us,
               row_number() OVER (ORDER BY created_at, id) AS r
        FROM conveyor_jobs
    )
)
ORDER BY k;

DROP TABLE conveyor_jobs;
ALTER TABLE conveyor_jobs_by_creation RENAME TO conveyor_jobs;

-- Every index of the table before, but the one by creation time, which the table's own
-- order replaces; a tenant's jobs list in creation order on the tenant's index.
CREATE INDEX conveyor_jobs_claim ON conveyor_jobs (queue, type, priority, run_at, id)
    WHERE status = 'queued';
CREATE INDEX conveyor_jobs_tenant_claim ON conveyor_jobs (tenant, queue, priority, run_at, id)
    WHERE status = 'queued' AND tenant IS NOT NULL;
CREATE INDEX conveyor_jobs_leases ON conveyor_jobs (lease_expires_at)
    WHERE status = 'running';
CREATE UNIQUE INDEX conveyor_jobs_unique_key ON conveyor_jobs (unique_key, coalesce(tenant, ''))
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'queued', 'running', 'waiting');
CREATE INDEX conveyor_jobs_parent ON conveyor_jobs (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX conveyor_jobs_root ON conveyor_jobs (root_id) WHERE root_id IS NOT NULL;
CREATE INDEX conveyor_jobs_running_type ON conveyor_jobs (type, lease_expires_at)
    WHERE status = 'running';
CREATE INDEX conveyor_jobs_running_key ON conveyor_jobs (type, concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
CREATE INDEX conveyor_jobs_running_root ON conveyor_jobs (root_id)
    WHERE status = 'running' AND root_id IS NOT NULL;
CREATE INDEX conveyor_jobs_prunable ON conveyor_jobs (status, finished_at)
    WHERE parent_id IS NULL AND finished_at IS NOT NULL;
CREATE INDEX conveyor_jobs_finished_at ON conveyor_jobs (finished_at, status, started_at, run_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX conveyor_jobs_tenant_created ON conveyor_jobs (tenant, created_us)
    WHERE tenant IS NOT NULL;
