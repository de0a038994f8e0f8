-- LLM token counts beside request counts (issue #29). migrations/sqlite/0004_token_counts.sql
-- is the same change in SQLite's dialect.
--
-- Per rule (and per proxy and rule): tokens the rule's allowed requests used, as their
-- responses reported, and tokens its throttled requests asked for. Per throttled client:
-- the tokens its throttled requests asked for (an upper bound, like `throttled`). Rows
-- written before this migration hold 0: no token counts were kept then.
ALTER TABLE metric_rule_buckets ADD COLUMN tokens_used BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_rule_buckets ADD COLUMN tokens_throttled BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_proxy_buckets ADD COLUMN tokens_used BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_proxy_buckets ADD COLUMN tokens_throttled BIGINT NOT NULL DEFAULT 0;
ALTER TABLE metric_clients ADD COLUMN tokens BIGINT NOT NULL DEFAULT 0;
