-- API tokens may expire (expires_at; NULL: never). A rotated token keeps working with its
-- previous secret until previous_expires_at (NULL: the previous secret no longer works).
ALTER TABLE conveyor_tokens ADD COLUMN expires_at timestamptz;
ALTER TABLE conveyor_tokens ADD COLUMN previous_hash text;
ALTER TABLE conveyor_tokens ADD COLUMN previous_expires_at timestamptz;

-- Secrets of the servers of this database, made here once: the API signs its list cursors
-- with 'cursor', so that every server behind one load balancer accepts the others'.
-- gen_random_uuid() draws from the server's strong random source (122 bits each).
CREATE TABLE conveyor_secrets (
    name   text PRIMARY KEY,
    value  text NOT NULL
);
INSERT INTO conveyor_secrets (name, value)
VALUES ('cursor', replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''));
