-- Cron schedules: a job template and the next tick, advanced by compare-and-set.
CREATE TABLE conveyor_schedules (
    name            TEXT PRIMARY KEY,
    cron            TEXT NOT NULL,
    timezone        TEXT NOT NULL,
    type            TEXT NOT NULL,
    payload         TEXT NOT NULL,
    queue           TEXT NOT NULL,
    priority        INTEGER NOT NULL,
    max_attempts    INTEGER NOT NULL,
    timeout         REAL,
    lease_seconds   REAL,
    backoff_base    REAL NOT NULL,
    backoff_cap     REAL NOT NULL,
    catch_up        TEXT NOT NULL,
    backfill_limit  INTEGER NOT NULL,
    grace           REAL,
    enabled         INTEGER NOT NULL DEFAULT 1,
    next_run_at     REAL NOT NULL,
    last_run_at     REAL,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL
);

-- Named leases: the current holder; the row stays after release so tokens keep growing.
CREATE TABLE conveyor_leases (
    name         TEXT PRIMARY KEY,
    owner        TEXT,
    token        INTEGER NOT NULL,
    acquired_at  REAL,
    expires_at   REAL
);

-- The last holders of each named lease, for inspection.
CREATE TABLE conveyor_lease_history (
    name         TEXT NOT NULL,
    token        INTEGER NOT NULL,
    owner        TEXT NOT NULL,
    acquired_at  REAL NOT NULL,
    ended_at     REAL NOT NULL,
    ended        TEXT NOT NULL,
    PRIMARY KEY (name, token)
);

-- Starts of rate-limited job types inside the current window (a sliding-window log).
CREATE TABLE conveyor_rate_window (
    type  TEXT NOT NULL,
    at    REAL NOT NULL
);
CREATE INDEX conveyor_rate_window_type_at ON conveyor_rate_window (type, at);

-- Counting the running jobs of a type, or of a concurrency key, for concurrency limits.
CREATE INDEX conveyor_jobs_running_type ON conveyor_jobs (type, lease_expires_at)
    WHERE status = 'running';
CREATE INDEX conveyor_jobs_running_key ON conveyor_jobs (type, concurrency_key)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;

-- Pruning finished trees: roots by status and age.
CREATE INDEX conveyor_jobs_prunable ON conveyor_jobs (status, finished_at)
    WHERE parent_id IS NULL AND finished_at IS NOT NULL;
