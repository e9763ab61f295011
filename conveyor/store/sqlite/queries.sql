-- Named queries of the SQLite backend. Times are seconds since the epoch (REAL),
-- passed in as :now by the store, whose clock is injectable for tests.

-- name: next_created_us
-- The first creation microsecond free for new jobs: their submit's, or the one after the
-- last job's (a job's creation microsecond is the table's key, each job's own).
SELECT max(:now_us, coalesce((SELECT max(created_us) FROM conveyor_jobs), 0) + 1) AS first_us;

-- name: insert_job
-- Insert a new job; an existing id or an active unique key makes this a no-op.
INSERT INTO conveyor_jobs (
    id, type, queue, tenant, payload, status, priority, max_attempts, run_at, timeout,
    lease_seconds, backoff_base, backoff_cap, state, parent_id, root_id, depends_on,
    unique_key, concurrency_key, retry_of, trace_context, retry_count, submitted_by,
    created_us, created_at
) VALUES (
    :id, :type, :queue, :tenant, :payload, :status, :priority, :max_attempts, :run_at,
    :timeout, :lease_seconds, :backoff_base, :backoff_cap, :state, :parent_id, :root_id,
    :depends_on, :unique_key, :concurrency_key, :retry_of, :trace_context, :retry_count,
    :submitted_by, :created_us, :created_us / 1000000.0
)
ON CONFLICT DO NOTHING
RETURNING *;

-- name: insert_jobs
-- Insert many new jobs in one statement, in array order; an existing id or an active
-- unique key makes that row a no-op. :jobs is a JSON array of insert_job's parameters.
INSERT INTO conveyor_jobs (
    id, type, queue, tenant, payload, status, priority, max_attempts, run_at, timeout,
    lease_seconds, backoff_base, backoff_cap, state, parent_id, root_id, depends_on,
    unique_key, concurrency_key, retry_of, trace_context, retry_count, submitted_by,
    created_us, created_at
)
SELECT
    json_extract(value, '$.id'), json_extract(value, '$.type'), json_extract(value, '$.queue'),
    json_extract(value, '$.tenant'), json_extract(value, '$.payload'),
    json_extract(value, '$.status'), json_extract(value, '$.priority'),
    json_extract(value, '$.max_attempts'), json_extract(value, '$.run_at'),
    json_extract(value, '$.timeout'), json_extract(value, '$.lease_seconds'),
    json_extract(value, '$.backoff_base'), json_extract(value, '$.backoff_cap'),
    json_extract(value, '$.state'), json_extract(value, '$.parent_id'),
    json_extract(value, '$.root_id'), json_extract(value, '$.depends_on'),
    json_extract(value, '$.unique_key'), json_extract(value, '$.concurrency_key'),
    json_extract(value, '$.retry_of'), json_extract(value, '$.trace_context'),
    json_extract(value, '$.retry_count'), json_extract(value, '$.submitted_by'),
    json_extract(value, '$.created_us'), json_extract(value, '$.created_us') / 1000000.0
FROM json_each(:jobs)
WHERE true  -- without a WHERE, SQLite would read ON CONFLICT as a join's ON
ORDER BY key
ON CONFLICT DO NOTHING
RETURNING id, status, run_at, created_at;

-- name: get
-- One job by id.
SELECT * FROM conveyor_jobs WHERE id = :id;

-- name: get_active_by_unique_key
-- The active job holding a unique key in a tenant (keys are held per tenant).
SELECT * FROM conveyor_jobs
WHERE unique_key = :unique_key AND coalesce(tenant, '') = coalesce(:tenant, '')
  AND status IN ('pending', 'queued', 'running', 'waiting');

-- name: attempts
-- A job's attempts, oldest first.
SELECT * FROM conveyor_attempts WHERE job_id = :job_id ORDER BY number;

-- name: claim
-- Lease up to :limit due jobs of the worker's types from unpaused queues, in claim order:
-- priority, run_at, id. Each (queue, type) the worker serves is one range of
-- conveyor_jobs_claim (queue, type, priority, run_at, id), read in claim order and
-- stopped after :limit due jobs; the first :limit of those are leased. The cost stays
-- flat with a deep backlog, and with the backlogs of types the worker lacks.
UPDATE conveyor_jobs
SET status = 'running',
    attempt = attempt + 1,
    lease_token = lease_token + 1,
    lease_owner = :worker_id,
    lease_expires_at = :now + coalesce(lease_seconds, :lease),
    started_at = :now,
    cancel_requested = 0
WHERE id IN (
    SELECT j.id
    FROM json_each(:queues) AS q
    CROSS JOIN json_each(:types) AS t
    JOIN conveyor_jobs AS j ON j.id IN (
        SELECT c.id FROM conveyor_jobs AS c INDEXED BY conveyor_jobs_claim
        WHERE c.status = 'queued' AND c.queue = q.value AND c.type = t.value
          AND c.run_at <= :now
        ORDER BY c.priority, c.run_at, c.id
        LIMIT :limit
    )
    WHERE q.value NOT IN (SELECT name FROM conveyor_queues WHERE paused = 1)
    ORDER BY j.priority, j.run_at, j.id
    LIMIT :limit
)
RETURNING *;

-- name: queued_types
-- The types with queued jobs in the given queues, for a claim that names no types (tests
-- and tools; a worker names its own): a loose scan of conveyor_jobs_claim, one seek per
-- (queue, type) however many jobs each has queued.
WITH RECURSIVE t (queue, type) AS (
    SELECT q.value, (SELECT min(type) FROM conveyor_jobs INDEXED BY conveyor_jobs_claim
                     WHERE status = 'queued' AND queue = q.value)
    FROM json_each(:queues) AS q
    UNION ALL
    SELECT t.queue, (SELECT min(j.type) FROM conveyor_jobs AS j INDEXED BY conveyor_jobs_claim
                     WHERE j.status = 'queued' AND j.queue = t.queue AND j.type > t.type)
    FROM t WHERE t.type IS NOT NULL
)
SELECT DISTINCT type FROM t WHERE type IS NOT NULL;

