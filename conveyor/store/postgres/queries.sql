-- Named queries of the PostgreSQL backend. Every time that decides anything comes from
-- the database: coalesce(%(now)s::timestamptz, now()) is the server's now() in
-- production, where the store passes NULL, and a pinned clock in tests.
--
-- Batches travel as arrays, unnested on the server, so a batch is one round trip.
-- Statements that update several jobs lock them in id order first (ORDER BY id FOR
-- UPDATE), so a worker's settle and its heartbeat, which run on two connections at
-- once, cannot deadlock. They lock by `id = ANY(...)` alone, in a MATERIALIZED CTE, and
-- check status and lease token on the locked rows: the only indexable condition is then
-- the primary key, which no table statistics can steer the planner away from. Deciding a
-- parent from the jobs below it locks its row of conveyor_job_counts (every change below
-- it updates that row first), not its job row, so that the children's settles and the
-- parent's own settle see each other's commits without blocking heartbeats.
--
-- Wake-ups are not sent from here: triggers (migrations/0001_initial.sql) notify
-- conveyor_job_ready whenever a job becomes queued and conveyor_cancel whenever a
-- running job's cancellation is requested.

-- name: submit
-- Insert new jobs in order; an existing id or an active unique key makes that row a no-op.
-- Returns what the server decided of the rows it inserted; the rest is as submitted.
-- The jobs travel as one JSON array of objects, parsed once on the server: cheaper on
-- both sides than an array parameter per column. Payload and state come as JSON text
-- inside it, stored as written (a \u0000 escape, valid JSON, has no text form to parse to).
INSERT INTO conveyor_jobs (
    id, type, queue, tenant, payload, status, priority, max_attempts, run_at, timeout,
    lease_seconds, backoff_base, backoff_cap, state, parent_id, root_id, depends_on,
    unique_key, concurrency_key, retry_of, trace_context, retry_count, submitted_by,
    created_at
)
SELECT
    n.id, n.type, n.queue, n.tenant, n.payload::json, %(status)s::text, n.priority,
    n.max_attempts,
    coalesce(n.run_at, coalesce(%(now)s::timestamptz, now()) + make_interval(secs => n.delay)),
    n.timeout, n.lease_seconds, n.backoff_base, n.backoff_cap, n.state::json, n.parent_id,
    n.root_id,
    CASE WHEN n.depends_on IS NOT NULL
         THEN ARRAY(SELECT json_array_elements_text(n.depends_on)) END,
    n.unique_key, n.concurrency_key, n.retry_of, n.trace_context, n.retry_count,
    n.submitted_by, coalesce(%(now)s::timestamptz, now())
FROM ROWS FROM (
    json_to_recordset(%(jobs)s::json) AS (
        id text, type text, queue text, tenant text, payload text, priority integer,
        max_attempts integer, run_at timestamptz, delay float8, timeout float8,
        lease_seconds float8, backoff_base float8, backoff_cap float8, state text,
        parent_id text, root_id text, depends_on json, unique_key text,
        concurrency_key text, retry_of text, trace_context text, retry_count integer,
        submitted_by text
    )
) WITH ORDINALITY AS n (
    id, type, queue, tenant, payload, priority, max_attempts, run_at, delay, timeout,
    lease_seconds, backoff_base, backoff_cap, state, parent_id, root_id, depends_on,
    unique_key, concurrency_key, retry_of, trace_context, retry_count, submitted_by,
    position
)
ORDER BY n.position
ON CONFLICT DO NOTHING
RETURNING id, status, run_at, created_at;

-- name: submit_one
-- Insert one job without dependencies (the common submit): one prepared statement, its
-- values as parameters, no JSON document to build and parse. As `submit` does, an
-- existing id or an active unique key makes it a no-op, and it returns no row then.
INSERT INTO conveyor_jobs (
    id, type, queue, tenant, payload, status, priority, max_attempts, run_at, timeout,
    lease_seconds, backoff_base, backoff_cap, state, parent_id, root_id, unique_key,
    concurrency_key, retry_of, trace_context, retry_count, submitted_by, created_at
)
VALUES (
    %(id)s, %(type)s, %(queue)s, %(tenant)s, %(payload)s::json, 'queued', %(priority)s,
    %(max_attempts)s,
    coalesce(%(run_at)s::timestamptz,
             coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(delay)s)),
    %(timeout)s, %(lease_seconds)s, %(backoff_base)s, %(backoff_cap)s, %(state)s::json,
    %(parent_id)s, %(root_id)s, %(unique_key)s, %(concurrency_key)s, %(retry_of)s,
    %(trace_context)s, %(retry_count)s, %(submitted_by)s,
    coalesce(%(now)s::timestamptz, now())
)
ON CONFLICT DO NOTHING
RETURNING run_at, created_at;

-- name: existing_jobs
-- The jobs holding the given ids, and the active jobs holding the given unique keys.
SELECT * FROM conveyor_jobs
WHERE id = ANY(%(ids)s::text[])
   OR (unique_key = ANY(%(unique_keys)s::text[])
       AND status IN ('pending', 'queued', 'running', 'waiting'));

-- name: get
-- One job by id.
SELECT * FROM conveyor_jobs WHERE id = %(id)s;

-- name: attempts
-- A job's attempts, oldest first.
SELECT * FROM conveyor_attempts WHERE job_id = %(job_id)s ORDER BY number;

-- name: claim
-- Lease up to %(limit)s due jobs of the worker's types from unpaused queues, in claim
-- order: priority, run_at, id. Each (queue, type) the worker serves is read on its own
-- through the partial claim index, one range in claim order, so the cost stays flat with
-- millions of queued rows and with the backlogs of types the worker lacks; a single scan
-- with type = ANY(...) would read past them, or sort every due row. Rows another worker
-- is claiming are skipped, not waited for. Each range locks up to %(limit)s rows until
-- the statement ends, though only %(limit)s in all are leased: finding the head across
-- the ranges first, without locks, read each range twice and cost more than the locks.
-- The lease starts at clock_timestamp(), when the rows are written, not at now(), the
-- statement's start: a claim that waited for a table lock longer than the lease would
-- otherwise store a lease that had already expired.
UPDATE conveyor_jobs
SET status = 'running',
    attempt = attempt + 1,
    lease_token = lease_token + 1,
    lease_owner = %(worker_id)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, clock_timestamp())
                       + make_interval(secs => coalesce(lease_seconds, %(lease)s)),
    started_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
    cancel_requested = false
WHERE id = ANY(ARRAY(
    SELECT due.id
    FROM unnest(%(queues)s::text[]) AS wanted (queue)
    CROSS JOIN unnest(%(types)s::text[]) AS t (type)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM conveyor_jobs
        WHERE status = 'queued'
          AND queue = wanted.queue
          AND type = t.type
          AND run_at <= coalesce(%(now)s::timestamptz, now())
        ORDER BY priority, run_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS due
    WHERE wanted.queue NOT IN (SELECT name FROM conveyor_queues WHERE paused)
    ORDER BY due.priority, due.run_at, due.id
    LIMIT %(limit)s
))
RETURNING *;

-- name: queued_types
-- The types with queued jobs in the given queues, for a claim that names no types (tests
-- and tools; a worker names its own): a loose scan of conveyor_jobs_claim, one seek per
-- (queue, type) however many jobs each has queued.
WITH RECURSIVE t (queue, type) AS (
    SELECT q.queue, (SELECT min(type) FROM conveyor_jobs
                     WHERE status = 'queued' AND queue = q.queue)
    FROM unnest(%(queues)s::text[]) AS q (queue)
    UNION ALL
    SELECT t.queue, (SELECT min(j.type) FROM conveyor_jobs AS j
                     WHERE j.status = 'queued' AND j.queue = t.queue AND j.type > t.type)
    FROM t WHERE t.type IS NOT NULL
)
SELECT DISTINCT type FROM t WHERE type IS NOT NULL;

