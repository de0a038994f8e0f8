-- Shaping counts beside request and token counts (issue #30). migrations/sqlite/0005_shaping_counts.sql
-- is the same change in SQLite's dialect.
--
-- Per rule (and per proxy and rule): requests admitted with a warning (soft limit or warn
-- mode), requests delayed until their tokens were due and the milliseconds they waited
-- (summed), and requests refused by an in-flight limit. Warned and delayed requests are
-- also in `allowed`, in-flight refusals also in `denied` (docs/shaping.md#statistics).
-- Rows written before this migration hold 0: no shaping counts were kept then.
ALTER TABLE metric_rule_buckets ADD COLUMN warned BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_rule_buckets ADD COLUMN delayed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_rule_buckets ADD COLUMN in_flight_refused BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_rule_buckets ADD COLUMN delay_wait_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_proxy_buckets ADD COLUMN warned BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_proxy_buckets ADD COLUMN delayed BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_proxy_buckets ADD COLUMN in_flight_refused BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_proxy_buckets ADD COLUMN delay_wait_ms BIGINT NOT NULL DEFAULT 0;
