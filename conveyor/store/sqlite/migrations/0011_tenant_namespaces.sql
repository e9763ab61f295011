-- Tenant namespaces: a job's identity is its tenant and its id. A tenant's job is stored
-- under the id 'tenant/id' (a tenant name and a job id never hold '/'), so two tenants may
-- use the same id, and the jobs they name are two rows (conveyor/core/ids.py).
--
-- Jobs stored before this migration under their bare id move to their qualified id, with
-- every reference to them: parents, roots, retries, dependencies, attempts, tree counts,
-- completion callbacks and job events. A job
-- running meanwhile loses its lease (its worker's heartbeat no longer finds it) and is
-- rescued and run again, as after a crash: stop the workers to migrate.
CREATE TABLE conveyor_tenant_id_moves AS
SELECT id AS old, tenant || '/' || id AS new FROM conveyor_jobs
WHERE tenant IS NOT NULL AND substr(id, 1, length(tenant) + 1) <> tenant || '/';
CREATE UNIQUE INDEX conveyor_tenant_id_moves_old ON conveyor_tenant_id_moves (old);

UPDATE conveyor_jobs SET parent_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = parent_id)
WHERE parent_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_jobs SET root_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = root_id)
WHERE root_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_jobs SET retry_of = (SELECT new FROM conveyor_tenant_id_moves WHERE old = retry_of)
WHERE retry_of IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_jobs SET depends_on = (
    SELECT json_group_array(coalesce(m.new, d.value))
    FROM (SELECT key, value FROM json_each(conveyor_jobs.depends_on) ORDER BY key) AS d
    LEFT JOIN conveyor_tenant_id_moves AS m ON m.old = d.value
)
WHERE depends_on IS NOT NULL
  AND EXISTS (SELECT 1 FROM json_each(conveyor_jobs.depends_on) AS d
              JOIN conveyor_tenant_id_moves AS m ON m.old = d.value);
UPDATE conveyor_dependencies SET job_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = job_id)
WHERE job_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_dependencies
SET depends_on_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = depends_on_id)
WHERE depends_on_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_attempts SET job_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = job_id)
WHERE job_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_jobs SET retried_by = (SELECT new FROM conveyor_tenant_id_moves WHERE old = retried_by)
WHERE retried_by IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_job_counts SET job_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = job_id)
WHERE job_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_callbacks SET job_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = job_id)
WHERE job_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_job_events SET job_id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = job_id)
WHERE job_id IN (SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_jobs SET id = (SELECT new FROM conveyor_tenant_id_moves WHERE old = id)
WHERE id IN (SELECT old FROM conveyor_tenant_id_moves);
DROP TABLE conveyor_tenant_id_moves;

-- A unique key is held per tenant: another tenant's active job with the same key neither
-- blocks a submit nor is returned for it. (unique_key first: look-ups are by key.)
DROP INDEX conveyor_jobs_unique_key;
CREATE UNIQUE INDEX conveyor_jobs_unique_key ON conveyor_jobs (unique_key, coalesce(tenant, ''))
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'queued', 'running', 'waiting');

-- Fair claiming across tenants reads each tenant's queued jobs in claim order, and the
-- tenants that have queued jobs (a loose scan). Jobs without a tenant are not in it, so
-- an application without tenants writes no entry.
CREATE INDEX conveyor_jobs_tenant_claim ON conveyor_jobs (tenant, queue, priority, run_at, id)
    WHERE status = 'queued' AND tenant IS NOT NULL;
