-- Bulk jobs (trees): who submitted each job, the manual-retry chain, the counts of the
-- jobs below each parent kept as they change, completion callbacks and job events.
--
-- retry_count: manual retries before this job (its retry_of is the chain's first job);
-- retried_by: the manual retry that took this job's place (it no longer counts in its
-- parents' counts, and is not retried twice).
ALTER TABLE conveyor_jobs ADD COLUMN retry_count integer NOT NULL DEFAULT 0;
ALTER TABLE conveyor_jobs ADD COLUMN retried_by text;
ALTER TABLE conveyor_jobs ADD COLUMN submitted_by text NOT NULL DEFAULT 'local';

-- Per parent, the jobs below it (every level) by status; queued and running share
-- "active", and the running ones are counted on read (a few rows, on the index below).
-- A row exists only for a job that has had children: a job without a parent costs none.
-- Its own table, narrow and updated in place, so that the settles of a big fan-out do
-- not rewrite the parent's wide row of conveyor_jobs.
CREATE TABLE conveyor_job_counts (
    job_id text PRIMARY KEY,
    pending integer NOT NULL DEFAULT 0,
    active integer NOT NULL DEFAULT 0,
    waiting integer NOT NULL DEFAULT 0,
    succeeded integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    cancelled integer NOT NULL DEFAULT 0
) WITH (fillfactor = 50);

-- The running jobs of a tree (only jobs with a root have entries).
CREATE INDEX conveyor_jobs_running_root ON conveyor_jobs (root_id)
WHERE status = 'running' AND root_id IS NOT NULL;

-- Jobs submitted when a parent's batch ends: kind is 'complete' or 'success'; job is the
-- callback's definition; fired counts how often it was submitted (a re-opened parent
-- that ends again fires again, under a new id).
CREATE TABLE conveyor_callbacks (
    job_id text NOT NULL,
    kind text NOT NULL,
    job json NOT NULL,
    fired integer NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, kind)
);

-- What happened to a job besides its attempts (today: re-opened by a retry below it).
CREATE TABLE conveyor_job_events (
    id bigserial PRIMARY KEY,
    job_id text NOT NULL,
    at timestamptz NOT NULL,
    event text NOT NULL,
    detail text
);
CREATE INDEX conveyor_job_events_job ON conveyor_job_events (job_id, id);

-- The counts of the trees already stored, live ones included.
WITH RECURSIVE up (ancestor, status) AS (
    SELECT parent_id, status FROM conveyor_jobs WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT j.parent_id, up.status FROM up JOIN conveyor_jobs j ON j.id = up.ancestor
    WHERE j.parent_id IS NOT NULL
)
INSERT INTO conveyor_job_counts (job_id, pending, active, waiting, succeeded, failed, cancelled)
SELECT ancestor,
       count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status IN ('queued', 'running')),
       count(*) FILTER (WHERE status = 'waiting'),
       count(*) FILTER (WHERE status = 'succeeded'),
       count(*) FILTER (WHERE status = 'failed'),
       count(*) FILTER (WHERE status = 'cancelled')
FROM up
GROUP BY ancestor;