-- name: renew_leases
-- Extend every lease a worker still holds (id and token in :leases, a JSON array of pairs).
UPDATE conveyor_jobs
SET lease_expires_at = :now + coalesce(lease_seconds, :lease)
WHERE (id, lease_token) IN (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(:leases)
)
  AND status = 'running'
RETURNING id, cancel_requested;

-- name: write_progress
-- Store a running job's latest progress, fenced by its lease. Against the same total,
-- progress never moves backwards, so a retry resuming from an older checkpoint does not
-- make readers see the bar shrink.
UPDATE conveyor_jobs
SET progress_done = CASE WHEN progress_total IS :total AND progress_done > :done
                         THEN progress_done ELSE :done END,
    progress_total = :total,
    progress_message = :message
WHERE id = :id AND lease_token = :token AND status = 'running';

-- name: touch_worker
-- Record that a worker is alive.
UPDATE conveyor_workers SET heartbeat_at = :now WHERE id = :worker_id;

-- name: settle
-- End a batch of attempts in one statement, each fenced by its lease: the row must still
-- be running under the token. :batch is a JSON array of [id, token, status, result,
-- result_ref, error, retry_delay, refund, progress_done, progress_total,
-- progress_message]; the rows returned are the attempts ended, the others were refused.
-- A job whose cancel was asked for is never queued again (a retry, a hand-back or the
-- rescue of a dead worker's run): it ends cancelled, with the reason the request stored.
UPDATE conveyor_jobs AS j
SET status = CASE WHEN e.status = 'queued' AND j.cancel_requested THEN 'cancelled'
                  ELSE e.status END,
    result = e.result,
    result_ref = coalesce(e.result_ref, j.result_ref),
    -- A cancelled job keeps the reason its cancel request stored.
    error = CASE WHEN e.status IN ('queued', 'cancelled', 'waiting') AND j.cancel_requested
                      THEN coalesce(j.error, e.error)
                 WHEN e.status = 'cancelled' THEN coalesce(e.error, j.error)
                 ELSE e.error END,
    run_at = CASE WHEN e.status = 'queued' THEN :now + e.retry_delay ELSE j.run_at END,
    finished_at = CASE WHEN e.status IN ('succeeded', 'failed', 'cancelled')
                         OR (e.status = 'queued' AND j.cancel_requested) THEN :now END,
    attempt = j.attempt - e.refund,
    progress_done = CASE WHEN e.progress_done IS NULL THEN j.progress_done
                         WHEN j.progress_total IS e.progress_total
                              AND j.progress_done > e.progress_done
                         THEN j.progress_done
                         ELSE e.progress_done END,
    progress_total = CASE WHEN e.progress_done IS NULL THEN j.progress_total
                          ELSE e.progress_total END,
    progress_message = CASE WHEN e.progress_done IS NULL THEN j.progress_message
                            ELSE e.progress_message END,
    lease_expires_at = NULL
FROM (
    SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
           json_extract(value, '$[2]') AS status, json_extract(value, '$[3]') AS result,
           json_extract(value, '$[4]') AS result_ref, json_extract(value, '$[5]') AS error,
           json_extract(value, '$[6]') AS retry_delay, json_extract(value, '$[7]') AS refund,
           json_extract(value, '$[8]') AS progress_done,
           json_extract(value, '$[9]') AS progress_total,
           json_extract(value, '$[10]') AS progress_message
    FROM json_each(:batch)
) AS e
WHERE j.id = e.id AND j.lease_token = e.token AND j.status = 'running'
RETURNING id, attempt, lease_owner, started_at, parent_id, status;

-- name: settle_succeeded
-- The settle of attempts that plainly succeeded (no error, result reference or progress
-- to store), the most common batch: what the settle above does for them, with two
-- fewer JSON fields to pull out per job and no CASE to decide. :batch is a JSON array of
-- [id, token, result].
UPDATE conveyor_jobs AS j
SET status = 'succeeded',
    result = e.result,
    error = NULL,
    finished_at = :now,
    lease_expires_at = NULL
FROM (
    SELECT json_extract(value, '$[0]') AS id, json_extract(value, '$[1]') AS token,
           json_extract(value, '$[2]') AS result
    FROM json_each(:batch)
) AS e
WHERE j.id = e.id AND j.lease_token = e.token AND j.status = 'running'
RETURNING id, attempt, lease_owner, started_at, parent_id, status;

-- name: parents_among
-- Which of the given jobs have children (those have a row of counts).
SELECT job_id FROM conveyor_job_counts WHERE job_id IN (SELECT value FROM json_each(:ids));

-- name: awaited
-- Which of the given jobs pending jobs depend on.
SELECT DISTINCT d.depends_on_id AS id
FROM conveyor_dependencies AS d JOIN conveyor_jobs AS j ON j.id = d.job_id
WHERE d.depends_on_id IN (SELECT value FROM json_each(:ids)) AND j.status = 'pending';

-- name: insert_attempt
-- Keep the record of one ended attempt.
INSERT OR REPLACE INTO conveyor_attempts (
    job_id, number, worker_id, started_at, finished_at, outcome, error, traceback
) VALUES (?, ?, ?, ?, ?, ?, ?, ?);

-- name: checkpoint
-- Store a running job's state, fenced by its lease.
UPDATE conveyor_jobs SET state = :state
WHERE id = :id AND lease_token = :token AND status = 'running';

-- name: rescue
-- Running jobs whose lease has expired, oldest expiry first.
SELECT id, lease_token, attempt, max_attempts, backoff_base, backoff_cap, lease_owner,
       cancel_requested
FROM conveyor_jobs
WHERE status = 'running' AND lease_expires_at < :now
ORDER BY lease_expires_at
LIMIT :limit;

-- name: cancel_unstarted
-- Cancel a job that has not started yet.
UPDATE conveyor_jobs
SET status = 'cancelled', error = :reason, finished_at = :now
WHERE id = :id AND status IN ('pending', 'queued')
RETURNING *;

-- name: request_cancel
-- Ask the worker running a job to stop it, or a waiting parent to end cancelled.
UPDATE conveyor_jobs SET cancel_requested = 1, error = :reason
WHERE id = :id AND status IN ('running', 'waiting')
RETURNING *;

-- name: register_worker
-- Record a worker process as started, with the job types it serves.
INSERT OR REPLACE INTO conveyor_workers (
    id, hostname, pid, queues, concurrency, started_at, heartbeat_at, stopped_at,
    lease_seconds, heartbeat_seconds, types, forget_seconds
) VALUES (
    :id, :hostname, :pid, :queues, :concurrency, :now, :now, NULL,
    :lease_seconds, :heartbeat_seconds, :types, :forget_seconds
);

-- name: deregister_worker
-- Record a worker process as stopped.
UPDATE conveyor_workers SET stopped_at = :now WHERE id = :worker_id;

-- name: workers
-- Workers, live ones first, newest heartbeat first.
SELECT * FROM conveyor_workers
ORDER BY stopped_at IS NOT NULL, heartbeat_at DESC
LIMIT 200;

-- name: forget_workers
-- Delete workers silent for longer than their own forget window, dead or stopped (their
-- attempts keep their history), at most :limit.
DELETE FROM conveyor_workers
WHERE id IN (
    SELECT id FROM conveyor_workers WHERE heartbeat_at < :now - forget_seconds LIMIT :limit
)
RETURNING id;

-- name: unserved_types
-- Queued jobs per type that no live worker serves: no worker heartbeating within its
-- lease has the job's queue among its queues and its type among its types (NULL types:
-- a worker from before they were recorded, which claims any type). The queued jobs are
-- counted per (queue, type) on conveyor_jobs_claim alone, without the table.
SELECT c.type, sum(c.n) AS n
FROM (SELECT queue, type, count(*) AS n FROM conveyor_jobs INDEXED BY conveyor_jobs_claim
      WHERE status = 'queued' GROUP BY queue, type) AS c
