-- Every claim and every settle changes a job's status, so each writes a new entry into
-- every index of conveyor_jobs that the row belongs to. Two indexes no query used:
-- (type, status), which the optional-filter queries cannot use, and (status,
-- finished_at), which pruning does not use (it reads conveyor_jobs_prunable, the same
-- columns for root jobs only). Dropping them takes two index writes off each claim and
-- settle.
DROP INDEX IF EXISTS conveyor_jobs_type_status;
DROP INDEX IF EXISTS conveyor_jobs_finished;
