//! Writing metrics: the flusher's batches and bulk loads, each row added to what is
//! stored ([`AdditiveRow`]), and retention's deletes.

use sqlx::{Any, Transaction};

use super::buckets::Resolution;
use super::params::{Params, ROWS_PER_STATEMENT};
use super::rows::{
    AdditiveRow, ClientBucket, METRIC_TABLES, MetricsBatch, RequesterBucket, TOP_CLIENTS_PER_BUCKET,
};
use crate::store::{Backend, Store, StoreError, to_i64};

/// Buckets deleted per retention statement, so a large backlog is deleted in short
/// transactions that let the flusher in between.
const BUCKETS_PER_DELETE: i64 = 64;

impl Store {
    /// Adds a batch to the stored metrics in one transaction. `before_commit` runs after
    /// every statement succeeded, just before the commit (the pipeline uses it to tell
    /// readers that the batch is about to become visible).
    pub(crate) async fn write_metrics(
        &self,
        batch: &MetricsBatch,
        before_commit: impl FnOnce(),
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert_rows(&mut tx, self.backend, batch).await?;
        let touched = batch
            .clients
            .iter()
            .map(|r| (r.resolution, r.bucket_ms, r.rule.as_str()));
        trim_to_top::<ClientBucket>(&mut tx, "throttled", touched).await?;
        let touched =
            (batch.requesters.iter()).map(|r| (r.resolution, r.bucket_ms, r.rule.as_str()));
        trim_to_top::<RequesterBucket>(&mut tx, "requests", touched).await?;
        for beat in &batch.beats {
            // A report is a sign of life: last_seen moves forward. Address, token and
            // version are the polls' to keep current; a proxy that reports before it ever
            // polled gets them from its report.
            sqlx::query(
                "INSERT INTO proxies (id, address, token_id, first_seen, last_seen, ruleset_version, last_error) \
                 VALUES ($1, $2, $3, $4, $4, $5, NULL) \
                 ON CONFLICT (id) DO UPDATE SET last_seen = CASE \
                 WHEN excluded.last_seen > proxies.last_seen THEN excluded.last_seen \
                 ELSE proxies.last_seen END",
            )
            .bind(&beat.id)
            .bind(&beat.address)
            .bind(beat.token_id.clone())
            .bind(beat.at_ms)
            .bind(to_i64(beat.ruleset_version))
            .execute(&mut *tx)
            .await?;
        }
        before_commit();
        tx.commit().await?;
        Ok(())
    }

    /// Adds rows in one transaction without trimming buckets to their top clients (the
    /// caller keeps to [`TOP_CLIENTS_PER_BUCKET`] per bucket and rule) and without signs
    /// of life: for loading history in bulk (the ingest benchmark's week of data).
    pub async fn load_metrics(&self, batch: &MetricsBatch) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert_rows(&mut tx, self.backend, batch).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Deletes the buckets of `resolution` that start before `cutoff_ms`, in short
    /// transactions of at most [`BUCKETS_PER_DELETE`] buckets, at most `max_statements`
    /// of them (the rest waits for the next run). Returns the rows deleted.
    pub(crate) async fn delete_metrics_before(
        &self,
        resolution: Resolution,
        cutoff_ms: i64,
        max_statements: usize,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for table in METRIC_TABLES {
            for _ in 0..max_statements {
                // The newest of the oldest few buckets: everything up to it goes.
                let upto: Option<i64> = sqlx::query_scalar(&format!(
                    "SELECT MAX(bucket_ms) FROM (SELECT DISTINCT bucket_ms FROM {table} \
                     WHERE resolution = $1 AND bucket_ms < $2 ORDER BY bucket_ms LIMIT $3) AS oldest"
                ))
                .bind(resolution.seconds())
                .bind(cutoff_ms)
                .bind(BUCKETS_PER_DELETE)
                .fetch_one(&self.pool)
                .await?;
                let Some(upto) = upto else { break };
                deleted += sqlx::query(&format!(
                    "DELETE FROM {table} WHERE resolution = $1 AND bucket_ms <= $2"
                ))
                .bind(resolution.seconds())
                .bind(upto)
                .execute(&self.pool)
                .await?
                .rows_affected();
            }
        }
        Ok(deleted)
    }