WHERE NOT EXISTS (
    SELECT 1 FROM conveyor_workers AS w
    WHERE w.stopped_at IS NULL AND w.heartbeat_at >= :now - w.lease_seconds
      AND c.queue IN (SELECT value FROM json_each(w.queues))
      AND (w.types IS NULL OR c.type IN (SELECT value FROM json_each(w.types)))
)
GROUP BY c.type
ORDER BY c.type;

-- name: queues
-- Every queue that has jobs or a pause record, with its number of jobs per status.
SELECT c.queue AS name, coalesce(q.paused, 0) AS paused, c.status, c.n
FROM (SELECT queue, status, count(*) AS n FROM conveyor_jobs GROUP BY queue, status) AS c
LEFT JOIN conveyor_queues AS q ON q.name = c.queue
UNION ALL
SELECT q.name, q.paused, NULL, NULL FROM conveyor_queues AS q
WHERE NOT EXISTS (SELECT 1 FROM conveyor_jobs AS j WHERE j.queue = q.name);

-- name: tenant_queues
-- The queues one tenant has jobs in, with its number of jobs per status, and every queue
-- with a pause record (on conveyor_jobs_tenant_created: the tenant's rows only).
SELECT c.queue AS name, coalesce(q.paused, 0) AS paused, c.status, c.n
FROM (SELECT queue, status, count(*) AS n FROM conveyor_jobs WHERE tenant = :tenant
      GROUP BY queue, status) AS c
LEFT JOIN conveyor_queues AS q ON q.name = c.queue
UNION ALL
SELECT q.name, q.paused, NULL, NULL FROM conveyor_queues AS q
WHERE NOT EXISTS (SELECT 1 FROM conveyor_jobs AS j WHERE j.tenant = :tenant AND j.queue = q.name);

-- name: set_paused
-- Pause or resume claiming from a queue.
INSERT INTO conveyor_queues (name, paused, paused_at) VALUES (:name, :paused, :now)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, paused_at = excluded.paused_at;

-- name: get_many
-- Jobs by id.
SELECT * FROM conveyor_jobs WHERE id IN (SELECT value FROM json_each(:ids));

-- name: insert_dependencies
-- Record that a job waits for others (:ids, a JSON array).
INSERT OR IGNORE INTO conveyor_dependencies (job_id, depends_on_id)
SELECT :job_id, value FROM json_each(:ids);

-- name: lock_counts
-- The counts of the jobs below these parents (BEGIN IMMEDIATE holds the write lock).
SELECT * FROM conveyor_job_counts WHERE job_id IN (SELECT value FROM json_each(:ids));

-- name: count_moves
-- Carry jobs' moves between statuses to the counts of every parent above them, in one
-- statement. :moves is a JSON array of {parent, src, dst, n}: n jobs whose parent is
-- `parent` left counter `src` (NULL: they are new) for `dst` (NULL: a retry took their
-- place). The walk up stops above a job a retry took the place of. Returns the rows as
-- they are now, locked until the transaction ends.
WITH RECURSIVE
moved (parent, src, dst, n) AS (
    SELECT json_extract(value, '$.parent'), json_extract(value, '$.src'),
           json_extract(value, '$.dst'), json_extract(value, '$.n')
    FROM json_each(:moves)
),
up (ancestor, src, dst, n) AS (
    SELECT parent, src, dst, n FROM moved
    UNION ALL
    SELECT j.parent_id, up.src, up.dst, up.n FROM up JOIN conveyor_jobs AS j ON j.id = up.ancestor
    WHERE j.parent_id IS NOT NULL AND j.retried_by IS NULL
)
INSERT INTO conveyor_job_counts (job_id, pending, active, waiting, succeeded, failed, cancelled)
SELECT ancestor,
       sum(CASE WHEN dst = 'pending' THEN n ELSE 0 END - CASE WHEN src = 'pending' THEN n ELSE 0 END),
       sum(CASE WHEN dst = 'active' THEN n ELSE 0 END - CASE WHEN src = 'active' THEN n ELSE 0 END),
       sum(CASE WHEN dst = 'waiting' THEN n ELSE 0 END - CASE WHEN src = 'waiting' THEN n ELSE 0 END),
       sum(CASE WHEN dst = 'succeeded' THEN n ELSE 0 END
           - CASE WHEN src = 'succeeded' THEN n ELSE 0 END),
       sum(CASE WHEN dst = 'failed' THEN n ELSE 0 END - CASE WHEN src = 'failed' THEN n ELSE 0 END),
       sum(CASE WHEN dst = 'cancelled' THEN n ELSE 0 END
           - CASE WHEN src = 'cancelled' THEN n ELSE 0 END)
FROM up
WHERE true
GROUP BY ancestor
ORDER BY ancestor
ON CONFLICT (job_id) DO UPDATE SET
    pending = pending + excluded.pending, active = active + excluded.active,
    waiting = waiting + excluded.waiting, succeeded = succeeded + excluded.succeeded,
    failed = failed + excluded.failed, cancelled = cancelled + excluded.cancelled
RETURNING *;

-- name: lock_job
-- One job, to change it (BEGIN IMMEDIATE already holds the write lock).
SELECT * FROM conveyor_jobs WHERE id = :id;

-- name: mark_retried
-- Record the manual retry that takes a failed or cancelled job's place (once only).
UPDATE conveyor_jobs SET retried_by = :by
WHERE id = :id AND status IN ('failed', 'cancelled') AND retried_by IS NULL
RETURNING id;

-- name: reopen
-- Move a parent that failed back to waiting: a job below it was retried by hand (a
-- cancel asked of it while it ran is spent: it is decided from its children again).
UPDATE conveyor_jobs
SET status = 'waiting', error = NULL, finished_at = NULL, cancel_requested = 0
WHERE id = :id AND status = 'failed'
RETURNING id, parent_id;

-- name: record_event
-- Add an event to a job's history.
INSERT INTO conveyor_job_events (job_id, at, event, detail) VALUES (:job_id, :now, :event, :detail);

-- name: job_events
-- A job's events, oldest first.
SELECT * FROM conveyor_job_events WHERE job_id = :id ORDER BY id;

-- name: note_retry_limit
-- Say on a failed or cancelled job that it may not be retried again.
UPDATE conveyor_jobs SET error = :error
WHERE id = :id AND status IN ('failed', 'cancelled')
RETURNING *;

-- name: upsert_callback
-- Keep (or replace) a parent's callback of one kind.
INSERT INTO conveyor_callbacks (job_id, kind, job) VALUES (:job_id, :kind, :job)
ON CONFLICT (job_id, kind) DO UPDATE SET job = excluded.job;

-- name: fire_callbacks
-- Count one more firing of a parent's callbacks of the given kinds; return them.
UPDATE conveyor_callbacks SET fired = fired + 1
WHERE job_id = :job_id AND kind IN (SELECT value FROM json_each(:kinds))
RETURNING kind, job, fired;

-- name: failed_below
-- Failed jobs below a job, not retried yet, with no failed or cancelled job below them
-- (the failures a retry fixes, not the parents that failed because of them).
WITH RECURSIVE below (id) AS (
    SELECT id FROM conveyor_jobs WHERE parent_id = :id
    UNION ALL
    SELECT j.id FROM conveyor_jobs AS j JOIN below AS b ON j.parent_id = b.id
)
SELECT j.id FROM conveyor_jobs AS j JOIN below AS b ON j.id = b.id
LEFT JOIN conveyor_job_counts AS c ON c.job_id = j.id
WHERE j.status = 'failed' AND j.retried_by IS NULL
  AND coalesce(c.failed + c.cancelled, 0) = 0
ORDER BY j.id
LIMIT :limit;

-- name: get_with_counts
-- One job by id, with the counts of the jobs below it when it has any. The running ones
-- are counted here, among the few running jobs of its tree, walking up to it; the rest
-- come from conveyor_job_counts. One statement: the figures add up to the total.
WITH RECURSIVE up (id, ancestor) AS (
    SELECT r.id, r.parent_id FROM conveyor_jobs AS r INDEXED BY conveyor_jobs_running_root
    WHERE r.status = 'running'
      AND r.root_id = coalesce((SELECT root_id FROM conveyor_jobs WHERE id = :id), :id)
    UNION ALL
    SELECT up.id, p.parent_id FROM up JOIN conveyor_jobs AS p ON p.id = up.ancestor
    WHERE up.ancestor <> :id AND p.parent_id IS NOT NULL AND p.retried_by IS NULL
)
SELECT j.*, c.pending AS below_pending, c.active AS below_active,
       c.waiting AS below_waiting, c.succeeded AS below_succeeded,
       c.failed AS below_failed, c.cancelled AS below_cancelled,
       CASE WHEN c.job_id IS NULL THEN NULL
            -- A root: its tree's running jobs, on the index. Below a root: those that
            -- have it as an ancestor (each running job walks up to it at most once).
            WHEN j.root_id IS NULL
            THEN (SELECT count(*) FROM conveyor_jobs AS r INDEXED BY conveyor_jobs_running_root
                  WHERE r.status = 'running' AND r.root_id = :id)
            ELSE (SELECT count(*) FROM up WHERE ancestor = :id) END AS below_running
FROM conveyor_jobs AS j LEFT JOIN conveyor_job_counts AS c ON c.job_id = j.id
WHERE j.id = :id;

-- name: prune_counts
-- Delete the counts of the given trees' jobs.
DELETE FROM conveyor_job_counts WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE id IN (SELECT value FROM json_each(:roots))
       OR root_id IN (SELECT value FROM json_each(:roots))
);

