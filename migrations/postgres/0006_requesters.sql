-- The clients sending each rule the most requests, per 10 s bucket (issue #32: rule dry
-- runs), in PostgreSQL's dialect; migrations/sqlite/0006_requesters.sql is the same change in
-- the other.
--
-- Merged over proxies like `metric_clients` (Space-Saving summaries: `requests` is an upper
-- bound, `error` how much of it may belong to others) and trimmed to the same 50 per rule
-- and bucket, but counting every request the rule decided, whatever its outcome: what a
-- dry run replays through a rule's new limits. Only the 10 s resolution is kept (a dry
-- run reads the last hour), deleted by the same retention and row cap as the other tables.
CREATE TABLE metric_requesters (
    resolution BIGINT NOT NULL,
    bucket_ms BIGINT NOT NULL,
    rule_id TEXT NOT NULL,
    client TEXT NOT NULL,
    requests BIGINT NOT NULL,
    error BIGINT NOT NULL,
    PRIMARY KEY (resolution, bucket_ms, rule_id, client)
);
