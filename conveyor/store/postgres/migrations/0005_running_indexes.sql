-- Indexes of running jobs are partial on "lease_expires_at IS NOT NULL" (true exactly
-- while a job is running: a claim sets the lease, every settle clears it) rather than on
-- "status = 'running'". A fenced write names one job by id and says status = 'running';
-- an index partial on that status would match it too, and when the statistics say few
-- jobs run (they do after a bulk load, until the next ANALYZE) the planner prefers
-- scanning that small-looking index, dead entries and all, to the primary key: a settle
-- then took seconds. The rescuer and the flow-control counts, which compare
-- lease_expires_at, still use these indexes.
DROP INDEX conveyor_jobs_leases;
CREATE INDEX conveyor_jobs_leases ON conveyor_jobs (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

DROP INDEX conveyor_jobs_running_type;
CREATE INDEX conveyor_jobs_running_type ON conveyor_jobs (type, lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;

DROP INDEX conveyor_jobs_running_key;
CREATE INDEX conveyor_jobs_running_key ON conveyor_jobs (type, concurrency_key)
    WHERE lease_expires_at IS NOT NULL AND concurrency_key IS NOT NULL;

-- Jobs churn through queued and running: vacuum and analyze the table after 2% of its
-- rows changed, not the default 20%, so that dead index entries and statistics stay
-- close to the truth on a large table.
ALTER TABLE conveyor_jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
