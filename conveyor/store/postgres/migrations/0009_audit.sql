-- The audit log: every action taken through the API or the dashboard.
CREATE TABLE conveyor_audit (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL,
    tenant    text NOT NULL,
    token_id  text NOT NULL,
    action    text NOT NULL,
    target    text NOT NULL,
    detail    text
);
CREATE INDEX conveyor_audit_tenant ON conveyor_audit (tenant, id);

-- The dashboard's per-minute figures (ended, failed, queue wait) read a range of this
-- index by finished_at, index-only (it includes the columns they need). It is one more
-- index write per settle.
CREATE INDEX conveyor_jobs_finished_at ON conveyor_jobs (finished_at)
    INCLUDE (status, started_at, run_at) WHERE finished_at IS NOT NULL;