-- name: heartbeat
-- Renew a worker's leases, write its buffered progress and record it alive, in one
-- statement that never waits for a row lock. Returns one row per job: renewed (its
-- progress written, whether its cancel was asked) or busy. A row locked by another
-- transaction is skipped, neither renewed nor lost: it is being settled (most often by
-- this worker, whose settle may wait for its event loop), rescued or cancelled, and the
-- next beat sees the outcome. Waiting for it instead would hold back the renewal of
-- every other lease of the worker until their leases ran out.
WITH beat AS (
    SELECT * FROM unnest(
        %(ids)s::text[], %(tokens)s::bigint[], %(renew)s::boolean[],
        %(done)s::float8[], %(total)s::float8[], %(message)s::text[]
    ) AS b (id, token, renew, done, total, message)
),
alive AS (
    UPDATE conveyor_workers SET heartbeat_at = coalesce(%(now)s::timestamptz, now())
    WHERE id = %(worker_id)s
),
locked AS MATERIALIZED (
    SELECT j.id, j.lease_token, j.status FROM conveyor_jobs j
    WHERE j.id = ANY(%(ids)s::text[])
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
),
held AS (
    SELECT j.id FROM locked j JOIN beat b ON b.id = j.id AND b.token = j.lease_token
    WHERE j.status = 'running'
),
renewed AS (
    UPDATE conveyor_jobs j
    SET lease_expires_at = CASE
            WHEN b.renew THEN coalesce(%(now)s::timestamptz, now())
                              + make_interval(secs => coalesce(j.lease_seconds, %(lease)s))
            ELSE j.lease_expires_at END,
        -- Against the same total, progress never moves backwards (a retry resuming from
        -- an older checkpoint does not make the bar shrink).
        progress_done = CASE
            WHEN b.done IS NULL THEN j.progress_done
            WHEN j.progress_total IS NOT DISTINCT FROM b.total AND j.progress_done > b.done
            THEN j.progress_done
            ELSE b.done END,
        progress_total = CASE WHEN b.done IS NULL THEN j.progress_total ELSE b.total END,
        progress_message = CASE WHEN b.done IS NULL THEN j.progress_message ELSE b.message END
    FROM beat b JOIN held USING (id)
    WHERE j.id = b.id
    RETURNING j.id, b.renew, j.cancel_requested
)
SELECT id, renew, cancel_requested, false AS busy FROM renewed
UNION ALL
-- Skipped rows, as last committed: still running under this worker's token. Read only
-- when a row was skipped (a one-time filter), so a beat normally costs no second look.
SELECT b.id, b.renew, false, true
FROM conveyor_jobs j JOIN beat b ON b.id = j.id AND b.token = j.lease_token
WHERE (SELECT count(*) FROM locked) < cardinality(%(ids)s::text[])
  AND j.id = ANY(%(ids)s::text[])
  AND j.status = 'running'
  AND j.id NOT IN (SELECT id FROM locked);

-- name: settle
-- End attempts, fenced by the lease (the row must still be running under the token), and
-- record each ended attempt. Returns the jobs settled, with their parent, and the jobs
-- deferred: unless %(decided)s, a job reported succeeded or cancelled that has children is
-- held but not settled, for the store to decide from its children. Ids not returned were
-- refused.
WITH ended AS (
    SELECT * FROM unnest(
        %(ids)s::text[], %(tokens)s::bigint[], %(statuses)s::text[], %(outcomes)s::text[],
        %(results)s::text[], %(result_refs)s::text[], %(errors)s::text[],
        %(tracebacks)s::text[], %(retry_delays)s::float8[], %(done)s::float8[],
        %(total)s::float8[], %(message)s::text[]
    ) AS e (
        id, token, status, outcome, result, result_ref, error, traceback, retry_delay,
        done, total, message
    )
),
locked AS MATERIALIZED (
    SELECT j.id, j.lease_token, j.status, j.cancel_requested FROM conveyor_jobs j
    WHERE j.id = ANY(%(ids)s::text[])
    ORDER BY j.id
    FOR UPDATE OF j
),
held AS MATERIALIZED (
    SELECT e.*, j.cancel_requested,
           -- A job with children has a row of counts (a primary-key probe of a small
           -- table: a probe of the parent index can be planned as a scan of every job
           -- once most jobs share one parent).
           (NOT %(decided)s AND e.status IN ('succeeded', 'cancelled')
            AND EXISTS (SELECT 1 FROM conveyor_job_counts c WHERE c.job_id = j.id)) AS deferred
    FROM locked j JOIN ended e ON e.id = j.id AND e.token = j.lease_token
    WHERE j.status = 'running'
),
settled AS (
    UPDATE conveyor_jobs j
    -- A job whose cancel was asked for is never queued again (a retry, a hand-back or the
    -- rescue of a dead worker's run): it ends cancelled, with the reason the request stored.
    SET status = CASE WHEN e.status = 'queued' AND e.cancel_requested THEN 'cancelled'
                      ELSE e.status END,
        result = e.result::json,
        result_ref = coalesce(e.result_ref, j.result_ref),
        -- A cancelled job keeps the reason its cancel request stored.
        error = CASE WHEN e.status IN ('queued', 'cancelled', 'waiting') AND e.cancel_requested
                          THEN coalesce(j.error, e.error)
                     WHEN e.status = 'cancelled' THEN coalesce(e.error, j.error)
                     ELSE e.error END,
        run_at = CASE
            WHEN e.status = 'queued' THEN coalesce(%(now)s::timestamptz, now())
                                          + make_interval(secs => e.retry_delay)
            ELSE j.run_at END,
        finished_at = CASE
            WHEN e.status IN ('succeeded', 'failed', 'cancelled')
                 OR (e.status = 'queued' AND e.cancel_requested)
            THEN coalesce(%(now)s::timestamptz, now()) END,
        attempt = CASE WHEN e.outcome IS NULL THEN j.attempt - 1 ELSE j.attempt END,
        progress_done = CASE
            WHEN e.done IS NULL THEN j.progress_done
            WHEN j.progress_total IS NOT DISTINCT FROM e.total AND j.progress_done > e.done
            THEN j.progress_done
            ELSE e.done END,
        progress_total = CASE WHEN e.done IS NULL THEN j.progress_total ELSE e.total END,
        progress_message = CASE WHEN e.done IS NULL THEN j.progress_message ELSE e.message END,
        lease_expires_at = NULL
    FROM held e
    WHERE j.id = e.id AND NOT e.deferred
    RETURNING j.id, j.parent_id, j.status, j.attempt, j.lease_owner, j.started_at, e.outcome,
              e.error, e.traceback
),
recorded AS (
    INSERT INTO conveyor_attempts (
        job_id, number, worker_id, started_at, finished_at, outcome, error, traceback
    )
    SELECT id, attempt, lease_owner, started_at, coalesce(%(now)s::timestamptz, now()),
           outcome, error, traceback
    FROM settled
    WHERE outcome IS NOT NULL
    ON CONFLICT (job_id, number) DO UPDATE
    SET worker_id = excluded.worker_id, started_at = excluded.started_at,
        finished_at = excluded.finished_at, outcome = excluded.outcome,
        error = excluded.error, traceback = excluded.traceback
)
SELECT id, parent_id, status, false AS deferred FROM settled
UNION ALL
SELECT id, NULL, NULL, true FROM held WHERE deferred;

-- name: lock_settling
-- The first statement of a plain settle (settle_plain): lock the jobs in id order, so
-- that the settle's own statement, which starts after the locks are held, reads them and
-- their dependents as committed by then.
SELECT id FROM conveyor_jobs WHERE id = ANY(%(ids)s::text[]) ORDER BY id FOR UPDATE;

-- name: settle_plain
-- End the attempts of jobs whose end reaches no other job, as settle does, in the
-- transaction of lock_settling: a job with a parent, a succeeded job with children, a job
-- whose cancel was asked for and an ended job that pending jobs depend on are not settled
-- here but returned with plain = false, for settle's transaction. Returns the jobs settled (plain = true); ids not
-- returned were refused (the lease was lost).
WITH ended AS (
    SELECT * FROM unnest(
        %(ids)s::text[], %(tokens)s::bigint[], %(statuses)s::text[], %(outcomes)s::text[],
        %(results)s::text[], %(result_refs)s::text[], %(errors)s::text[],
        %(tracebacks)s::text[], %(retry_delays)s::float8[], %(done)s::float8[],
        %(total)s::float8[], %(message)s::text[]
    ) AS e (
        id, token, status, outcome, result, result_ref, error, traceback, retry_delay,
        done, total, message
    )
),
held AS MATERIALIZED (
    SELECT e.*,
           (j.parent_id IS NULL
            -- A job whose cancel was asked for ends as settle decides (durable cancel).
            AND NOT j.cancel_requested
            -- A job with children has a row of counts (see settle).
            AND NOT (e.status = 'succeeded'
                     AND EXISTS (SELECT 1 FROM conveyor_job_counts c WHERE c.job_id = j.id))
            AND NOT (e.status IN ('succeeded', 'failed', 'cancelled')
                     AND EXISTS (SELECT 1 FROM conveyor_dependencies d
                                 JOIN conveyor_jobs p ON p.id = d.job_id
                                 WHERE d.depends_on_id = j.id AND p.status = 'pending'))
           ) AS plain
    FROM ended e
    -- Each job by its primary key, a probe per row (OFFSET 0 keeps the subquery from being
    -- flattened into a join): as a join, when the statistics said few jobs run (after a
    -- bulk load, until the next ANALYZE), the planner scanned the running jobs once per
    -- row of the batch, and a batch of 1,000 took 230 ms instead of 27.
    CROSS JOIN LATERAL (
        SELECT j.id, j.parent_id, j.cancel_requested, j.lease_token, j.status
        FROM conveyor_jobs j WHERE j.id = e.id OFFSET 0
    ) AS j
    WHERE j.lease_token = e.token AND j.status = 'running'
),
settled AS (
    UPDATE conveyor_jobs j
    SET status = e.status,
        result = e.result::json,
        result_ref = coalesce(e.result_ref, j.result_ref),
        error = CASE WHEN e.status = 'cancelled' THEN coalesce(e.error, j.error) ELSE e.error END,
        run_at = CASE
            WHEN e.status = 'queued' THEN coalesce(%(now)s::timestamptz, now())
                                          + make_interval(secs => e.retry_delay)
            ELSE j.run_at END,
        finished_at = CASE
            WHEN e.status IN ('succeeded', 'failed', 'cancelled')
            THEN coalesce(%(now)s::timestamptz, now()) END,
        attempt = CASE WHEN e.outcome IS NULL THEN j.attempt - 1 ELSE j.attempt END,
        progress_done = CASE
            WHEN e.done IS NULL THEN j.progress_done
            WHEN j.progress_total IS NOT DISTINCT FROM e.total AND j.progress_done > e.done
            THEN j.progress_done
            ELSE e.done END,
        progress_total = CASE WHEN e.done IS NULL THEN j.progress_total ELSE e.total END,
        progress_message = CASE WHEN e.done IS NULL THEN j.progress_message ELSE e.message END,
        lease_expires_at = NULL
    FROM held e
    WHERE j.id = e.id AND e.plain
    RETURNING j.id, j.attempt, j.lease_owner, j.started_at, e.outcome, e.error, e.traceback
),
recorded AS (
    INSERT INTO conveyor_attempts (
        job_id, number, worker_id, started_at, finished_at, outcome, error, traceback
    )
    SELECT id, attempt, lease_owner, started_at, coalesce(%(now)s::timestamptz, now()),
           outcome, error, traceback
    FROM settled
    WHERE outcome IS NOT NULL
    ON CONFLICT (job_id, number) DO UPDATE
    SET worker_id = excluded.worker_id, started_at = excluded.started_at,
        finished_at = excluded.finished_at, outcome = excluded.outcome,
        error = excluded.error, traceback = excluded.traceback
)
SELECT id, true AS plain FROM settled
UNION ALL
SELECT id, false FROM held WHERE NOT plain;

-- name: awaited
-- Which of the given jobs pending jobs depend on (run after settle, in its transaction).
SELECT DISTINCT d.depends_on_id AS id
FROM conveyor_dependencies d JOIN conveyor_jobs j ON j.id = d.job_id
WHERE d.depends_on_id = ANY(%(ids)s::text[]) AND j.status = 'pending';

-- name: checkpoint
-- Store a running job's state, fenced by its lease.
UPDATE conveyor_jobs SET state = %(state)s::json
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running';

-- name: rescue
-- Lock running jobs whose lease has expired, oldest expiry first; rows another rescuer
-- holds are skipped, so every worker may run this at once.
SELECT id, lease_token, attempt, max_attempts, backoff_base, backoff_cap, lease_owner,
       cancel_requested
FROM conveyor_jobs
WHERE status = 'running' AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
ORDER BY lease_expires_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: cancel_unstarted
-- Cancel a job that has not started yet.
UPDATE conveyor_jobs
SET status = 'cancelled', error = %(reason)s, finished_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status IN ('pending', 'queued')
RETURNING *;

-- name: request_cancel
-- Ask the worker running a job to stop it (a trigger notifies conveyor_cancel), or a
-- waiting parent to end cancelled.
UPDATE conveyor_jobs SET cancel_requested = true, error = %(reason)s
WHERE id = %(id)s AND status IN ('running', 'waiting')
RETURNING *;

-- name: register_worker
-- Record a worker process as started, with the job types it serves.
INSERT INTO conveyor_workers (
    id, hostname, pid, queues, concurrency, started_at, heartbeat_at, stopped_at,
    lease_seconds, heartbeat_seconds, types, forget_seconds
) VALUES (
    %(id)s, %(hostname)s, %(pid)s, %(queues)s::text[], %(concurrency)s,
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), NULL,
    %(lease_seconds)s, %(heartbeat_seconds)s, %(types)s::text[], %(forget_seconds)s
)
ON CONFLICT (id) DO UPDATE
SET hostname = excluded.hostname, pid = excluded.pid, queues = excluded.queues,
    concurrency = excluded.concurrency, started_at = excluded.started_at,
    heartbeat_at = excluded.heartbeat_at, stopped_at = NULL,
    lease_seconds = excluded.lease_seconds, heartbeat_seconds = excluded.heartbeat_seconds,
    types = excluded.types, forget_seconds = excluded.forget_seconds;

