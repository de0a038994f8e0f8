-- Throttle metrics (PostgreSQL). migrations/sqlite/0002_metrics.sql is the same schema in
-- SQLite's dialect.
--
-- What proxies report (`POST /api/v1/reports`) is aggregated in memory and written here in
-- batches every ~2 s: exact counts per time bucket at three resolutions (`resolution` in
-- seconds: 10, 60 or 3600; `bucket_ms` is the bucket's start in Unix milliseconds), and
-- per rule and bucket the 50 most throttled clients. A retention task deletes buckets
-- older than each resolution's retention. Rule ids are kept as reported, also for rules
-- deleted since.

-- Per rule, summed over all proxies: what charts, rule tables and the overview read.
CREATE TABLE metric_rule_buckets (
    resolution BIGINT NOT NULL,
    bucket_ms BIGINT NOT NULL,
    rule_id TEXT NOT NULL,
    allowed BIGINT NOT NULL,
    denied BIGINT NOT NULL,
    shadow_denied BIGINT NOT NULL,
    near_limit BIGINT NOT NULL,
    fail_open BIGINT NOT NULL,
    key_missing BIGINT NOT NULL,
    PRIMARY KEY (resolution, bucket_ms, rule_id)
);

-- Per proxy and rule, for views of one proxy (`?proxy=`).
CREATE TABLE metric_proxy_buckets (
    resolution BIGINT NOT NULL,
    proxy_id TEXT NOT NULL,
    bucket_ms BIGINT NOT NULL,
    rule_id TEXT NOT NULL,
    allowed BIGINT NOT NULL,
    denied BIGINT NOT NULL,
    shadow_denied BIGINT NOT NULL,
    near_limit BIGINT NOT NULL,
    fail_open BIGINT NOT NULL,
    key_missing BIGINT NOT NULL,
    PRIMARY KEY (resolution, proxy_id, bucket_ms, rule_id)
);
-- For the retention task, which deletes by time across proxies.
CREATE INDEX metric_proxy_buckets_by_time ON metric_proxy_buckets (resolution, bucket_ms);

-- The most throttled clients of a rule in a bucket, merged over proxies (Space-Saving
-- summaries: `throttled` is an upper bound, `error` how much of it may belong to others).
CREATE TABLE metric_clients (
    resolution BIGINT NOT NULL,
    bucket_ms BIGINT NOT NULL,
    rule_id TEXT NOT NULL,
    client TEXT NOT NULL,
    throttled BIGINT NOT NULL,
    error BIGINT NOT NULL,
    PRIMARY KEY (resolution, bucket_ms, rule_id, client)
);
-- For one client's history (`/api/v1/metrics/clients/{client}`).
CREATE INDEX metric_clients_by_client ON metric_clients (resolution, client, bucket_ms);
