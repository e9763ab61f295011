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
WHERE tenant IS NOT NULL AND left(id, length(tenant) + 1) <> tenant || '/';
CREATE UNIQUE INDEX conveyor_tenant_id_moves_old ON conveyor_tenant_id_moves (old);

UPDATE conveyor_jobs AS j SET parent_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE j.parent_id = m.old;
UPDATE conveyor_jobs AS j SET root_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE j.root_id = m.old;
UPDATE conveyor_jobs AS j SET retry_of = m.new FROM conveyor_tenant_id_moves AS m
WHERE j.retry_of = m.old;
UPDATE conveyor_jobs AS j SET depends_on = ARRAY(
    SELECT coalesce(m.new, d.id)
    FROM unnest(j.depends_on) WITH ORDINALITY AS d (id, n)
    LEFT JOIN conveyor_tenant_id_moves AS m ON m.old = d.id
    ORDER BY d.n
)
WHERE j.depends_on && ARRAY(SELECT old FROM conveyor_tenant_id_moves);
UPDATE conveyor_dependencies AS d SET job_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE d.job_id = m.old;
UPDATE conveyor_dependencies AS d SET depends_on_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE d.depends_on_id = m.old;
UPDATE conveyor_attempts AS a SET job_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE a.job_id = m.old;
UPDATE conveyor_jobs AS j SET retried_by = m.new FROM conveyor_tenant_id_moves AS m
WHERE j.retried_by = m.old;
UPDATE conveyor_job_counts AS c SET job_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE c.job_id = m.old;
UPDATE conveyor_callbacks AS c SET job_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE c.job_id = m.old;
UPDATE conveyor_job_events AS e SET job_id = m.new FROM conveyor_tenant_id_moves AS m
WHERE e.job_id = m.old;
UPDATE conveyor_jobs AS j SET id = m.new FROM conveyor_tenant_id_moves AS m
WHERE j.id = m.old;
DROP TABLE conveyor_tenant_id_moves;

-- A unique key is held per tenant: another tenant's active job with the same key neither
-- blocks a submit nor is returned for it. (unique_key first: look-ups are by key.)
DROP INDEX conveyor_jobs_unique_key;
CREATE UNIQUE INDEX conveyor_jobs_unique_key ON conveyor_jobs (unique_key, (coalesce(tenant, '')))
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'queued', 'running', 'waiting');

-- Fair claiming across tenants reads each tenant's queued jobs in claim order, and the
-- tenants that have queued jobs (a loose scan). Jobs without a tenant are not in it, so
-- an application without tenants writes no entry.
CREATE INDEX conveyor_jobs_tenant_claim ON conveyor_jobs (tenant, queue, priority, run_at, id)
    WHERE status = 'queued' AND tenant IS NOT NULL;