-- name: prune_callbacks
-- Delete the callbacks of the given trees' jobs.
DELETE FROM conveyor_callbacks WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE id IN (SELECT value FROM json_each(:roots))
       OR root_id IN (SELECT value FROM json_each(:roots))
);

-- name: prune_events
-- Delete the events of the given trees' jobs.
DELETE FROM conveyor_job_events WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE id IN (SELECT value FROM json_each(:roots))
       OR root_id IN (SELECT value FROM json_each(:roots))
);

-- name: finish_waiting
-- End a waiting parent once its last child has ended (cancelled if a cancel was asked for).
UPDATE conveyor_jobs
SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE :status END,
    error = CASE WHEN cancel_requested THEN error ELSE :error END,
    finished_at = :now
WHERE id = :id AND status = 'waiting'
RETURNING id, parent_id, status;

-- name: pending_dependents
-- Pending jobs that wait for a job.
SELECT j.id FROM conveyor_dependencies AS d JOIN conveyor_jobs AS j ON j.id = d.job_id
WHERE d.depends_on_id = :id AND j.status = 'pending';

-- name: unmet_dependencies
-- How many of a job's dependencies have not succeeded.
SELECT count(*) AS n FROM conveyor_dependencies AS d
JOIN conveyor_jobs AS j ON j.id = d.depends_on_id
WHERE d.job_id = :id AND j.status <> 'succeeded';