-- name: deregister_worker
-- Record a worker process as stopped.
UPDATE conveyor_workers SET stopped_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(worker_id)s;

-- name: workers
-- Workers, live ones first, newest heartbeat first.
SELECT * FROM conveyor_workers
ORDER BY stopped_at IS NOT NULL, heartbeat_at DESC
LIMIT 200;

-- name: forget_workers
-- Delete workers silent for longer than their own forget window, dead or stopped (their
-- attempts keep their history), at most %(limit)s, on no index: the table holds one row
-- per worker process heard from within the last window.
DELETE FROM conveyor_workers
WHERE id IN (
    SELECT id FROM conveyor_workers
    WHERE heartbeat_at < coalesce(%(now)s::timestamptz, now())
                         - forget_seconds * interval '1 second'
    LIMIT %(limit)s
)
RETURNING id;

-- name: unserved_types
-- Queued jobs per type that no live worker serves: no worker heartbeating within its
-- lease has the job's queue among its queues and its type among its types (NULL types:
-- a worker from before they were recorded, which claims any type). The (queue, type)
-- pairs with queued jobs are found by a loose scan of conveyor_jobs_claim, one seek each;
-- only the jobs of unserved pairs are counted.
WITH RECURSIVE pairs (queue, type) AS (
    (SELECT queue, type FROM conveyor_jobs WHERE status = 'queued'
     ORDER BY queue, type LIMIT 1)
    UNION ALL
    SELECT next.queue, next.type
    FROM pairs
    CROSS JOIN LATERAL (
        SELECT j.queue, j.type FROM conveyor_jobs AS j
        WHERE j.status = 'queued' AND (j.queue, j.type) > (pairs.queue, pairs.type)
        ORDER BY j.queue, j.type
        LIMIT 1
    ) AS next
), unserved AS (
    SELECT queue, type FROM pairs
    WHERE NOT EXISTS (
        SELECT 1 FROM conveyor_workers AS w
        WHERE w.stopped_at IS NULL
          AND w.heartbeat_at >= coalesce(%(now)s::timestamptz, now())
                                - w.lease_seconds * interval '1 second'
          AND pairs.queue = ANY(w.queues)
          AND (w.types IS NULL OR pairs.type = ANY(w.types))
    )
)
SELECT u.type, count(*) AS n
FROM unserved AS u
JOIN conveyor_jobs AS j ON j.status = 'queued' AND j.queue = u.queue AND j.type = u.type
GROUP BY u.type
ORDER BY u.type;

-- name: queues
-- Every queue that has jobs or a pause record, with its number of jobs per status.
SELECT coalesce(counts.queue, q.name) AS name, coalesce(q.paused, false) AS paused,
       counts.status, counts.n
FROM (SELECT queue, status, count(*) AS n FROM conveyor_jobs GROUP BY queue, status) AS counts
FULL JOIN conveyor_queues q ON q.name = counts.queue;

