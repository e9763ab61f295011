-- Bulk jobs (trees): who submitted each job, the manual-retry chain, the counts of the
-- jobs below each parent kept as they change, completion callbacks and job events.
--
-- retry_count: manual retries before this job (its retry_of is the chain's first job);
-- retried_by: the manual retry that took this job's place (it no longer counts in its
-- parents' counts, and is not retried twice).
ALTER TABLE conveyor_jobs ADD COLUMN retry_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conveyor_jobs ADD COLUMN retried_by TEXT;
ALTER TABLE conveyor_jobs ADD COLUMN submitted_by TEXT NOT NULL DEFAULT 'local';

-- Per parent, the jobs below it (every level) by status; queued and running share
-- "active", and the running ones are counted on read (a few rows, on the index below).
-- A row exists only for a job that has had children: a job without a parent costs none.
CREATE TABLE conveyor_job_counts (
    job_id TEXT PRIMARY KEY,
    pending INTEGER NOT NULL DEFAULT 0,
    active INTEGER NOT NULL DEFAULT 0,
    waiting INTEGER NOT NULL DEFAULT 0,
    succeeded INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    cancelled INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- The running jobs of a tree (only jobs with a root have entries).
CREATE INDEX conveyor_jobs_running_root ON conveyor_jobs (root_id)
WHERE status = 'running' AND root_id IS NOT NULL;

-- Jobs submitted when a parent's batch ends: kind is 'complete' or 'success'; job is the
-- callback's definition (JSON); fired counts how often it was submitted (a re-opened
-- parent that ends again fires again, under a new id).
CREATE TABLE conveyor_callbacks (
    job_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    job TEXT NOT NULL,
    fired INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, kind)
) WITHOUT ROWID;

-- What happened to a job besides its attempts (today: re-opened by a retry below it).
CREATE TABLE conveyor_job_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    at REAL NOT NULL,
    event TEXT NOT NULL,
    detail TEXT
);
CREATE INDEX conveyor_job_events_job ON conveyor_job_events (job_id, id);

-- The counts of the trees already stored, live ones included.
WITH RECURSIVE up (ancestor, status) AS (
    SELECT parent_id, status FROM conveyor_jobs WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT j.parent_id, up.status FROM up JOIN conveyor_jobs AS j ON j.id = up.ancestor
    WHERE j.parent_id IS NOT NULL
)
INSERT INTO conveyor_job_counts (job_id, pending, active, waiting, succeeded, failed, cancelled)
SELECT ancestor,
       sum(status = 'pending'), sum(status IN ('queued', 'running')), sum(status = 'waiting'),
       sum(status = 'succeeded'), sum(status = 'failed'), sum(status = 'cancelled')
FROM up
WHERE true
GROUP BY ancestor;
