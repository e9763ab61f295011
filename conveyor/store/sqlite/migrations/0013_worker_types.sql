-- Rolling deploys: a worker claims only the job types it has handlers for, so a type
-- submitted by new code waits, its attempts unspent, for a worker that knows it. Workers
-- record their types as a JSON array (NULL: a worker from before this migration, which
-- claims any type), so that status and the dashboard can name the types no live worker
-- serves.
ALTER TABLE conveyor_workers ADD COLUMN types TEXT;

-- Worker registry hygiene: a worker silent for longer than its own forget window (stopped
-- or dead) is deleted by a maintenance duty; its history stays in conveyor_attempts.
-- Health counts only the deaths inside that window. Workers registered before this
-- migration are forgotten after an hour.
ALTER TABLE conveyor_workers ADD COLUMN forget_seconds REAL NOT NULL DEFAULT 3600;

-- A claim reads each (queue, type) it serves as one range of this index, in claim order:
-- a worker whose types are a small share of the backlog reads only its own jobs.
DROP INDEX conveyor_jobs_claim;
CREATE INDEX conveyor_jobs_claim ON conveyor_jobs (queue, type, priority, run_at, id)
    WHERE status = 'queued';
