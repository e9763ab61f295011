-- Cron schedules: a job template and the next tick, advanced by compare-and-set.
CREATE TABLE conveyor_schedules (
    name            text PRIMARY KEY,
    cron            text NOT NULL,
    timezone        text NOT NULL,
    type            text NOT NULL,
    payload         json NOT NULL,
    queue           text NOT NULL,
    priority        integer NOT NULL,
    max_attempts    integer NOT NULL,
    timeout         double precision,
    lease_seconds   double precision,
    backoff_base    double precision NOT NULL,
    backoff_cap     double precision NOT NULL,
    catch_up        text NOT NULL,
    backfill_limit  integer NOT NULL,
    grace           double precision,
    enabled         boolean NOT NULL DEFAULT true,
    next_run_at     timestamptz NOT NULL,
    last_run_at     timestamptz,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL
);

-- Named leases: the current holder; the row stays after release so tokens keep growing.
CREATE TABLE conveyor_leases (
    name         text PRIMARY KEY,
    owner        text,
    token        bigint NOT NULL,
    acquired_at  timestamptz,
    expires_at   timestamptz
);

-- The last holders of each named lease, for inspection.
CREATE TABLE conveyor_lease_history (
    name         text NOT NULL,
    token        bigint NOT NULL,
    owner        text NOT NULL,
    acquired_at  timestamptz NOT NULL,
    ended_at     timestamptz NOT NULL,
    ended        text NOT NULL,
    PRIMARY KEY (name, token)
);

-- Starts of rate-limited job types inside the current window (a sliding-window log).
CREATE TABLE conveyor_rate_window (
    type  text NOT NULL,
    at    timestamptz NOT NULL
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
