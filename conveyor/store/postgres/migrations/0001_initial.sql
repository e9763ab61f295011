-- The jobs, their attempts, the workers and the queues; and the notifications that wake
-- idle workers. Times are timestamptz; durations are seconds (double precision).
-- Payloads, states and results are json, not jsonb, so they come back exactly as written
-- (key order, number formatting), as they do on SQLite.
CREATE TABLE conveyor_jobs (
    id                text PRIMARY KEY,
    type              text NOT NULL,
    queue             text NOT NULL,
    tenant            text,
    payload           json NOT NULL,
    status            text NOT NULL CHECK (
        status IN ('pending', 'queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled')
    ),
    priority          integer NOT NULL DEFAULT 0,
    attempt           integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL,
    run_at            timestamptz NOT NULL,
    timeout           double precision,
    lease_seconds     double precision,
    backoff_base      double precision NOT NULL,
    backoff_cap       double precision NOT NULL,
    progress_done     double precision,
    progress_total    double precision,
    progress_message  text,
    state             json,
    result            json,
    result_ref        text,
    error             text,
    parent_id         text,
    root_id           text,
    depends_on        text[],
    unique_key        text,
    concurrency_key   text,
    retry_of          text,
    created_at        timestamptz NOT NULL,
    started_at        timestamptz,
    finished_at       timestamptz,
    lease_owner       text,
    lease_expires_at  timestamptz,
    lease_token       bigint NOT NULL DEFAULT 0,
    cancel_requested  boolean NOT NULL DEFAULT false
);

-- Claims read only queued rows, one queue at a time, in claim order: the cost of a claim
-- stays flat however many jobs wait.
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
    job_id       text NOT NULL,
    number       integer NOT NULL,
    worker_id    text,
    started_at   timestamptz,
    finished_at  timestamptz,
    outcome      text NOT NULL,
    error        text,
    traceback    text,
    PRIMARY KEY (job_id, number)
);

CREATE TABLE conveyor_workers (
    id            text PRIMARY KEY,
    hostname      text NOT NULL,
    pid           integer NOT NULL,
    queues        text[] NOT NULL,
    concurrency   integer NOT NULL,
    started_at    timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    stopped_at    timestamptz
);

CREATE TABLE conveyor_queues (
    name       text PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    paused_at  timestamptz
);

-- Wake-ups. Whatever makes a job runnable (a submit, a retry, a hand-back, a rescue, a
-- resumed queue) notifies channel conveyor_job_ready with the queue's name, and a cancel
-- request for a running job notifies conveyor_cancel with the job's id. Triggers rather
-- than explicit pg_notify calls, so that every path wakes workers, a submit made in the
-- application's own transaction included; the notification is delivered on commit.
CREATE FUNCTION conveyor_notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('conveyor_job_ready', queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'queued') AS ready;
    RETURN NULL;
END
$$;

CREATE TRIGGER conveyor_jobs_inserted
    AFTER INSERT ON conveyor_jobs
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION conveyor_notify_inserted();

CREATE FUNCTION conveyor_notify_requeued() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('conveyor_job_ready', NEW.queue);
    RETURN NULL;
END
$$;

CREATE TRIGGER conveyor_jobs_requeued
    AFTER UPDATE OF status ON conveyor_jobs
    FOR EACH ROW WHEN (NEW.status = 'queued' AND OLD.status <> 'queued')
    EXECUTE FUNCTION conveyor_notify_requeued();

CREATE FUNCTION conveyor_notify_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('conveyor_cancel', NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER conveyor_jobs_cancel_requested
    AFTER UPDATE OF cancel_requested ON conveyor_jobs
    FOR EACH ROW WHEN (NEW.cancel_requested AND NOT OLD.cancel_requested)
    EXECUTE FUNCTION conveyor_notify_cancel();

CREATE FUNCTION conveyor_notify_resumed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('conveyor_job_ready', NEW.name);
    RETURN NULL;
END
$$;

CREATE TRIGGER conveyor_queues_resumed
    AFTER UPDATE OF paused ON conveyor_queues
    FOR EACH ROW WHEN (OLD.paused AND NOT NEW.paused)
    EXECUTE FUNCTION conveyor_notify_resumed();
