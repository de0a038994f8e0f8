-- Dashboard sign-in sessions. A browser holds a random session id in an HttpOnly cookie;
-- only its SHA-256 is stored, like tokens. A session acts as the token that opened it, so
-- revoking the token ends its sessions too. `expires_at` slides forward with use.
CREATE TABLE sessions (
    id_hash TEXT PRIMARY KEY,
    token_id TEXT NOT NULL REFERENCES tokens (id),
    created_at BIGINT NOT NULL,
    last_seen BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX sessions_expires_at ON sessions (expires_at);
CREATE INDEX sessions_token_id ON sessions (token_id);