-- name: tenant_queues
-- The queues one tenant has jobs in, with its number of jobs per status, and every queue
-- with a pause record (on conveyor_jobs_tenant_created: the tenant's rows only).
SELECT coalesce(counts.queue, q.name) AS name, coalesce(q.paused, false) AS paused,
       counts.status, counts.n
FROM (SELECT queue, status, count(*) AS n FROM conveyor_jobs WHERE tenant = %(tenant)s
      GROUP BY queue, status) AS counts
FULL JOIN conveyor_queues q ON q.name = counts.queue;

-- name: set_paused
-- Pause or resume claiming from a queue (a trigger wakes workers on resume).
INSERT INTO conveyor_queues (name, paused, paused_at)
VALUES (%(name)s, %(paused)s, coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, paused_at = excluded.paused_at;

-- name: now
-- The store's clock: the pinned time, or the database's (the transaction's start).
SELECT coalesce(%(now)s::timestamptz, now()) AS now;

-- name: session_settings
-- Settings of conveyor's own connections. A client that stops in the middle of a
-- transaction (a SIGSTOPped or frozen worker) would hold its locks for ever: the server
-- ends such a session after 15 s, rolling back, and the other workers carry on. A
-- statement of conveyor's that runs for a minute has gone wrong (and may outlive a
-- killed worker, holding locks): the server cancels it.
-- Timestamps travel in UTC, which psycopg reads straight into UTC datetimes (every time
-- conveyor stores is a timestamptz, so this changes how they are written out, not what
-- they are).
SET idle_in_transaction_session_timeout = '15s';
SET statement_timeout = '60s';
SET TimeZone = 'UTC';

-- name: backend_pid
-- The server process serving this statement. Through a pooler it differs from the one the
-- connection was told at start-up, and in transaction mode it changes between statements.
SELECT pg_backend_pid() AS pid;

-- name: listen
-- Subscribe the notification connection to both wake-up channels.
LISTEN conveyor_job_ready;
LISTEN conveyor_cancel;

-- name: schema_tables
-- Whether conveyor's migration table and jobs table exist (on the search path).
SELECT to_regclass('conveyor_migrations') IS NOT NULL AS migrations,
       to_regclass('conveyor_jobs') IS NOT NULL AS jobs;

-- name: schema_version
-- The newest migration applied.
SELECT coalesce(max(version), 0) AS version FROM conveyor_migrations;

-- name: lock_migrations
-- Serialise migrations of this database until the transaction ends, so that many workers
-- starting at once apply each migration exactly once.
SELECT pg_advisory_xact_lock(hashtext('conveyor_migrations'));

-- name: create_migrations_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS conveyor_migrations (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL
);

-- name: applied_migrations
-- The versions already applied.
SELECT version FROM conveyor_migrations;

-- name: record_migration
-- Record one applied migration.
INSERT INTO conveyor_migrations (version, name, applied_at)
VALUES (%(version)s, %(name)s, coalesce(%(now)s::timestamptz, now()));

-- name: get_many
-- Jobs by id.
SELECT * FROM conveyor_jobs WHERE id = ANY(%(ids)s::text[]);

-- name: lock_dependencies
-- The status of a new job's dependencies, locked against change until it is inserted: a
-- dependency finishing meanwhile then sees the new job among its dependents.
SELECT id, status FROM conveyor_jobs WHERE id = ANY(%(ids)s::text[]) ORDER BY id FOR SHARE;

-- name: insert_dependencies
-- Record that a job waits for others.
INSERT INTO conveyor_dependencies (job_id, depends_on_id)
SELECT %(job_id)s, upstream FROM unnest(%(ids)s::text[]) AS upstream
ON CONFLICT DO NOTHING
RETURNING depends_on_id;

-- name: lock_counts
-- The counts of the jobs below these parents, locked until the transaction ends: every
-- change below a parent updates its row first, so what is read here is final. Rows of
-- conveyor_job_counts are always locked deepest first (then by id), here as in
-- count_moves: a settle holding a parent's row may then wait for its ancestors', never
-- the other way round, so two settles of one tree cannot deadlock.
WITH RECURSIVE up (id, ancestor, level) AS (
    SELECT id, id, 0 FROM unnest(%(ids)s::text[]) AS id
    UNION ALL
    SELECT up.id, j.parent_id, up.level + 1 FROM up JOIN conveyor_jobs j ON j.id = up.ancestor
    WHERE j.parent_id IS NOT NULL
),
depth AS (SELECT id, max(level) AS depth FROM up GROUP BY id)
SELECT c.* FROM conveyor_job_counts c JOIN depth d ON d.id = c.job_id
ORDER BY d.depth DESC, c.job_id
FOR UPDATE OF c;

-- name: count_moves
-- Carry jobs' moves between statuses to the counts of every parent above them, in one
-- statement. %(moves)s is a JSON array of {parent, src, dst, n}: n jobs whose parent is
-- `parent` left counter `src` (NULL: they are new) for `dst` (NULL: a retry took their
-- place). The walk up stops above a job a retry took the place of. Returns the rows as
-- they are now, locked until the transaction ends. Rows are written
-- deepest first, then by id (see lock_counts), so that two settles of one tree cannot
-- deadlock on them.
WITH RECURSIVE
moved AS (
    SELECT * FROM json_to_recordset(%(moves)s::json) AS m (parent text, src text, dst text, n integer)
),
up (start, ancestor, level, src, dst, n) AS (
    SELECT parent, parent, 0, src, dst, n FROM moved
    UNION ALL
    SELECT up.start, j.parent_id, up.level + 1, up.src, up.dst, up.n
    FROM up JOIN conveyor_jobs j ON j.id = up.ancestor
    WHERE j.parent_id IS NOT NULL AND j.retried_by IS NULL
),
placed AS (
    SELECT ancestor, src, dst, n, max(level) OVER (PARTITION BY start) - level AS depth FROM up
),
delta AS (
    SELECT ancestor, max(depth) AS depth,
           sum(CASE WHEN dst = 'pending' THEN n ELSE 0 END
               - CASE WHEN src = 'pending' THEN n ELSE 0 END) AS pending,
           sum(CASE WHEN dst = 'active' THEN n ELSE 0 END
               - CASE WHEN src = 'active' THEN n ELSE 0 END) AS active,
           sum(CASE WHEN dst = 'waiting' THEN n ELSE 0 END
               - CASE WHEN src = 'waiting' THEN n ELSE 0 END) AS waiting,
           sum(CASE WHEN dst = 'succeeded' THEN n ELSE 0 END
               - CASE WHEN src = 'succeeded' THEN n ELSE 0 END) AS succeeded,
           sum(CASE WHEN dst = 'failed' THEN n ELSE 0 END
               - CASE WHEN src = 'failed' THEN n ELSE 0 END) AS failed,
           sum(CASE WHEN dst = 'cancelled' THEN n ELSE 0 END
               - CASE WHEN src = 'cancelled' THEN n ELSE 0 END) AS cancelled
    FROM placed
    GROUP BY ancestor
)
INSERT INTO conveyor_job_counts AS c (job_id, pending, active, waiting, succeeded, failed, cancelled)
SELECT ancestor, pending, active, waiting, succeeded, failed, cancelled FROM delta
ORDER BY depth DESC, ancestor
ON CONFLICT (job_id) DO UPDATE SET
    pending = c.pending + excluded.pending, active = c.active + excluded.active,
    waiting = c.waiting + excluded.waiting, succeeded = c.succeeded + excluded.succeeded,
    failed = c.failed + excluded.failed, cancelled = c.cancelled + excluded.cancelled
RETURNING c.*;

-- name: settle_leaves
-- settle_plain's settle with the leaf children of trees added, in one statement, for the
-- settles of a store that meets trees (postgres/_leaves.py): run in the transaction of
-- lock_settling, it settles the jobs of the batch that have no parent, or a parent but
-- no jobs below them, and carries the ends of those with a parent to the counts of every
-- ancestor. Left for settle's transaction (kind 'kept'): a job whose cancel was asked
-- for, an ended job that pending jobs depend on, a job with jobs below it that has a
-- parent or reported success. Returns kind 'settled' with each job settled ('leaf' if it
-- has a parent; the ids returned with neither kind nor 'kept' were refused), and kind
-- 'done' with each ancestor whose counts
-- now show nothing unfinished below it: that parent may now be decided, which the store
-- does in a transaction of its own, from its locked row of counts (finish_waiting only
-- ends a parent still waiting, so it ends once). Rows of counts are written deepest
-- first, then by id, as count_moves writes them.
WITH RECURSIVE ended AS (
    SELECT * FROM unnest(
        %(ids)s::text[], %(tokens)s::bigint[], %(statuses)s::text[], %(outcomes)s::text[],
        %(results)s::text[], %(result_refs)s::text[], %(errors)s::text[],
        %(tracebacks)s::text[], %(retry_delays)s::float8[], %(done)s::float8[],
        %(total)s::float8[], %(message)s::text[]
    ) AS e (
        id, token, status, outcome, result, result_ref, error, traceback, retry_delay,
        done, total, message
    )
),
-- By primary key alone (see the top of this file), locked already by lock_settling.
found AS MATERIALIZED (
    SELECT j.id, j.lease_token, j.status, j.parent_id, j.cancel_requested
    FROM conveyor_jobs j WHERE j.id = ANY(%(ids)s::text[])
),
held AS MATERIALIZED (
    SELECT e.*,
           (NOT j.cancel_requested
            -- A job with jobs below it has a row of counts (see settle).
            AND NOT ((j.parent_id IS NOT NULL OR e.status = 'succeeded')
                     AND EXISTS (SELECT 1 FROM conveyor_job_counts c WHERE c.job_id = j.id))
            AND NOT (e.status IN ('succeeded', 'failed', 'cancelled')
                     AND EXISTS (SELECT 1 FROM conveyor_dependencies d
                                 JOIN conveyor_jobs p ON p.id = d.job_id
                                 WHERE d.depends_on_id = j.id AND p.status = 'pending'))
           ) AS settles
    FROM ended e JOIN found j ON j.id = e.id
    WHERE j.lease_token = e.token AND j.status = 'running'
),
settled AS (
    UPDATE conveyor_jobs j
    SET status = e.status,
        result = e.result::json,
        result_ref = coalesce(e.result_ref, j.result_ref),
        error = CASE WHEN e.status = 'cancelled' THEN coalesce(e.error, j.error) ELSE e.error END,
        run_at = CASE
            WHEN e.status = 'queued' THEN coalesce(%(now)s::timestamptz, now())
                                          + make_interval(secs => e.retry_delay)
            ELSE j.run_at END,
        finished_at = CASE
            WHEN e.status IN ('succeeded', 'failed', 'cancelled')
            THEN coalesce(%(now)s::timestamptz, now()) END,
        attempt = CASE WHEN e.outcome IS NULL THEN j.attempt - 1 ELSE j.attempt END,
        progress_done = CASE
            WHEN e.done IS NULL THEN j.progress_done
            WHEN j.progress_total IS NOT DISTINCT FROM e.total AND j.progress_done > e.done
            THEN j.progress_done
            ELSE e.done END,
        progress_total = CASE WHEN e.done IS NULL THEN j.progress_total ELSE e.total END,
        progress_message = CASE WHEN e.done IS NULL THEN j.progress_message ELSE e.message END,
        lease_expires_at = NULL
    FROM held e
    WHERE j.id = e.id AND e.settles
    RETURNING j.id, j.parent_id, j.status, j.attempt, j.lease_owner, j.started_at,
              e.outcome, e.error, e.traceback
),
recorded AS (
    INSERT INTO conveyor_attempts (
        job_id, number, worker_id, started_at, finished_at, outcome, error, traceback
    )
    SELECT id, attempt, lease_owner, started_at, coalesce(%(now)s::timestamptz, now()),
           outcome, error, traceback
    FROM settled
    WHERE outcome IS NOT NULL
    ON CONFLICT (job_id, number) DO UPDATE
    SET worker_id = excluded.worker_id, started_at = excluded.started_at,
        finished_at = excluded.finished_at, outcome = excluded.outcome,
        error = excluded.error, traceback = excluded.traceback
),
-- Each job left the active counter (queued and running share it: a retry moves none).
moved AS (
    SELECT parent_id AS parent, status AS dst, count(*)::integer AS n FROM settled
    WHERE parent_id IS NOT NULL AND status IN ('succeeded', 'failed', 'cancelled')
    GROUP BY parent_id, status
),
up (start, ancestor, level, dst, n) AS (
    SELECT parent, parent, 0, dst, n FROM moved
    UNION ALL
    SELECT up.start, j.parent_id, up.level + 1, up.dst, up.n
    FROM up JOIN conveyor_jobs j ON j.id = up.ancestor
    WHERE j.parent_id IS NOT NULL AND j.retried_by IS NULL
),
delta AS (
    SELECT ancestor, max(depth) AS depth, -sum(n) AS active,
           sum(CASE WHEN dst = 'succeeded' THEN n ELSE 0 END) AS succeeded,
           sum(CASE WHEN dst = 'failed' THEN n ELSE 0 END) AS failed,
           sum(CASE WHEN dst = 'cancelled' THEN n ELSE 0 END) AS cancelled
    FROM (SELECT ancestor, dst, n, max(level) OVER (PARTITION BY start) - level AS depth
          FROM up) AS placed
    GROUP BY ancestor
),
counted AS (
    INSERT INTO conveyor_job_counts AS c (job_id, active, succeeded, failed, cancelled)
    SELECT ancestor, active, succeeded, failed, cancelled FROM delta
    ORDER BY depth DESC, ancestor
    ON CONFLICT (job_id) DO UPDATE SET
        active = c.active + excluded.active, succeeded = c.succeeded + excluded.succeeded,
        failed = c.failed + excluded.failed, cancelled = c.cancelled + excluded.cancelled
    RETURNING c.job_id, c.pending + c.active + c.waiting AS unfinished
)
SELECT CASE WHEN parent_id IS NULL THEN 'settled' ELSE 'leaf' END AS kind, id FROM settled
UNION ALL
SELECT 'kept', id FROM held WHERE NOT settles
UNION ALL
SELECT 'done', job_id FROM counted WHERE unfinished = 0;

-- name: lock_job
-- One job, locked to change it.
SELECT * FROM conveyor_jobs WHERE id = %(id)s FOR UPDATE;

-- name: mark_retried
-- Record the manual retry that takes a failed or cancelled job's place (once only).
UPDATE conveyor_jobs SET retried_by = %(by)s
WHERE id = %(id)s AND status IN ('failed', 'cancelled') AND retried_by IS NULL
RETURNING id;

-- name: reopen
-- Move a parent that failed back to waiting: a job below it was retried by hand (a
-- cancel asked of it while it ran is spent: it is decided from its children again).
UPDATE conveyor_jobs
SET status = 'waiting', error = NULL, finished_at = NULL, cancel_requested = false
WHERE id = %(id)s AND status = 'failed'
RETURNING id, parent_id;

-- name: record_event
-- Add an event to a job's history.
INSERT INTO conveyor_job_events (job_id, at, event, detail)
VALUES (%(job_id)s, coalesce(%(now)s::timestamptz, now()), %(event)s, %(detail)s);

-- name: job_events
-- A job's events, oldest first.
SELECT * FROM conveyor_job_events WHERE job_id = %(id)s ORDER BY id;

-- name: note_retry_limit
-- Say on a failed or cancelled job that it may not be retried again.
UPDATE conveyor_jobs SET error = %(error)s
WHERE id = %(id)s AND status IN ('failed', 'cancelled')
RETURNING *;

-- name: upsert_callback
-- Keep (or replace) a parent's callback of one kind.
INSERT INTO conveyor_callbacks (job_id, kind, job) VALUES (%(job_id)s, %(kind)s, %(job)s::json)
ON CONFLICT (job_id, kind) DO UPDATE SET job = excluded.job;

-- name: fire_callbacks
-- Count one more firing of a parent's callbacks of the given kinds; return them.
UPDATE conveyor_callbacks SET fired = fired + 1
WHERE job_id = %(job_id)s AND kind = ANY(%(kinds)s::text[])
RETURNING kind, job::text AS job, fired;

-- name: failed_below
-- Failed jobs below a job, not retried yet, with no failed or cancelled job below them
-- (the failures a retry fixes, not the parents that failed because of them).
WITH RECURSIVE below (id) AS (
    SELECT id FROM conveyor_jobs WHERE parent_id = %(id)s
    UNION ALL
    SELECT j.id FROM conveyor_jobs j JOIN below b ON j.parent_id = b.id
)
SELECT j.id FROM conveyor_jobs j JOIN below b ON j.id = b.id
LEFT JOIN conveyor_job_counts c ON c.job_id = j.id
WHERE j.status = 'failed' AND j.retried_by IS NULL
  AND coalesce(c.failed + c.cancelled, 0) = 0
ORDER BY j.id
LIMIT %(limit)s;

-- name: get_with_counts
-- One job by id, with the counts of the jobs below it when it has any. The running ones
-- are counted here, among the few running jobs of its tree (conveyor_jobs_running_root),
-- walking up to it; the rest come from conveyor_job_counts. One statement, one snapshot:
-- the figures add up to the total.
WITH RECURSIVE up (id, ancestor) AS (
    SELECT r.id, r.parent_id FROM conveyor_jobs r
    WHERE r.status = 'running'
      AND r.root_id = coalesce((SELECT root_id FROM conveyor_jobs WHERE id = %(id)s), %(id)s)
    UNION ALL
    SELECT up.id, p.parent_id FROM up JOIN conveyor_jobs p ON p.id = up.ancestor
    WHERE up.ancestor <> %(id)s AND p.parent_id IS NOT NULL AND p.retried_by IS NULL
)
SELECT j.*, c.pending AS below_pending, c.active AS below_active,
       c.waiting AS below_waiting, c.succeeded AS below_succeeded,
       c.failed AS below_failed, c.cancelled AS below_cancelled,
       CASE WHEN c.job_id IS NULL THEN NULL
            -- A root: its tree's running jobs, on the index. Below a root: those that
            -- have it as an ancestor (each running job walks up to it at most once).
            WHEN j.root_id IS NULL
            THEN (SELECT count(*) FROM conveyor_jobs r
                  WHERE r.status = 'running' AND r.root_id = %(id)s)
            ELSE (SELECT count(*) FROM up WHERE ancestor = %(id)s) END AS below_running
FROM conveyor_jobs j LEFT JOIN conveyor_job_counts c ON c.job_id = j.id
WHERE j.id = %(id)s;

-- name: finish_waiting
-- End a waiting parent once its last child has ended (cancelled if a cancel was asked for).
UPDATE conveyor_jobs
SET status = CASE WHEN cancel_requested THEN 'cancelled' ELSE %(status)s END,
    error = CASE WHEN cancel_requested THEN error ELSE %(error)s END,
    finished_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status = 'waiting'
RETURNING id, parent_id, status;

-- name: pending_dependents
-- Pending jobs that wait for a job, locked until this transaction ends.
SELECT j.id FROM conveyor_dependencies d JOIN conveyor_jobs j ON j.id = d.job_id
WHERE d.depends_on_id = %(id)s AND j.status = 'pending'
ORDER BY j.id
FOR UPDATE OF j;

-- name: unmet_dependencies
-- How many of a job's dependencies have not succeeded.
SELECT count(*) AS n FROM conveyor_dependencies d JOIN conveyor_jobs j ON j.id = d.depends_on_id
WHERE d.job_id = %(id)s AND j.status <> 'succeeded';

-- name: release_pending
-- Queue a pending job whose dependencies all succeeded.
UPDATE conveyor_jobs SET status = 'queued' WHERE id = %(id)s AND status = 'pending'
RETURNING id, parent_id;

-- name: cancel_pending
-- Cancel a pending job whose dependency failed or was cancelled.
UPDATE conveyor_jobs
SET status = 'cancelled', error = %(reason)s, finished_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND status = 'pending'
RETURNING id, parent_id, status;

-- name: unfinished_descendants
-- Every unfinished job below a job in its tree.
WITH RECURSIVE below (id) AS (
    SELECT id FROM conveyor_jobs WHERE parent_id = %(id)s
    UNION ALL
    SELECT j.id FROM conveyor_jobs j JOIN below b ON j.parent_id = b.id
)
SELECT j.id, j.status FROM conveyor_jobs j JOIN below b ON j.id = b.id
WHERE j.status IN ('pending', 'queued', 'running', 'waiting');

-- name: lease_holder
-- The root of a job if the given lease still holds it, locked so that no rescue or
-- settle can take the lease until the children are inserted.
SELECT coalesce(root_id, id) AS root_id FROM conveyor_jobs
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
FOR UPDATE;

-- name: waiting_parents
-- Waiting parents with nothing unfinished below them (a safety net for the settle cascade).
SELECT p.id FROM conveyor_jobs p JOIN conveyor_job_counts c ON c.job_id = p.id
WHERE p.status = 'waiting' AND c.pending + c.active + c.waiting = 0
LIMIT %(limit)s;

-- name: lock_limited_types
-- Take, without waiting, the lock of each limited type until the transaction ends, so
-- that the counts of running jobs and of rate-window starts read next stay exact; returns
-- the types locked. A type another worker is claiming right now is left to that worker.
SELECT limited.type
FROM (SELECT DISTINCT type FROM unnest(%(types)s::text[]) AS type) AS limited
WHERE pg_try_advisory_xact_lock(hashtext('conveyor_flow'), hashtext(limited.type));

-- name: running_per_type
-- Running jobs with a live lease, per type, among the given types.
SELECT type, count(*) AS n FROM conveyor_jobs
WHERE status = 'running' AND lease_expires_at > coalesce(%(now)s::timestamptz, now())
  AND type = ANY(%(types)s::text[])
GROUP BY type;

-- name: running_per_key
-- Running jobs with a live lease, per type and concurrency key, among the given types.
SELECT type, concurrency_key, count(*) AS n FROM conveyor_jobs
WHERE status = 'running' AND lease_expires_at > coalesce(%(now)s::timestamptz, now())
  AND concurrency_key IS NOT NULL AND type = ANY(%(types)s::text[])
GROUP BY type, concurrency_key;

-- name: forget_rate_window
-- Drop starts that have left a type's rate window. Rate windows use the time of the
-- statement, not now() (the transaction's start): a claim may have waited for the
-- type's lock, and the starts it counts must be those of the last second before it.
DELETE FROM conveyor_rate_window
WHERE type = %(type)s
  AND at <= coalesce(%(now)s::timestamptz, statement_timestamp())
            - make_interval(secs => %(window)s);

-- name: rate_window_count
-- Starts of a type inside its rate window.
SELECT count(*) AS n FROM conveyor_rate_window
WHERE type = %(type)s
  AND at > coalesce(%(now)s::timestamptz, statement_timestamp())
           - make_interval(secs => %(window)s);

-- name: record_rate_starts
-- Remember the starts of rate-limited types (one row per start), as late as possible in
-- the claim's transaction: the handlers start right after it commits.
INSERT INTO conveyor_rate_window (type, at)
SELECT type, coalesce(%(now)s::timestamptz, statement_timestamp())
FROM unnest(%(types)s::text[]) AS type;

-- name: claim_candidates
-- Due jobs of the given types in claim order, leaving out (type, key) pairs that are at a
-- limit (types at a limit are left out of %(types)s), locked until the claim commits;
-- rows another worker is claiming are skipped. Each (queue, type) is one range of the
-- claim index, read in claim order, locking up to %(limit)s rows (see claim).
SELECT due.id, due.type, due.concurrency_key, due.tenant
FROM unnest(%(queues)s::text[]) AS wanted (queue)
CROSS JOIN unnest(%(types)s::text[]) AS t (type)
CROSS JOIN LATERAL (
    SELECT id, type, concurrency_key, tenant, priority, run_at FROM conveyor_jobs
    WHERE status = 'queued'
      AND queue = wanted.queue
      AND type = t.type
      AND run_at <= coalesce(%(now)s::timestamptz, now())
      AND (concurrency_key IS NULL
           OR type || chr(31) || concurrency_key <> ALL (%(blocked_keys)s::text[]))
      AND id <> ALL (%(taken)s::text[])
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS due
WHERE wanted.queue NOT IN (SELECT name FROM conveyor_queues WHERE paused)
ORDER BY due.priority, due.run_at, due.id
LIMIT %(limit)s;

-- name: queued_tenants
-- Fair claiming (store/_fairness.py; its queries run up to claim_ids). The tenants that
-- have queued jobs, by name: a loose scan of conveyor_jobs_tenant_claim, one seek per
-- tenant however many jobs each has queued.
WITH RECURSIVE t (tenant) AS (
    SELECT (SELECT min(tenant) FROM conveyor_jobs
            WHERE status = 'queued' AND tenant IS NOT NULL)
    UNION ALL
    SELECT (SELECT min(j.tenant) FROM conveyor_jobs AS j
            WHERE j.status = 'queued' AND j.tenant > t.tenant)
    FROM t WHERE t.tenant IS NOT NULL
)
SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT %(limit)s;

-- name: tenant_candidates
-- Each given tenant's first %(limit)s due jobs of the given types in claim order, per
-- queue (each one a range of conveyor_jobs_tenant_claim, read in order; a tenant's jobs
-- of types the worker lacks are read past), locked until the claim commits; rows another
-- worker is claiming are skipped.
SELECT due.id, due.type, due.concurrency_key, due.tenant
FROM unnest(%(tenants)s::text[]) AS t (tenant)
CROSS JOIN unnest(%(queues)s::text[]) AS wanted (queue)
CROSS JOIN LATERAL (
    SELECT id, type, concurrency_key, tenant, priority, run_at FROM conveyor_jobs
    WHERE status = 'queued'
      AND tenant = t.tenant
      AND queue = wanted.queue
      AND type = ANY(%(types)s::text[])
      AND run_at <= coalesce(%(now)s::timestamptz, now())
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
) AS due
WHERE wanted.queue NOT IN (SELECT name FROM conveyor_queues WHERE paused)
ORDER BY due.tenant, due.priority, due.run_at, due.id;

-- name: running_per_tenant
-- Running jobs with a live lease, per tenant, among the given tenants.
SELECT tenant, count(*) AS n FROM conveyor_jobs
WHERE status = 'running' AND lease_expires_at > coalesce(%(now)s::timestamptz, now())
  AND tenant = ANY(%(tenants)s::text[])
GROUP BY tenant;

-- name: tenant_queued
-- How many jobs a tenant has queued (a range of conveyor_jobs_tenant_claim).
SELECT count(*) AS n FROM conveyor_jobs WHERE status = 'queued' AND tenant = %(tenant)s;

-- name: claim_ids
-- Lease the chosen jobs. They are queued and locked by this transaction (claim_candidates);
-- naming them by id alone keeps the planner on the primary key. The lease starts at
-- clock_timestamp(), after every lock of the transaction was obtained (see claim).
UPDATE conveyor_jobs
SET status = 'running',
    attempt = attempt + 1,
    lease_token = lease_token + 1,
    lease_owner = %(worker_id)s,
    lease_expires_at = coalesce(%(now)s::timestamptz, clock_timestamp())
                       + make_interval(secs => coalesce(lease_seconds, %(lease)s)),
    started_at = coalesce(%(now)s::timestamptz, clock_timestamp()),
    cancel_requested = false
WHERE id = ANY(%(ids)s::text[])
RETURNING *;

-- name: upsert_schedule
-- Create a schedule or update its definition; a changed cron or timezone restarts its ticks.
INSERT INTO conveyor_schedules AS s (
    name, cron, timezone, type, payload, queue, priority, max_attempts, timeout,
    lease_seconds, backoff_base, backoff_cap, catch_up, backfill_limit, grace, overlap,
    enabled, next_run_at, created_at, updated_at
) VALUES (
    %(name)s, %(cron)s, %(timezone)s, %(type)s, %(payload)s::json, %(queue)s, %(priority)s,
    %(max_attempts)s, %(timeout)s, %(lease_seconds)s, %(backoff_base)s, %(backoff_cap)s,
    %(catch_up)s, %(backfill_limit)s, %(grace)s, %(overlap)s, true, %(next_run_at)s,
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now())
)
ON CONFLICT (name) DO UPDATE SET
    next_run_at = CASE WHEN s.cron <> excluded.cron OR s.timezone <> excluded.timezone
                       THEN excluded.next_run_at ELSE s.next_run_at END,
    cron = excluded.cron, timezone = excluded.timezone, type = excluded.type,
    payload = excluded.payload, queue = excluded.queue, priority = excluded.priority,
    max_attempts = excluded.max_attempts, timeout = excluded.timeout,
    lease_seconds = excluded.lease_seconds, backoff_base = excluded.backoff_base,
    backoff_cap = excluded.backoff_cap, catch_up = excluded.catch_up,
    backfill_limit = excluded.backfill_limit, grace = excluded.grace,
    overlap = excluded.overlap, updated_at = excluded.updated_at;

-- name: due_schedules
-- Enabled schedules whose next tick has come, with the time they were read at; one being
-- fired by another worker is skipped.
SELECT s.*, coalesce(%(now)s::timestamptz, now()) AS read_at FROM conveyor_schedules s
WHERE s.enabled AND s.next_run_at <= coalesce(%(now)s::timestamptz, now())
ORDER BY s.next_run_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: advance_schedule
-- Move a schedule to its next tick, only if no other worker did it first.
UPDATE conveyor_schedules SET next_run_at = %(next_run_at)s, last_run_at = %(last_run_at)s,
    skipped_ticks = skipped_ticks + %(skipped)s
WHERE name = %(name)s AND next_run_at = %(expected)s
RETURNING name;

-- name: schedule_run_status
-- The status of the job a schedule fired for its last tick (its id: by primary key). A
-- plain read: the schedule's row lock (due_schedules) already keeps other firers out.
SELECT status FROM conveyor_jobs WHERE id = %(id)s;

-- name: schedules
-- Every schedule, by name.
SELECT * FROM conveyor_schedules ORDER BY name;

-- name: get_schedule
-- One schedule by name.
SELECT * FROM conveyor_schedules WHERE name = %(name)s;

-- name: set_schedule_enabled
-- Enable or disable a schedule; re-enabling restarts its ticks from now.
UPDATE conveyor_schedules
SET enabled = %(enabled)s,
    next_run_at = CASE WHEN %(enabled)s AND NOT enabled THEN %(next_run_at)s
                       ELSE next_run_at END,
    updated_at = coalesce(%(now)s::timestamptz, now())
WHERE name = %(name)s
RETURNING *;

-- name: get_lease
-- A named lease's current row, locked until the transaction ends.
SELECT * FROM conveyor_leases WHERE name = %(name)s FOR UPDATE;

-- name: current_lease
-- A named lease's current row.
SELECT * FROM conveyor_leases WHERE name = %(name)s;

-- name: take_lease
-- Take a named lease that is free or expired, with the next token.
INSERT INTO conveyor_leases AS l (name, owner, token, acquired_at, expires_at)
VALUES (
    %(name)s, %(owner)s, 1, coalesce(%(now)s::timestamptz, now()),
    coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl)s)
)
ON CONFLICT (name) DO UPDATE SET
    owner = excluded.owner, token = l.token + 1, acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at
WHERE l.owner IS NULL OR l.expires_at <= coalesce(%(now)s::timestamptz, now())
RETURNING *;

-- name: renew_lease
-- Extend a named lease, fenced by its token.
UPDATE conveyor_leases
SET expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(ttl)s)
WHERE name = %(name)s AND token = %(token)s AND owner IS NOT NULL
  AND expires_at > coalesce(%(now)s::timestamptz, now())