-- name: release_pending
-- Queue a pending job whose dependencies all succeeded.
UPDATE conveyor_jobs SET status = 'queued' WHERE id = :id AND status = 'pending'
RETURNING id, parent_id;

-- name: cancel_pending
-- Cancel a pending job whose dependency failed or was cancelled.
UPDATE conveyor_jobs SET status = 'cancelled', error = :reason, finished_at = :now
WHERE id = :id AND status = 'pending'
RETURNING id, parent_id, status;

-- name: unfinished_descendants
-- Every unfinished job below a job in its tree.
WITH RECURSIVE below(id) AS (
    SELECT id FROM conveyor_jobs WHERE parent_id = :id
    UNION ALL
    SELECT j.id FROM conveyor_jobs AS j JOIN below AS b ON j.parent_id = b.id
)
SELECT j.id, j.status FROM conveyor_jobs AS j JOIN below AS b ON j.id = b.id
WHERE j.status IN ('pending', 'queued', 'running', 'waiting');

-- name: lease_holder
-- The root of a job, if the given lease still holds it.
SELECT coalesce(root_id, id) AS root_id FROM conveyor_jobs
WHERE id = :id AND lease_token = :token AND status = 'running';

-- name: waiting_parents
-- Waiting parents with nothing unfinished below them (a safety net for the settle cascade).
SELECT p.id FROM conveyor_jobs AS p JOIN conveyor_job_counts AS c ON c.job_id = p.id
WHERE p.status = 'waiting' AND c.pending + c.active + c.waiting = 0
LIMIT :limit;

-- name: claim_candidates
-- Due jobs of the given types in claim order (types at a limit are left out of :types),
-- leaving out (type, key) pairs that are at a limit; each (queue, type) is one range of
-- conveyor_jobs_claim, read in claim order (see claim).
SELECT j.id, j.type, j.concurrency_key, j.tenant
FROM json_each(:queues) AS q
CROSS JOIN json_each(:types) AS t
JOIN conveyor_jobs AS j ON j.id IN (
    SELECT c.id FROM conveyor_jobs AS c INDEXED BY conveyor_jobs_claim
    WHERE c.status = 'queued' AND c.queue = q.value AND c.type = t.value
      AND c.run_at <= :now
      AND (c.concurrency_key IS NULL
           OR c.type || char(31) || c.concurrency_key
              NOT IN (SELECT value FROM json_each(:blocked_keys)))
      AND c.id NOT IN (SELECT value FROM json_each(:taken))
    ORDER BY c.priority, c.run_at, c.id
    LIMIT :limit
)
WHERE q.value NOT IN (SELECT name FROM conveyor_queues WHERE paused = 1)
ORDER BY j.priority, j.run_at, j.id
LIMIT :limit;