    /// Keeps each metrics table at or under `max_rows` rows: a table over it loses its
    /// oldest buckets (by start, of any resolution), whole, until it is at most
    /// `max_rows`; a few rows more go when the last bucket deleted is shared. Returns, per
    /// table (in [`METRIC_TABLES`]' order), the rows deleted and the newest bucket start
    /// deleted.
    pub(crate) async fn prune_metrics_over(
        &self,
        max_rows: u64,
    ) -> Result<[(u64, Option<i64>); 4], StoreError> {
        let mut out = [(0, None); 4];
        for (slot, table) in out.iter_mut().zip(METRIC_TABLES) {
            let rows = self.count(table).await?;
            let Some(excess) = rows.checked_sub(max_rows).filter(|&n| n > 0) else {
                continue;
            };
            // The bucket holding the excess-th oldest row: it and everything older go.
            let upto: Option<i64> = sqlx::query_scalar(&format!(
                "SELECT bucket_ms FROM {table} ORDER BY bucket_ms LIMIT 1 OFFSET $1"
            ))
            .bind(to_i64(excess - 1))
            .fetch_optional(&self.pool)
            .await?;
            let Some(upto) = upto else { continue };
            let deleted = sqlx::query(&format!("DELETE FROM {table} WHERE bucket_ms <= $1"))
                .bind(upto)
                .execute(&self.pool)
                .await?
                .rows_affected();
            *slot = (deleted, Some(upto));
        }
        Ok(out)
    }

    /// Rows stored per table, for tests and benchmarks.
    pub async fn metric_row_counts(&self) -> Result<[u64; 4], StoreError> {
        let mut out = [0; 4];
        for (slot, table) in out.iter_mut().zip(METRIC_TABLES) {
            *slot = self.count(table).await?;
        }
        Ok(out)
    }
}

/// Adds a batch's rule, proxy and client rows to their tables.
async fn upsert_rows(
    tx: &mut Transaction<'static, Any>,
    backend: Backend,
    batch: &MetricsBatch,
) -> Result<(), StoreError> {
    upsert(tx, backend, &batch.rules).await?;
    upsert(tx, backend, &batch.proxies).await?;
    upsert(tx, backend, &batch.clients).await?;
    upsert(tx, backend, &batch.requesters).await
}