RETURNING expires_at;

-- name: release_lease
-- Give a named lease up, fenced by its token; says whether it had expired already.
UPDATE conveyor_leases SET owner = NULL, expires_at = NULL
WHERE name = %(name)s AND token = %(token)s AND owner IS NOT NULL
RETURNING acquired_at, coalesce(%(now)s::timestamptz, now()) AS released_at;

-- name: record_lease_end
-- Keep a past holder of a named lease.
INSERT INTO conveyor_lease_history (name, token, owner, acquired_at, ended_at, ended)
VALUES (%(name)s, %(token)s, %(owner)s, %(acquired_at)s, %(ended_at)s, %(ended)s)
ON CONFLICT (name, token) DO UPDATE SET
    owner = excluded.owner, acquired_at = excluded.acquired_at,
    ended_at = excluded.ended_at, ended = excluded.ended;

-- name: trim_lease_history
-- Keep only the last ten holders of a named lease.
DELETE FROM conveyor_lease_history
WHERE name = %(name)s AND token <= (
    SELECT token FROM conveyor_lease_history WHERE name = %(name)s
    ORDER BY token DESC LIMIT 1 OFFSET 10
);

-- name: lease_history
-- The last holders of a named lease, newest first.
SELECT * FROM conveyor_lease_history WHERE name = %(name)s ORDER BY token DESC;