-- name: queued_tenants
-- Fair claiming (store/_fairness.py; its queries run up to claim_ids). The tenants that
-- have queued jobs, by name: a loose scan of conveyor_jobs_tenant_claim, one seek per
-- tenant however many jobs each has queued.
WITH RECURSIVE t (tenant) AS (
    SELECT (SELECT min(tenant) FROM conveyor_jobs INDEXED BY conveyor_jobs_tenant_claim
            WHERE status = 'queued' AND tenant IS NOT NULL)
    UNION ALL
    SELECT (SELECT min(j.tenant) FROM conveyor_jobs AS j INDEXED BY conveyor_jobs_tenant_claim
            WHERE j.status = 'queued' AND j.tenant > t.tenant)
    FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT :limit;

-- name: tenant_candidates
-- Each given tenant's first :limit due jobs of the given types in claim order, per queue
-- (each one a range of conveyor_jobs_tenant_claim, read in order; a tenant's jobs of
-- types the worker lacks are read past).
SELECT j.id, j.type, j.concurrency_key, j.tenant
FROM json_each(:tenants) AS t
CROSS JOIN json_each(:queues) AS q
JOIN conveyor_jobs AS j ON j.id IN (
    SELECT c.id FROM conveyor_jobs AS c INDEXED BY conveyor_jobs_tenant_claim
    WHERE c.status = 'queued' AND c.tenant = t.value AND c.queue = q.value
      AND c.type IN (SELECT value FROM json_each(:types))
      AND c.run_at <= :now
    ORDER BY c.priority, c.run_at, c.id
    LIMIT :limit
)
WHERE q.value NOT IN (SELECT name FROM conveyor_queues WHERE paused = 1)
ORDER BY j.tenant, j.priority, j.run_at, j.id;

-- name: running_per_tenant
-- Running jobs with a live lease, per tenant, among the given tenants.
SELECT tenant, count(*) AS n FROM conveyor_jobs INDEXED BY conveyor_jobs_leases
WHERE status = 'running' AND lease_expires_at > :now
  AND tenant IN (SELECT value FROM json_each(:tenants))
GROUP BY tenant;

-- name: tenant_queued
-- How many jobs a tenant has queued (a range of conveyor_jobs_tenant_claim).
SELECT count(*) AS n FROM conveyor_jobs INDEXED BY conveyor_jobs_tenant_claim
WHERE status = 'queued' AND tenant = :tenant;

-- name: claim_ids
-- Lease the chosen jobs.
UPDATE conveyor_jobs
SET status = 'running',
    attempt = attempt + 1,
    lease_token = lease_token + 1,
    lease_owner = :worker_id,
    lease_expires_at = :now + coalesce(lease_seconds, :lease),
    started_at = :now,
    cancel_requested = 0
WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'queued'
RETURNING *;

-- name: running_per_type
-- Running jobs with a live lease, per type, among the given types.
SELECT type, count(*) AS n FROM conveyor_jobs
WHERE status = 'running' AND lease_expires_at > :now
  AND type IN (SELECT value FROM json_each(:types))
GROUP BY type;

-- name: running_per_key
-- Running jobs with a live lease, per type and concurrency key, among the given types.
SELECT type, concurrency_key, count(*) AS n FROM conveyor_jobs
WHERE status = 'running' AND lease_expires_at > :now AND concurrency_key IS NOT NULL
  AND type IN (SELECT value FROM json_each(:types))
GROUP BY type, concurrency_key;

-- name: forget_rate_window
-- Drop starts that have left a type's rate window.
DELETE FROM conveyor_rate_window WHERE type = :type AND at <= :now - :window;

-- name: rate_window_count
-- Starts of a type inside its rate window.
SELECT count(*) AS n FROM conveyor_rate_window WHERE type = :type AND at > :now - :window;

-- name: lock_limited_types
-- Lock each limited type's claims until the transaction ends; returns the types locked.
-- SQLite: BEGIN IMMEDIATE already serialises every claim, so every type is locked.
SELECT DISTINCT value AS type FROM json_each(:types);

-- name: record_rate_starts
-- Remember the starts of rate-limited types (:types, one entry per start).
INSERT INTO conveyor_rate_window (type, at) SELECT value, :now FROM json_each(:types);

-- name: upsert_schedule
-- Create a schedule or update its definition; a changed cron or timezone restarts its ticks.
INSERT INTO conveyor_schedules (
    name, cron, timezone, type, payload, queue, priority, max_attempts, timeout,
    lease_seconds, backoff_base, backoff_cap, catch_up, backfill_limit, grace, overlap,
    enabled, next_run_at, created_at, updated_at
) VALUES (
    :name, :cron, :timezone, :type, :payload, :queue, :priority, :max_attempts, :timeout,
    :lease_seconds, :backoff_base, :backoff_cap, :catch_up, :backfill_limit, :grace, :overlap,
    1, :next_run_at, :now, :now
)
ON CONFLICT (name) DO UPDATE SET
    next_run_at = CASE WHEN cron <> excluded.cron OR timezone <> excluded.timezone
                       THEN excluded.next_run_at ELSE next_run_at END,
    cron = excluded.cron, timezone = excluded.timezone, type = excluded.type,
    payload = excluded.payload, queue = excluded.queue, priority = excluded.priority,
    max_attempts = excluded.max_attempts, timeout = excluded.timeout,
    lease_seconds = excluded.lease_seconds, backoff_base = excluded.backoff_base,
    backoff_cap = excluded.backoff_cap, catch_up = excluded.catch_up,
    backfill_limit = excluded.backfill_limit, grace = excluded.grace,
    overlap = excluded.overlap, updated_at = excluded.updated_at;

-- name: due_schedules
-- Enabled schedules whose next tick has come, with the time they were read at.
SELECT *, :now AS read_at FROM conveyor_schedules
WHERE enabled = 1 AND next_run_at <= :now
ORDER BY next_run_at
LIMIT :limit;

-- name: advance_schedule
-- Move a schedule to its next tick, only if no other worker did it first.
UPDATE conveyor_schedules SET next_run_at = :next_run_at, last_run_at = :last_run_at,
    skipped_ticks = skipped_ticks + :skipped
WHERE name = :name AND next_run_at = :expected
RETURNING name;

-- name: schedule_run_status
-- The status of the job a schedule fired for its last tick (its id: by primary key).
SELECT status FROM conveyor_jobs WHERE id = :id;

-- name: schedules
-- Every schedule, by name.
SELECT * FROM conveyor_schedules ORDER BY name;

-- name: get_schedule
-- One schedule by name.
SELECT * FROM conveyor_schedules WHERE name = :name;

-- name: set_schedule_enabled
-- Enable or disable a schedule; re-enabling restarts its ticks from now.
UPDATE conveyor_schedules
SET enabled = :enabled,
    next_run_at = CASE WHEN :enabled = 1 AND enabled = 0 THEN :next_run_at ELSE next_run_at END,
    updated_at = :now
WHERE name = :name
RETURNING *;

-- name: get_lease
-- A named lease's current row (BEGIN IMMEDIATE already holds the write lock).
SELECT * FROM conveyor_leases WHERE name = :name;

-- name: current_lease
-- A named lease's current row.
SELECT * FROM conveyor_leases WHERE name = :name;

-- name: take_lease
-- Take a named lease that is free or expired, with the next token.
INSERT INTO conveyor_leases (name, owner, token, acquired_at, expires_at)
VALUES (:name, :owner, 1, :now, :now + :ttl)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner, token = token + 1, acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at
WHERE owner IS NULL OR expires_at <= :now
RETURNING *;

-- name: renew_lease
-- Extend a named lease, fenced by its token.
UPDATE conveyor_leases SET expires_at = :now + :ttl
WHERE name = :name AND token = :token AND owner IS NOT NULL AND expires_at > :now
RETURNING expires_at;

-- name: release_lease
-- Give a named lease up, fenced by its token; says when it was released.
UPDATE conveyor_leases SET owner = NULL, expires_at = NULL
WHERE name = :name AND token = :token AND owner IS NOT NULL
RETURNING acquired_at, :now AS released_at;

-- name: record_lease_end
-- Keep a past holder of a named lease.
INSERT OR REPLACE INTO conveyor_lease_history (name, token, owner, acquired_at, ended_at, ended)
VALUES (:name, :token, :owner, :acquired_at, :ended_at, :ended);

-- name: trim_lease_history
-- Keep only the last ten holders of a named lease.
DELETE FROM conveyor_lease_history
WHERE name = :name AND token <= (
    SELECT token FROM conveyor_lease_history WHERE name = :name
    ORDER BY token DESC LIMIT 1 OFFSET 10
);

-- name: lease_history
-- The last holders of a named lease, newest first.
SELECT * FROM conveyor_lease_history WHERE name = :name ORDER BY token DESC;

-- name: prunable_roots
-- Finished top-level jobs older than their retention (:keep seconds), of one status, for
-- one type or all others, with nothing unfinished below them.
SELECT id FROM conveyor_jobs AS r
WHERE r.parent_id IS NULL AND r.status = :status AND r.finished_at < :now - :keep
  AND (:type IS NULL OR r.type = :type)
  AND r.type NOT IN (SELECT value FROM json_each(:excluded_types))
  AND NOT EXISTS (
      SELECT 1 FROM conveyor_jobs AS d
      WHERE d.root_id = r.id AND d.status IN ('pending', 'queued', 'running', 'waiting')
  )
LIMIT :limit;

-- name: prune_attempts
-- Delete the attempts of the given trees.
DELETE FROM conveyor_attempts WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE id IN (SELECT value FROM json_each(:roots))
       OR root_id IN (SELECT value FROM json_each(:roots))
);

