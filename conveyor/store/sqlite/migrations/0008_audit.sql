-- The audit log: every action taken through the API or the dashboard.
CREATE TABLE conveyor_audit (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    at        REAL NOT NULL,
    tenant    TEXT NOT NULL,
    token_id  TEXT NOT NULL,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL,
    detail    TEXT
);
CREATE INDEX conveyor_audit_tenant ON conveyor_audit (tenant, id);

-- The dashboard's per-minute figures (ended, failed, queue wait) read a range of this
-- index by finished_at and nothing else (it covers the columns they need). It is one more
-- index write per settle.
CREATE INDEX conveyor_jobs_finished_at ON conveyor_jobs (finished_at, status, started_at, run_at)
    WHERE finished_at IS NOT NULL;