-- name: prunable_roots
-- Finished top-level jobs older than their retention, of one status, for one type or all
-- others, with nothing unfinished below them; roots another pruner holds are skipped.
SELECT r.id FROM conveyor_jobs r
WHERE r.parent_id IS NULL AND r.status = %(status)s
  AND r.finished_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(keep)s)
  AND (%(type)s::text IS NULL OR r.type = %(type)s::text)
  AND r.type <> ALL (%(excluded_types)s::text[])
  AND NOT EXISTS (
      SELECT 1 FROM conveyor_jobs d
      WHERE d.root_id = r.id AND d.status IN ('pending', 'queued', 'running', 'waiting')
  )
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: prune_attempts
-- Delete the attempts of the given trees' finished jobs.
DELETE FROM conveyor_attempts WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE (id = ANY(%(roots)s::text[]) OR root_id = ANY(%(roots)s::text[]))
      AND status IN ('succeeded', 'failed', 'cancelled')
);

-- name: prune_dependencies
-- Delete the dependency edges of the given trees' finished jobs.
DELETE FROM conveyor_dependencies WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE (id = ANY(%(roots)s::text[]) OR root_id = ANY(%(roots)s::text[]))
      AND status IN ('succeeded', 'failed', 'cancelled')
);

-- name: prune_counts
-- Delete the counts of the given trees' finished jobs.
DELETE FROM conveyor_job_counts WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE (id = ANY(%(roots)s::text[]) OR root_id = ANY(%(roots)s::text[]))
      AND status IN ('succeeded', 'failed', 'cancelled')
);