-- name: prune_dependencies
-- Delete the dependency edges of the given trees.
DELETE FROM conveyor_dependencies WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE id IN (SELECT value FROM json_each(:roots))
       OR root_id IN (SELECT value FROM json_each(:roots))
);

-- name: prune_trees
-- Delete the given trees' jobs.
DELETE FROM conveyor_jobs
WHERE id IN (SELECT value FROM json_each(:roots))
   OR root_id IN (SELECT value FROM json_each(:roots))
RETURNING id;

-- name: page_jobs_newest_first
-- One page of jobs of every tenant, newest first, after the last job seen, in the table's
-- own order: its key, created_us, is each job's creation microsecond, its own, so the
-- order is by creation time and a time filter is a range of the key. (Times are passed
-- in microseconds.) The anchor's key is read from its row, or, once the row is gone,
-- from the cursor's time, which is the same microsecond.
SELECT * FROM conveyor_jobs
WHERE (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:type IS NULL OR type = :type)
  AND (:queue IS NULL OR queue = :queue)
  AND (:parent_id IS NULL OR parent_id = :parent_id)
  AND (:root_id IS NULL OR root_id = :root_id)
  AND (:top_level = 0 OR parent_id IS NULL)
  -- One range of the key (no OR, which would have SQLite walk the table from its end).
  AND created_us >= coalesce(:created_after, 0)
  AND created_us < min(
      coalesce(:created_before, 9223372036854775807),
      coalesce((SELECT a.created_us FROM conveyor_jobs AS a WHERE a.id = :after_id),
               :after_created, 9223372036854775807))
ORDER BY created_us DESC
LIMIT :limit;

-- name: page_jobs_oldest_first
-- One page of jobs of every tenant, oldest first, after the last job seen.
SELECT * FROM conveyor_jobs
WHERE (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:type IS NULL OR type = :type)
  AND (:queue IS NULL OR queue = :queue)
  AND (:parent_id IS NULL OR parent_id = :parent_id)
  AND (:root_id IS NULL OR root_id = :root_id)
  AND (:top_level = 0 OR parent_id IS NULL)
  -- One range of the key (no OR, which would have SQLite walk the table from its end).
  AND created_us >= max(
      coalesce(:created_after, 0),
      coalesce((SELECT a.created_us FROM conveyor_jobs AS a WHERE a.id = :after_id),
               :after_created, -1) + 1)
  AND created_us < coalesce(:created_before, 9223372036854775807)
ORDER BY created_us
LIMIT :limit;

-- name: page_tenant_jobs_newest_first
-- One page of one tenant's jobs, newest first (on the tenant's own index, by creation).
SELECT * FROM conveyor_jobs
WHERE tenant = :tenant
  AND (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:type IS NULL OR type = :type)
  AND (:queue IS NULL OR queue = :queue)
  AND (:parent_id IS NULL OR parent_id = :parent_id)
  AND (:root_id IS NULL OR root_id = :root_id)
  AND (:top_level = 0 OR parent_id IS NULL)
  -- One range of the key (no OR, which would have SQLite walk the table from its end).
  AND created_us >= coalesce(:created_after, 0)
  AND created_us < min(
      coalesce(:created_before, 9223372036854775807),
      coalesce((SELECT a.created_us FROM conveyor_jobs AS a WHERE a.id = :after_id),
               :after_created, 9223372036854775807))
ORDER BY created_us DESC
LIMIT :limit;

