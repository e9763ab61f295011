-- API tokens: each bound to a tenant and a role; only a digest of the secret is kept.
CREATE TABLE conveyor_tokens (
    id            text PRIMARY KEY,
    tenant        text NOT NULL,
    role          text NOT NULL CHECK (role IN ('read', 'write', 'admin')),
    secret_hash   text NOT NULL,
    name          text,
    created_at    timestamptz NOT NULL,
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

-- The API lists jobs in creation order, a page at a time from the last (created_at, id)
-- seen: these indexes keep a page cheap however many jobs there are, for all tenants and
-- for one tenant.
CREATE INDEX conveyor_jobs_created ON conveyor_jobs (created_at, id);
CREATE INDEX conveyor_jobs_tenant_created ON conveyor_jobs (tenant, created_at, id)
    WHERE tenant IS NOT NULL;