-- name: prune_callbacks
-- Delete the callbacks of the given trees' finished jobs.
DELETE FROM conveyor_callbacks WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE (id = ANY(%(roots)s::text[]) OR root_id = ANY(%(roots)s::text[]))
      AND status IN ('succeeded', 'failed', 'cancelled')
);

-- name: prune_events
-- Delete the events of the given trees' finished jobs.
DELETE FROM conveyor_job_events WHERE job_id IN (
    SELECT id FROM conveyor_jobs
    WHERE (id = ANY(%(roots)s::text[]) OR root_id = ANY(%(roots)s::text[]))
      AND status IN ('succeeded', 'failed', 'cancelled')
);

-- name: prune_trees
-- Delete the given trees' finished jobs.
DELETE FROM conveyor_jobs
WHERE (id = ANY(%(roots)s::text[]) OR root_id = ANY(%(roots)s::text[]))
  AND status IN ('succeeded', 'failed', 'cancelled')
RETURNING id;

-- name: page_jobs_newest_first
-- One page of jobs of every tenant, newest first, after the last (created_at, id) seen.
SELECT * FROM conveyor_jobs
WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(parent_id)s::text IS NULL OR parent_id = %(parent_id)s::text)
  AND (%(root_id)s::text IS NULL OR root_id = %(root_id)s::text)
  AND (NOT %(top_level)s OR parent_id IS NULL)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(after_id)s::text IS NULL
       OR (created_at, id) < (%(after_created)s::timestamptz, %(after_id)s::text))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: page_jobs_oldest_first
