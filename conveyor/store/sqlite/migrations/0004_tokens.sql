-- API tokens: each bound to a tenant and a role; only a digest of the secret is kept.
CREATE TABLE conveyor_tokens (
    id            TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    secret_hash   TEXT NOT NULL,
    name          TEXT,
    created_at    REAL NOT NULL,
    last_used_at  REAL,
    revoked_at    REAL
);

-- The API lists jobs in creation order, a page at a time from the last (created_at, id)
-- seen: these indexes keep a page cheap however many jobs there are, for all tenants and
-- for one tenant.
CREATE INDEX conveyor_jobs_created ON conveyor_jobs (created_at, id);
CREATE INDEX conveyor_jobs_tenant_created ON conveyor_jobs (tenant, created_at, id)
    WHERE tenant IS NOT NULL;
