-- Sluice admin API schema (SQLite). migrations/postgres/0001_initial.sql is the same
-- schema in PostgreSQL's dialect; the two folders keep the same numbering.
--
-- Times are Unix milliseconds (BIGINT) and documents are JSON text, so one set of
-- portable queries serves both databases.

-- The current ruleset version. One row; every change bumps it first, which also takes
-- the write lock that serialises changes (SQLite's database lock, PostgreSQL's row lock).
CREATE TABLE ruleset_head (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    version BIGINT NOT NULL
);
INSERT INTO ruleset_head (id, version) VALUES (1, 0);

-- The rules as they are now. `spec` is the RuleSpec JSON; the other columns are copies
-- for filtering and ordering. `revision` is the ruleset version that last changed the
-- rule, so it never repeats, even for a rule deleted and created again.
CREATE TABLE rules (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    enabled BOOLEAN NOT NULL,
    mode TEXT NOT NULL,
    priority BIGINT NOT NULL,
    spec TEXT NOT NULL,
    revision BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- One row per ruleset version (1, 2, ...), with a snapshot of the whole ruleset: diffs
-- and rollbacks read two snapshots, proxies read the newest.
CREATE TABLE ruleset_versions (
    version BIGINT PRIMARY KEY,
    created_at BIGINT NOT NULL,
    actor_id TEXT,
    actor_name TEXT NOT NULL,
    action TEXT NOT NULL,
    summary TEXT NOT NULL,
    rule_count BIGINT NOT NULL,
    rules TEXT NOT NULL
);

-- Who did what, when. `before`/`after` are JSON (rule specs, or maps of changed rules
-- for bulk changes); token entries never carry a secret or a hash.
CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at BIGINT NOT NULL,
    actor_id TEXT,
    actor_name TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT,
    version BIGINT,
    before_json TEXT,
    after_json TEXT
);

-- API tokens. Only the SHA-256 of a token is kept: the secret is shown once, at creation.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL CHECK (role IN ('admin', 'editor', 'viewer', 'proxy')),
    hash TEXT NOT NULL UNIQUE,
    created_at BIGINT NOT NULL,
    created_by TEXT NOT NULL,
    last_used_at BIGINT,
    revoked_at BIGINT
);

-- Proxies as seen by the ruleset long-poll.
CREATE TABLE proxies (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    token_id TEXT,
    first_seen BIGINT NOT NULL,
    last_seen BIGINT NOT NULL,
    ruleset_version BIGINT NOT NULL,
    last_error TEXT
);
