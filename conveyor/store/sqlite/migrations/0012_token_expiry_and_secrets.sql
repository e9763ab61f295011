-- API tokens may expire (expires_at; NULL: never). A rotated token keeps working with its
-- previous secret until previous_expires_at (NULL: the previous secret no longer works).
ALTER TABLE conveyor_tokens ADD COLUMN expires_at REAL;
ALTER TABLE conveyor_tokens ADD COLUMN previous_hash TEXT;
ALTER TABLE conveyor_tokens ADD COLUMN previous_expires_at REAL;

-- Secrets of the servers of this database, made here once: the API signs its list cursors
-- with 'cursor', so that every server behind one load balancer accepts the others'.
CREATE TABLE conveyor_secrets (
    name   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
INSERT INTO conveyor_secrets (name, value) VALUES ('cursor', lower(hex(randomblob(32))));
