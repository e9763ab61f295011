-- The jobs, their attempts, the workers and the queues.
CREATE TABLE conveyor_jobs (
    id                TEXT PRIMARY KEY,
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
    cancel_requested  INTEGER NOT NULL DEFAULT 0
);

-- Claims read only queued rows, in claim order.
CREATE INDEX conveyor_jobs_claim ON conveyor_jobs (queue, priority, run_at, id)
    WHERE status = 'queued';

-- The rescuer reads only running rows, by lease expiry.
CREATE INDEX conveyor_jobs_leases ON conveyor_jobs (lease_expires_at)
    WHERE status = 'running';

-- While a job with a unique key is active, no other job may take that key.
CREATE UNIQUE INDEX conveyor_jobs_unique_key ON conveyor_jobs (unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'queued', 'running', 'waiting');

CREATE INDEX conveyor_jobs_parent ON conveyor_jobs (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX conveyor_jobs_root ON conveyor_jobs (root_id) WHERE root_id IS NOT NULL;
CREATE INDEX conveyor_jobs_finished ON conveyor_jobs (status, finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX conveyor_jobs_type_status ON conveyor_jobs (type, status);

CREATE TABLE conveyor_attempts (
    job_id       TEXT NOT NULL,
    number       INTEGER NOT NULL,
    worker_id    TEXT,
    started_at   REAL,
    finished_at  REAL,
    outcome      TEXT NOT NULL,
    error        TEXT,
    traceback    TEXT,
    PRIMARY KEY (job_id, number)
);

CREATE TABLE conveyor_workers (
    id            TEXT PRIMARY KEY,
    hostname      TEXT NOT NULL,
    pid           INTEGER NOT NULL,
    queues        TEXT NOT NULL,
    concurrency   INTEGER NOT NULL,
    started_at    REAL NOT NULL,
    heartbeat_at  REAL NOT NULL,
    stopped_at    REAL
);

CREATE TABLE conveyor_queues (
    name       TEXT PRIMARY KEY,
    paused     INTEGER NOT NULL DEFAULT 0,
    paused_at  REAL
);