/// `INSERT ... ON CONFLICT (key) DO UPDATE SET counter = stored + new` for `rows` rows.
fn upsert_sql<R: AdditiveRow>(backend: Backend, rows: usize) -> String {
    let columns: Vec<&str> = R::KEY.iter().chain(R::COUNTERS).copied().collect();
    let table = R::TABLE;
    let add = R::COUNTERS
        .iter()
        .map(|c| format!("{c} = {table}.{c} + excluded.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "INSERT INTO {table} ({}) VALUES {} ON CONFLICT ({}) DO UPDATE SET {add}",
        columns.join(", "),
        Params::new(backend).values(rows, columns.len()),
        R::KEY.join(", "),
    )
}

/// Adds `rows` to their table, [`ROWS_PER_STATEMENT`] rows per statement.
async fn upsert<R: AdditiveRow>(
    tx: &mut Transaction<'static, Any>,
    backend: Backend,
    rows: &[R],
) -> Result<(), StoreError> {
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let sql = upsert_sql::<R>(backend, chunk.len());
        let mut query = sqlx::query(&sql);
        for row in chunk {
            query = row.bind(query);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Trims every (resolution, bucket, rule) in `touched` of `R`'s table back to its
/// [`TOP_CLIENTS_PER_BUCKET`] clients with the most `by` (the most throttled clients, or
/// the clients with the most requests).
async fn trim_to_top<'a, R: AdditiveRow>(
    tx: &mut Transaction<'static, Any>,
    by: &str,
    touched: impl Iterator<Item = (Resolution, i64, &'a str)>,
) -> Result<(), StoreError> {
    let mut touched: Vec<(Resolution, i64, &str)> = touched.collect();
    touched.sort_unstable();
    touched.dedup();
    let table = R::TABLE;
    let sql = format!(
        "DELETE FROM {table} WHERE resolution = $1 AND bucket_ms = $2 AND rule_id = $3 \
         AND client NOT IN (SELECT client FROM {table} \
         WHERE resolution = $1 AND bucket_ms = $2 AND rule_id = $3 \
         ORDER BY {by} DESC, client LIMIT $4)"
    );
    for (resolution, bucket_ms, rule) in touched {
        sqlx::query(&sql)
            .bind(resolution.seconds())
            .bind(bucket_ms)
            .bind(rule)
            .bind(to_i64(TOP_CLIENTS_PER_BUCKET as u64))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::metrics::rows::{ProxyBucket, RuleBucket};

    /// The SQL the three tables were written with before they shared one upsert.
    #[test]
    fn every_metrics_table_adds_to_its_stored_row() {
        let rule_sets = "allowed = metric_rule_buckets.allowed + excluded.allowed, \
             denied = metric_rule_buckets.denied + excluded.denied, \
             shadow_denied = metric_rule_buckets.shadow_denied + excluded.shadow_denied, \
             near_limit = metric_rule_buckets.near_limit + excluded.near_limit, \
             fail_open = metric_rule_buckets.fail_open + excluded.fail_open, \
             key_missing = metric_rule_buckets.key_missing + excluded.key_missing, \
             warned = metric_rule_buckets.warned + excluded.warned, \
             delayed = metric_rule_buckets.delayed + excluded.delayed, \
             in_flight_refused = metric_rule_buckets.in_flight_refused + excluded.in_flight_refused, \
             tokens_used = metric_rule_buckets.tokens_used + excluded.tokens_used, \
             tokens_throttled = metric_rule_buckets.tokens_throttled + excluded.tokens_throttled, \
             delay_wait_ms = metric_rule_buckets.delay_wait_ms + excluded.delay_wait_ms";
        assert_eq!(
            upsert_sql::<RuleBucket>(Backend::Postgres, 1),
            format!(
                "INSERT INTO metric_rule_buckets (resolution, bucket_ms, rule_id, allowed, denied, \
                 shadow_denied, near_limit, fail_open, key_missing, warned, delayed, \
                 in_flight_refused, tokens_used, tokens_throttled, delay_wait_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
                 ON CONFLICT (resolution, bucket_ms, rule_id) DO UPDATE SET {rule_sets}"
            )
        );
        // The per-proxy table adds the same twelve counts to its own row.
        let proxy_sets = rule_sets.replace("metric_rule_buckets", "metric_proxy_buckets");
        assert_eq!(
            upsert_sql::<ProxyBucket>(Backend::Sqlite, 1),
            format!(
                "INSERT INTO metric_proxy_buckets (resolution, proxy_id, bucket_ms, rule_id, allowed, \
                 denied, shadow_denied, near_limit, fail_open, key_missing, warned, delayed, \
                 in_flight_refused, tokens_used, tokens_throttled, delay_wait_ms) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (resolution, proxy_id, bucket_ms, rule_id) DO UPDATE SET {proxy_sets}"
            )
        );
        assert_eq!(
            upsert_sql::<ClientBucket>(Backend::Postgres, 2),
            "INSERT INTO metric_clients (resolution, bucket_ms, rule_id, client, throttled, error, \
             tokens) \
             VALUES ($1, $2, $3, $4, $5, $6, $7), ($8, $9, $10, $11, $12, $13, $14) \
             ON CONFLICT (resolution, bucket_ms, rule_id, client) DO UPDATE SET \
             throttled = metric_clients.throttled + excluded.throttled, \
             error = metric_clients.error + excluded.error, \
             tokens = metric_clients.tokens + excluded.tokens"
        );
    }
}