-- name: page_tenant_jobs_oldest_first
-- One page of one tenant's jobs, oldest first (on the tenant's own index).
SELECT * FROM conveyor_jobs
WHERE tenant = :tenant
  AND (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
  AND (:type IS NULL OR type = :type)
  AND (:queue IS NULL OR queue = :queue)
  AND (:parent_id IS NULL OR parent_id = :parent_id)
  AND (:root_id IS NULL OR root_id = :root_id)
  AND (:top_level = 0 OR parent_id IS NULL)
  -- One range of the key (no OR, which would have SQLite walk the table from its end).
  AND created_us >= max(
      coalesce(:created_after, 0),
      coalesce((SELECT a.created_us FROM conveyor_jobs AS a WHERE a.id = :after_id),
               :after_created, -1) + 1)
  AND created_us < coalesce(:created_before, 9223372036854775807)
ORDER BY created_us
LIMIT :limit;

-- name: health
-- The counts the health check decides from, in one read, with the time they were read.
SELECT
    (SELECT count(*) FROM conveyor_jobs WHERE status = 'queued') AS queued,
    (SELECT count(*) FROM conveyor_jobs WHERE status = 'queued' AND run_at <= :now) AS due,
    (SELECT count(*) FROM conveyor_jobs WHERE status = 'running') AS running,
    (SELECT count(*) FROM conveyor_jobs
     WHERE status = 'running' AND lease_expires_at < :now) AS stale_running,
    (SELECT count(*) FROM conveyor_workers) AS workers,
    -- Live: not stopped, and heartbeating within its own lease. Dead: not stopped, but
    -- silent for longer than its lease (killed, frozen or cut off).
    (SELECT count(*) FROM conveyor_workers
     WHERE stopped_at IS NULL AND heartbeat_at >= :now - lease_seconds) AS live_workers,
    (SELECT max(heartbeat_at) FROM conveyor_workers) AS last_heartbeat,
    :now AS now,
    -- A death older than the worker's forget window no longer counts, even before the
    -- duty that forgets it has run.
    (SELECT count(*) FROM conveyor_workers
     WHERE stopped_at IS NULL AND heartbeat_at < :now - lease_seconds
       AND heartbeat_at >= :now - forget_seconds) AS dead_workers;

-- name: create_token
-- Store a new API token.
INSERT INTO conveyor_tokens (id, tenant, role, secret_hash, name, created_at, expires_at)
VALUES (:id, :tenant, :role, :secret_hash, :name, :created_at, :expires_at);

-- name: find_token
-- One token by id.
SELECT * FROM conveyor_tokens WHERE id = :id;

-- name: touch_token
-- Record that a token was just used.
UPDATE conveyor_tokens SET last_used_at = :now WHERE id = :id;

-- name: revoke_token
-- Revoke a token; revoking it again keeps the first time.
UPDATE conveyor_tokens SET revoked_at = coalesce(revoked_at, :now) WHERE id = :id
RETURNING *;

-- name: list_tokens
-- Every token, newest first.
SELECT * FROM conveyor_tokens ORDER BY created_at DESC, id;

-- name: rotate_token
-- Give a live token a new secret; the old one keeps working until :grace_until (NULL: not).
UPDATE conveyor_tokens SET
    previous_hash = CASE WHEN :grace_until IS NULL THEN NULL ELSE secret_hash END,
    previous_expires_at = :grace_until,
    secret_hash = :secret_hash
WHERE id = :id AND revoked_at IS NULL
RETURNING *;

-- name: server_secret
-- A secret of this database's servers, made by a migration.
SELECT value FROM conveyor_secrets WHERE name = :name;

-- name: now
-- The store's clock (the runner supplies :now: SQLite has no clock of its own to share).
SELECT :now AS now;

-- name: schema_tables
-- The tables of the database file.
SELECT name FROM sqlite_master WHERE type = 'table';

-- name: schema_version
-- The last migration applied.
SELECT max(version) AS version FROM conveyor_migrations;

-- name: create_migrations_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS conveyor_migrations
(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL);

-- name: applied_migrations
-- The migrations applied already.
SELECT version FROM conveyor_migrations;

-- name: record_migration
-- Record a migration as applied.
INSERT INTO conveyor_migrations (version, name, applied_at) VALUES (:version, :name, :now);

-- name: queue_lag
-- Per queue: queued jobs whose run_at has passed, and how long the oldest of them waits.
SELECT queue, count(*) AS due, :now - min(run_at) AS oldest_age
FROM conveyor_jobs
WHERE status = 'queued' AND run_at <= :now
GROUP BY queue;

-- name: record_audit
-- Append an entry to the audit log.
INSERT INTO conveyor_audit (at, tenant, token_id, action, target, detail)
VALUES (:at, :tenant, :token_id, :action, :target, :detail);

-- name: audit_log
-- Audit entries of every tenant, newest first, before an id.
SELECT * FROM conveyor_audit
WHERE (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC LIMIT :limit;

-- name: tenant_audit_log
-- One tenant's audit entries, newest first, before an id.
SELECT * FROM conveyor_audit
WHERE tenant = :tenant AND (:before_id IS NULL OR id < :before_id)
ORDER BY id DESC LIMIT :limit;

-- name: minute_stats
-- Per minute since :since: jobs that ended succeeded or failed and their mean queue wait
-- (a range of conveyor_jobs_finished_at, which covers these columns).
SELECT CAST(finished_at / 60 AS INTEGER) * 60 AS minute,
       sum(status = 'succeeded') AS succeeded,
       sum(status = 'failed') AS failed,
       avg(started_at - run_at) AS wait
FROM conveyor_jobs INDEXED BY conveyor_jobs_finished_at
WHERE finished_at IS NOT NULL AND finished_at >= :since
GROUP BY minute
ORDER BY minute;

-- name: tenant_minute_stats
-- One tenant's minute_stats: the same range of conveyor_jobs_finished_at, its rows only.
SELECT CAST(finished_at / 60 AS INTEGER) * 60 AS minute,
       sum(status = 'succeeded') AS succeeded,
       sum(status = 'failed') AS failed,
       avg(started_at - run_at) AS wait
FROM conveyor_jobs INDEXED BY conveyor_jobs_finished_at
WHERE finished_at IS NOT NULL AND finished_at >= :since AND tenant = :tenant
GROUP BY minute
ORDER BY minute;

-- name: lease_names
-- Names of the named leases ever taken.
SELECT name FROM conveyor_leases ORDER BY name LIMIT :limit;

-- name: tenant_running_by_worker
-- One tenant's running jobs per worker (on conveyor_jobs_leases, partial on running jobs).
SELECT lease_owner, count(*) AS n FROM conveyor_jobs INDEXED BY conveyor_jobs_leases
WHERE status = 'running' AND lease_expires_at IS NOT NULL AND tenant = :tenant
GROUP BY lease_owner;

-- name: running_by_worker
-- Running jobs per worker (on conveyor_jobs_leases, partial on running jobs).
SELECT lease_owner, count(*) AS n FROM conveyor_jobs INDEXED BY conveyor_jobs_leases
WHERE status = 'running' AND lease_expires_at IS NOT NULL
GROUP BY lease_owner;