-- One page of jobs of every tenant, oldest first, after the last (created_at, id) seen.
SELECT * FROM conveyor_jobs
WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(parent_id)s::text IS NULL OR parent_id = %(parent_id)s::text)
  AND (%(root_id)s::text IS NULL OR root_id = %(root_id)s::text)
  AND (NOT %(top_level)s OR parent_id IS NULL)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(after_id)s::text IS NULL
       OR (created_at, id) > (%(after_created)s::timestamptz, %(after_id)s::text))
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: page_tenant_jobs_newest_first
-- One page of one tenant's jobs, newest first (on the tenant's own index).
SELECT * FROM conveyor_jobs
WHERE tenant = %(tenant)s::text
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(parent_id)s::text IS NULL OR parent_id = %(parent_id)s::text)
  AND (%(root_id)s::text IS NULL OR root_id = %(root_id)s::text)
  AND (NOT %(top_level)s OR parent_id IS NULL)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(after_id)s::text IS NULL
       OR (created_at, id) < (%(after_created)s::timestamptz, %(after_id)s::text))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: page_tenant_jobs_oldest_first
-- One page of one tenant's jobs, oldest first (on the tenant's own index).
SELECT * FROM conveyor_jobs
WHERE tenant = %(tenant)s::text
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(type)s::text IS NULL OR type = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(parent_id)s::text IS NULL OR parent_id = %(parent_id)s::text)
  AND (%(root_id)s::text IS NULL OR root_id = %(root_id)s::text)
  AND (NOT %(top_level)s OR parent_id IS NULL)
  AND (%(created_after)s::timestamptz IS NULL OR created_at >= %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(after_id)s::text IS NULL
       OR (created_at, id) > (%(after_created)s::timestamptz, %(after_id)s::text))
ORDER BY created_at, id
LIMIT %(limit)s;

-- name: health
-- The counts the health check decides from, in one read, with the time they were read.
SELECT
    (SELECT count(*) FROM conveyor_jobs WHERE status = 'queued') AS queued,
    (SELECT count(*) FROM conveyor_jobs
     WHERE status = 'queued' AND run_at <= coalesce(%(now)s::timestamptz, now())) AS due,
    -- A running job always holds a lease: saying so lets the count use the lease index.
    (SELECT count(*) FROM conveyor_jobs
     WHERE status = 'running' AND lease_expires_at IS NOT NULL) AS running,
    (SELECT count(*) FROM conveyor_jobs
     WHERE status = 'running'
       AND lease_expires_at < coalesce(%(now)s::timestamptz, now())) AS stale_running,
    (SELECT count(*) FROM conveyor_workers) AS workers,
    -- Live: not stopped, and heartbeating within its own lease. Dead: not stopped, but
    -- silent for longer than its lease (killed, frozen or cut off).
    (SELECT count(*) FROM conveyor_workers
     WHERE stopped_at IS NULL
       AND heartbeat_at >= coalesce(%(now)s::timestamptz, now())
                           - lease_seconds * interval '1 second') AS live_workers,
    (SELECT max(heartbeat_at) FROM conveyor_workers) AS last_heartbeat,
    coalesce(%(now)s::timestamptz, now()) AS now,
    (SELECT count(*) FROM conveyor_workers
     WHERE stopped_at IS NULL
       AND heartbeat_at < coalesce(%(now)s::timestamptz, now())
                          - lease_seconds * interval '1 second'
       -- A death older than the worker's forget window no longer counts, even before
       -- the duty that forgets it has run.
       AND heartbeat_at >= coalesce(%(now)s::timestamptz, now())
                           - forget_seconds * interval '1 second') AS dead_workers;

-- name: create_token
-- Store a new API token.
INSERT INTO conveyor_tokens (id, tenant, role, secret_hash, name, created_at, expires_at)
VALUES (%(id)s, %(tenant)s, %(role)s, %(secret_hash)s, %(name)s, %(created_at)s,
        %(expires_at)s);

-- name: find_token
-- One token by id.
SELECT * FROM conveyor_tokens WHERE id = %(id)s;

-- name: touch_token
-- Record that a token was just used.
UPDATE conveyor_tokens SET last_used_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s;

-- name: revoke_token
-- Revoke a token; revoking it again keeps the first time.
UPDATE conveyor_tokens SET revoked_at = coalesce(revoked_at, %(now)s::timestamptz, now())
WHERE id = %(id)s
RETURNING *;

-- name: list_tokens
-- Every token, newest first.
SELECT * FROM conveyor_tokens ORDER BY created_at DESC, id;

-- name: rotate_token
-- Give a live token a new secret; the old one keeps working until :grace_until (NULL: not).
UPDATE conveyor_tokens SET
    previous_hash = CASE WHEN %(grace_until)s::timestamptz IS NULL THEN NULL
                         ELSE secret_hash END,
    previous_expires_at = %(grace_until)s::timestamptz,
    secret_hash = %(secret_hash)s
WHERE id = %(id)s AND revoked_at IS NULL
RETURNING *;

-- name: server_secret
-- A secret of this database's servers, made by a migration.
SELECT value FROM conveyor_secrets WHERE name = %(name)s;

-- name: database_identity
-- Which database a connection is on: its name and its server's start time, which tells
-- two servers apart when their databases have the same name.
SELECT current_database() AS database, pg_postmaster_start_time() AS started;

-- name: queue_lag
-- Per queue: queued jobs whose run_at has passed, and how long the oldest of them waits.
SELECT queue, count(*) AS due,
       extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(run_at))::float8
           AS oldest_age
FROM conveyor_jobs
WHERE status = 'queued' AND run_at <= coalesce(%(now)s::timestamptz, now())
GROUP BY queue;

-- name: record_audit
-- Append an entry to the audit log.
INSERT INTO conveyor_audit (at, tenant, token_id, action, target, detail)
VALUES (coalesce(%(at)s, now()), %(tenant)s, %(token_id)s, %(action)s, %(target)s, %(detail)s);

-- name: audit_log
-- Audit entries of every tenant, newest first, before an id.
SELECT * FROM conveyor_audit
WHERE (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
ORDER BY id DESC LIMIT %(limit)s;

-- name: tenant_audit_log
-- One tenant's audit entries, newest first, before an id.
SELECT * FROM conveyor_audit
WHERE tenant = %(tenant)s AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s)
ORDER BY id DESC LIMIT %(limit)s;

-- name: minute_stats
-- Per minute since :since: jobs that ended succeeded or failed and their mean queue wait
-- (an index-only range of conveyor_jobs_finished_at).
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       extract(epoch FROM avg(started_at - run_at))::float8 AS wait
FROM conveyor_jobs
WHERE finished_at IS NOT NULL AND finished_at >= %(since)s
GROUP BY 1
ORDER BY 1;

-- name: tenant_minute_stats
-- One tenant's minute_stats: the same range of conveyor_jobs_finished_at, its rows only.
SELECT date_trunc('minute', finished_at) AS minute,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'failed') AS failed,
       extract(epoch FROM avg(started_at - run_at))::float8 AS wait
FROM conveyor_jobs
WHERE finished_at IS NOT NULL AND finished_at >= %(since)s AND tenant = %(tenant)s
GROUP BY 1
ORDER BY 1;

-- name: lease_names
-- Names of the named leases ever taken.
SELECT name FROM conveyor_leases ORDER BY name LIMIT %(limit)s;

-- name: tenant_running_by_worker
-- One tenant's running jobs per worker (on conveyor_jobs_leases, partial on held leases).
SELECT lease_owner, count(*) AS n FROM conveyor_jobs
WHERE lease_expires_at IS NOT NULL AND status = 'running' AND tenant = %(tenant)s
GROUP BY lease_owner;

-- name: running_by_worker
-- Running jobs per worker (on conveyor_jobs_leases, partial on held leases).
SELECT lease_owner, count(*) AS n FROM conveyor_jobs
WHERE lease_expires_at IS NOT NULL AND status = 'running'
GROUP BY lease_owner;
