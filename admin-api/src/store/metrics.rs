//! Throttle metrics in the database: batched writes from the pipeline's flusher, the
//! range queries behind `/api/v1/metrics/*`, and retention.
//!
//! Three tables (migration 0002): `metric_rule_buckets` (per rule, summed over proxies:
//! what almost every view reads, so a chart over a week reads one row per rule and bucket
//! however many proxies there are), `metric_proxy_buckets` (per proxy and rule, for
//! `?proxy=`), and `metric_clients` (the most throttled clients per rule and bucket).
//! Every write adds to what is stored (one upsert for all three, [`AdditiveRow`]:
//! `ON CONFLICT ... DO UPDATE SET n = n + excluded.n`), so a bucket can be written by many
//! flushes.
//!
//! Sums are cast back to `BIGINT`: PostgreSQL's `SUM(bigint)` is `numeric`, which the
//! `Any` driver cannot decode.

use std::collections::HashMap;

use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::{AnyQuery, Backend, Store, StoreError, to_i64, to_u64};

/// Clients kept per rule and bucket.
pub const TOP_CLIENTS_PER_BUCKET: usize = 50;
/// Rows per multi-row `INSERT`: 500 × 10 columns stays far below both databases' limits
/// on bound parameters (SQLite 32,766, PostgreSQL 65,535).
const ROWS_PER_STATEMENT: usize = 500;
/// Buckets deleted per retention statement, so a large backlog is deleted in short
/// transactions that let the flusher in between.
const BUCKETS_PER_DELETE: i64 = 64;

/// A time-series resolution: the width of a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resolution {
    TenSeconds,
    Minute,
    Hour,
}

impl Resolution {
    pub const ALL: [Resolution; 3] = [Resolution::TenSeconds, Resolution::Minute, Resolution::Hour];

    pub fn seconds(self) -> i64 {
        match self {
            Resolution::TenSeconds => 10,
            Resolution::Minute => 60,
            Resolution::Hour => 3600,
        }
    }

    pub fn ms(self) -> i64 {
        self.seconds() * 1000
    }

    /// The start of the bucket holding `t_ms`.
    pub fn bucket(self, t_ms: i64) -> i64 {
        t_ms - t_ms.rem_euclid(self.ms())
    }

    /// As the API spells it: `10s`, `1m`, `1h`.
    pub fn label(self) -> &'static str {
        match self {
            Resolution::TenSeconds => "10s",
            Resolution::Minute => "1m",
            Resolution::Hour => "1h",
        }
    }

    pub fn from_label(label: &str) -> Option<Resolution> {
        Resolution::ALL.into_iter().find(|r| r.label() == label)
    }

    /// The step a range is shown at when none is asked for: up to an hour in 10 s
    /// buckets, up to two days in minutes, beyond in hours.
    pub fn for_range(range_ms: i64) -> Resolution {
        if range_ms <= 3_600_000 {
            Resolution::TenSeconds
        } else if range_ms <= 2 * 86_400_000 {
            Resolution::Minute
        } else {
            Resolution::Hour
        }
    }
}

/// A stretch of time read at one resolution: the buckets starting in `[from_ms, to_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub resolution: Resolution,
    pub from_ms: i64,
    pub to_ms: i64,
}

impl Span {
    /// Every bucket of `resolution` that overlaps `[from_ms, to_ms)`.
    pub fn overlapping(resolution: Resolution, from_ms: i64, to_ms: i64) -> Span {
        Span {
            resolution,
            from_ms: resolution.bucket(from_ms),
            to_ms,
        }
    }

    /// `[from_ms, to_ms)` cut into few buckets: whole hours in hour buckets, whole
    /// minutes at the edges in minute buckets, the rest in 10 s buckets (overlapping the
    /// range's ends), so that a day reads about 24 + 120 + 12 buckets instead of 1,440.
    /// `retained(r)` is the oldest bucket of `r` still kept; an edge older than that is
    /// read from the whole coarser bucket instead.
    pub fn cover(from_ms: i64, to_ms: i64, retained: impl Fn(Resolution) -> i64) -> Vec<Span> {
        let mut out = Vec::new();
        cover(
            &[Resolution::Hour, Resolution::Minute, Resolution::TenSeconds],
            from_ms,
            to_ms,
            &retained,
            &mut out,
        );
        out
    }
}

fn cover(
    levels: &[Resolution],
    from: i64,
    to: i64,
    retained: &impl Fn(Resolution) -> i64,
    out: &mut Vec<Span>,
) {
    let Some((&r, finer)) = levels.split_first() else {
        return;
    };
    if from >= to {
        return;
    }
    if finer.is_empty() {
        out.push(Span::overlapping(r, from, to));
        return;
    }
    // Whether the next finer resolution still holds the data from `a` on.
    let descend = |a: i64| finer.first().is_some_and(|f| f.bucket(a) >= retained(*f));
    let lo = r.bucket(from + r.ms() - 1);
    let hi = r.bucket(to);
    if lo >= hi {
        if descend(from) {
            cover(finer, from, to, retained, out);
        } else {
            out.push(Span::overlapping(r, from, to));
        }
        return;
    }
    out.push(Span {
        resolution: r,
        from_ms: lo,
        to_ms: hi,
    });
    for (a, b) in [(from, lo), (hi, to)] {
        if a >= b {
            continue;
        }
        if descend(a) {
            cover(finer, a, b, retained, out);
        } else {
            out.push(Span::overlapping(r, a, b));
        }
    }
}

/// Exact counts of one rule's outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
}

impl Counts {
    /// Adds `other`, saturating (counts are validated far below `u64::MAX` on the way
    /// in, but a sum must never wrap).
    pub fn add(&mut self, other: &Counts) {
        self.allowed = self.allowed.saturating_add(other.allowed);
        self.denied = self.denied.saturating_add(other.denied);
        self.shadow_denied = self.shadow_denied.saturating_add(other.shadow_denied);
        self.near_limit = self.near_limit.saturating_add(other.near_limit);
        self.fail_open = self.fail_open.saturating_add(other.fail_open);
        self.key_missing = self.key_missing.saturating_add(other.key_missing);
    }

    /// `self - earlier`, for deltas of cumulative counts.
    pub fn since(&self, earlier: &Counts) -> Counts {
        Counts {
            allowed: self.allowed.saturating_sub(earlier.allowed),
            denied: self.denied.saturating_sub(earlier.denied),
            shadow_denied: self.shadow_denied.saturating_sub(earlier.shadow_denied),
            near_limit: self.near_limit.saturating_sub(earlier.near_limit),
            fail_open: self.fail_open.saturating_sub(earlier.fail_open),
            key_missing: self.key_missing.saturating_sub(earlier.key_missing),
        }
    }

    /// Requests a rule denied or, in shadow mode, would have denied.
    pub fn throttled(&self) -> u64 {
        self.denied.saturating_add(self.shadow_denied)
    }

    /// Requests a rule decided: allowed, denied, shadow-denied or let through on failure
    /// (requests without the rule's key are not counted: the rule did not apply).
    pub fn decided(&self) -> u64 {
        self.allowed
            .saturating_add(self.denied)
            .saturating_add(self.shadow_denied)
            .saturating_add(self.fail_open)
    }

    /// Throttled over decided, 0 without traffic.
    pub fn throttle_ratio(&self) -> f64 {
        match self.decided() {
            0 => 0.0,
            n => self.throttled() as f64 / n as f64,
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Counts::default()
    }

    fn values(&self) -> [i64; 6] {
        [
            to_i64(self.allowed),
            to_i64(self.denied),
            to_i64(self.shadow_denied),
            to_i64(self.near_limit),
            to_i64(self.fail_open),
            to_i64(self.key_missing),
        ]
    }

    fn from_row(row: &AnyRow) -> Result<Counts, sqlx::Error> {
        Ok(Counts {
            allowed: to_u64(row.try_get("allowed")?),
            denied: to_u64(row.try_get("denied")?),
            shadow_denied: to_u64(row.try_get("shadow_denied")?),
            near_limit: to_u64(row.try_get("near_limit")?),
            fail_open: to_u64(row.try_get("fail_open")?),
            key_missing: to_u64(row.try_get("key_missing")?),
        })
    }
}

/// The count columns of `metric_rule_buckets` and `metric_proxy_buckets`, in the order of
/// [`Counts::values`].
const COUNT_COLUMNS: [&str; 6] = [
    "allowed",
    "denied",
    "shadow_denied",
    "near_limit",
    "fail_open",
    "key_missing",
];

/// The metrics tables, each written by one [`AdditiveRow`] type.
const METRIC_TABLES: [&str; 3] = [RuleBucket::TABLE, ProxyBucket::TABLE, ClientBucket::TABLE];

/// One rule's counts in one bucket, summed over proxies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleBucket {
    pub resolution: Resolution,
    pub bucket_ms: i64,
    pub rule: String,
    pub counts: Counts,
}

/// One proxy's counts for one rule in one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyBucket {
    pub resolution: Resolution,
    pub bucket_ms: i64,
    pub proxy: String,
    pub rule: String,
    pub counts: Counts,
}

/// A throttled client of a rule in a bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientBucket {
    pub resolution: Resolution,
    pub bucket_ms: i64,
    pub rule: String,
    pub client: String,
    pub throttled: u64,
    pub error: u64,
}

/// A proxy that sent a report: a sign of life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyBeat {
    pub id: String,
    pub at_ms: i64,
    /// Used only for a proxy never seen before; polls keep these current.
    pub address: String,
    pub token_id: Option<String>,
    pub ruleset_version: u64,
}

/// One flush's worth of rows. Within a batch each key appears once.
#[derive(Debug, Clone, Default)]
pub struct MetricsBatch {
    pub rules: Vec<RuleBucket>,
    pub proxies: Vec<ProxyBucket>,
    pub clients: Vec<ClientBucket>,
    pub beats: Vec<ProxyBeat>,
}

impl MetricsBatch {
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
            && self.proxies.is_empty()
            && self.clients.is_empty()
            && self.beats.is_empty()
    }

    /// Rows this batch writes (upserts), for the rows-written metric.
    pub fn rows(&self) -> usize {
        self.rules.len() + self.proxies.len() + self.clients.len() + self.beats.len()
    }
}

/// A client's throttled total for a rule over a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTotal {
    pub client: String,
    pub rule: String,
    pub throttled: u64,
    pub error: u64,
}

/// Placeholders for a statement with many parameters, bound in the order they appear:
/// `$1, $2, ...` on PostgreSQL, and plain `?` on SQLite. SQLite looks a numbered
/// parameter's name up in a list (sqlx asks for every parameter's name when binding), so
/// `$N` costs time quadratic in the number of parameters: 87% of a flush's time with
/// 5,000 of them. Anonymous `?` parameters have no names to look up.
struct Params {
    backend: Backend,
    n: usize,
}

impl Params {
    fn new(backend: Backend) -> Params {
        Params { backend, n: 0 }
    }

    fn next(&mut self) -> String {
        self.n += 1;
        match self.backend {
            Backend::Sqlite => "?".to_string(),
            Backend::Postgres => format!("${}", self.n),
        }
    }

    /// `(p, p, p), (p, p, p)` for `rows` rows of `columns` columns.
    fn values(&mut self, rows: usize, columns: usize) -> String {
        let row = |params: &mut Params| {
            let cells: Vec<String> = (0..columns).map(|_| params.next()).collect();
            format!("({})", cells.join(", "))
        };
        (0..rows).map(|_| row(self)).collect::<Vec<_>>().join(", ")
    }
}

impl Store {
    /// Adds a batch to the stored metrics in one transaction. `before_commit` runs after
    /// every statement succeeded, just before the commit (the pipeline uses it to tell
    /// readers that the batch is about to become visible).
    pub async fn write_metrics(
        &self,
        batch: &MetricsBatch,
        before_commit: impl FnOnce(),
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert(&mut tx, self.backend, &batch.rules).await?;
        upsert(&mut tx, self.backend, &batch.proxies).await?;
        upsert(&mut tx, self.backend, &batch.clients).await?;
        trim_to_top_clients(&mut tx, &batch.clients).await?;
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
        upsert(&mut tx, self.backend, &batch.rules).await?;
        upsert(&mut tx, self.backend, &batch.proxies).await?;
        upsert(&mut tx, self.backend, &batch.clients).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Per-bucket sums over `[from_ms, to_ms)` (bucket starts), for one rule or all, over
    /// all proxies or one. Buckets without rows are absent.
    pub async fn metric_series(
        &self,
        resolution: Resolution,
        from_ms: i64,
        to_ms: i64,
        rule: Option<&str>,
        proxy: Option<&str>,
    ) -> Result<Vec<(i64, Counts)>, StoreError> {
        let table = if proxy.is_some() {
            ProxyBucket::TABLE
        } else {
            RuleBucket::TABLE
        };
        let summed = COUNT_COLUMNS
            .map(|c| format!("CAST(SUM({c}) AS BIGINT) AS {c}"))
            .join(", ");
        let mut sql = format!(
            "SELECT bucket_ms, {summed} FROM {table} \
             WHERE resolution = $1 AND bucket_ms >= $2 AND bucket_ms < $3"
        );
        let mut next = 4;
        if rule.is_some() {
            sql.push_str(&format!(" AND rule_id = ${next}"));
            next += 1;
        }
        if proxy.is_some() {
            sql.push_str(&format!(" AND proxy_id = ${next}"));
        }
        sql.push_str(" GROUP BY bucket_ms ORDER BY bucket_ms");
        let mut query = sqlx::query(&sql)
            .bind(resolution.seconds())
            .bind(from_ms)
            .bind(to_ms);
        if let Some(rule) = rule {
            query = query.bind(rule);
        }
        if let Some(proxy) = proxy {
            query = query.bind(proxy);
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| Ok((row.try_get("bucket_ms")?, Counts::from_row(row)?)))
            .collect()
    }

    /// Every (bucket, rule) row over `[from_ms, to_ms)`, summed over proxies.
    pub async fn metric_rule_buckets(
        &self,
        resolution: Resolution,
        from_ms: i64,
        to_ms: i64,
    ) -> Result<Vec<RuleBucket>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT bucket_ms, rule_id, {} FROM {} \
             WHERE resolution = $1 AND bucket_ms >= $2 AND bucket_ms < $3",
            COUNT_COLUMNS.join(", "),
            RuleBucket::TABLE,
        ))
        .bind(resolution.seconds())
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(RuleBucket {
                    resolution,
                    bucket_ms: row.try_get("bucket_ms")?,
                    rule: row.try_get("rule_id")?,
                    counts: Counts::from_row(row)?,
                })
            })
            .collect()
    }

    /// The `limit` most throttled (client, rule) pairs over `spans`.
    pub async fn metric_top_clients(
        &self,
        spans: &[Span],
        rule: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ClientTotal>, StoreError> {
        if spans.is_empty() {
            return Ok(Vec::new());
        }
        let mut params = Params::new(self.backend);
        let pieces = client_pieces(spans, rule, &mut params);
        let limit_param = params.next();
        let sql = format!(
            "SELECT client, rule_id, CAST(SUM(throttled) AS BIGINT) AS throttled, \
             CAST(SUM(error) AS BIGINT) AS error FROM ({pieces}) AS pieces \
             GROUP BY client, rule_id ORDER BY 3 DESC, 1, 2 LIMIT {limit_param}"
        );
        let rows = bind_pieces(sqlx::query(&sql), spans, rule)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(client_total).collect()
    }

    /// The totals over `spans` of the given clients (any rule, or `rule`).
    pub async fn metric_client_totals(
        &self,
        spans: &[Span],
        rule: Option<&str>,
        clients: &[String],
    ) -> Result<Vec<ClientTotal>, StoreError> {
        let mut out = Vec::new();
        if spans.is_empty() {
            return Ok(out);
        }
        for chunk in clients.chunks(ROWS_PER_STATEMENT) {
            let mut params = Params::new(self.backend);
            let pieces = client_pieces(spans, rule, &mut params);
            let list = (0..chunk.len())
                .map(|_| params.next())
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "SELECT client, rule_id, CAST(SUM(throttled) AS BIGINT) AS throttled, \
                 CAST(SUM(error) AS BIGINT) AS error FROM ({pieces}) AS pieces \
                 WHERE client IN ({list}) GROUP BY client, rule_id"
            );
            let mut query = bind_pieces(sqlx::query(&sql), spans, rule);
            for client in chunk {
                query = query.bind(client);
            }
            for row in query.fetch_all(&self.pool).await? {
                out.push(client_total(&row)?);
            }
        }
        Ok(out)
    }

    /// One client's throttled counts per rule and bucket over `[from_ms, to_ms)`.
    pub async fn metric_client_series(
        &self,
        resolution: Resolution,
        from_ms: i64,
        to_ms: i64,
        client: &str,
    ) -> Result<Vec<ClientBucket>, StoreError> {
        let rows = sqlx::query(
            "SELECT bucket_ms, rule_id, throttled, error FROM metric_clients \
             WHERE resolution = $1 AND client = $2 AND bucket_ms >= $3 AND bucket_ms < $4",
        )
        .bind(resolution.seconds())
        .bind(client)
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ClientBucket {
                    resolution,
                    bucket_ms: row.try_get("bucket_ms")?,
                    rule: row.try_get("rule_id")?,
                    client: client.to_string(),
                    throttled: to_u64(row.try_get("throttled")?),
                    error: to_u64(row.try_get("error")?),
                })
            })
            .collect()
    }

    /// The current name of every rule, by id.
    pub async fn rule_names(&self) -> Result<HashMap<String, String>, StoreError> {
        let rows = sqlx::query("SELECT id, name FROM rules")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("id")?, row.try_get("name")?)))
            .collect()
    }

    /// Deletes the buckets of `resolution` that start before `cutoff_ms`, in short
    /// transactions of at most [`BUCKETS_PER_DELETE`] buckets, at most `max_statements`
    /// of them (the rest waits for the next run). Returns the rows deleted.
    pub async fn delete_metrics_before(
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

    /// Rows stored per table, for tests and benchmarks.
    pub async fn metric_row_counts(&self) -> Result<[u64; 3], StoreError> {
        let mut out = [0; 3];
        for (slot, table) in out.iter_mut().zip(METRIC_TABLES) {
            let n: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {table}"))
                .fetch_one(&self.pool)
                .await?;
            *slot = to_u64(n);
        }
        Ok(out)
    }
}

/// `SELECT ... UNION ALL SELECT ...`: the client rows of every span (bound by
/// [`bind_pieces`] in the same order).
fn client_pieces(spans: &[Span], rule: Option<&str>, params: &mut Params) -> String {
    spans
        .iter()
        .map(|_| {
            let (r, from, to) = (params.next(), params.next(), params.next());
            let rule_filter = match rule {
                Some(_) => format!(" AND rule_id = {}", params.next()),
                None => String::new(),
            };
            format!(
                "SELECT client, rule_id, throttled, error FROM metric_clients \
                 WHERE resolution = {r} AND bucket_ms >= {from} AND bucket_ms < {to}{rule_filter}"
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

fn bind_pieces<'q>(mut query: AnyQuery<'q>, spans: &[Span], rule: Option<&'q str>) -> AnyQuery<'q> {
    for span in spans {
        query = query
            .bind(span.resolution.seconds())
            .bind(span.from_ms)
            .bind(span.to_ms);
        if let Some(rule) = rule {
            query = query.bind(rule);
        }
    }
    query
}

fn client_total(row: &AnyRow) -> Result<ClientTotal, StoreError> {
    Ok(ClientTotal {
        client: row.try_get("client")?,
        rule: row.try_get("rule_id")?,
        throttled: to_u64(row.try_get("throttled")?),
        error: to_u64(row.try_get("error")?),
    })
}

/// A metrics row stored by adding to the stored row with the same key: a bucket is
/// written by many flushes, and each adds its counts to what the others stored.
trait AdditiveRow {
    /// The table, whose primary key is [`AdditiveRow::KEY`].
    const TABLE: &'static str;
    /// The key columns, in the order [`AdditiveRow::bind`] binds them.
    const KEY: &'static [&'static str];
    /// The counter columns, bound after the key, each added to the stored value.
    const COUNTERS: &'static [&'static str];

    /// Binds this row's key, then its counters.
    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q>;
}

fn bind_counts<'q>(mut query: AnyQuery<'q>, counts: &Counts) -> AnyQuery<'q> {
    for v in counts.values() {
        query = query.bind(v);
    }
    query
}

impl AdditiveRow for RuleBucket {
    const TABLE: &'static str = "metric_rule_buckets";
    const KEY: &'static [&'static str] = &["resolution", "bucket_ms", "rule_id"];
    const COUNTERS: &'static [&'static str] = &COUNT_COLUMNS;

    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        let query = query
            .bind(self.resolution.seconds())
            .bind(self.bucket_ms)
            .bind(&self.rule);
        bind_counts(query, &self.counts)
    }
}

impl AdditiveRow for ProxyBucket {
    const TABLE: &'static str = "metric_proxy_buckets";
    const KEY: &'static [&'static str] = &["resolution", "proxy_id", "bucket_ms", "rule_id"];
    const COUNTERS: &'static [&'static str] = &COUNT_COLUMNS;

    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        let query = query
            .bind(self.resolution.seconds())
            .bind(&self.proxy)
            .bind(self.bucket_ms)
            .bind(&self.rule);
        bind_counts(query, &self.counts)
    }
}

impl AdditiveRow for ClientBucket {
    const TABLE: &'static str = "metric_clients";
    const KEY: &'static [&'static str] = &["resolution", "bucket_ms", "rule_id", "client"];
    const COUNTERS: &'static [&'static str] = &["throttled", "error"];

    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        query
            .bind(self.resolution.seconds())
            .bind(self.bucket_ms)
            .bind(&self.rule)
            .bind(&self.client)
            .bind(to_i64(self.throttled))
            .bind(to_i64(self.error))
    }
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

/// Trims every bucket `rows` touched back to its [`TOP_CLIENTS_PER_BUCKET`] most
/// throttled clients.
async fn trim_to_top_clients(
    tx: &mut Transaction<'static, Any>,
    rows: &[ClientBucket],
) -> Result<(), StoreError> {
    let mut touched: Vec<(Resolution, i64, &str)> = rows
        .iter()
        .map(|r| (r.resolution, r.bucket_ms, r.rule.as_str()))
        .collect();
    touched.sort_unstable();
    touched.dedup();
    for (resolution, bucket_ms, rule) in touched {
        sqlx::query(
            "DELETE FROM metric_clients WHERE resolution = $1 AND bucket_ms = $2 AND rule_id = $3 \
             AND client NOT IN (SELECT client FROM metric_clients \
             WHERE resolution = $1 AND bucket_ms = $2 AND rule_id = $3 \
             ORDER BY throttled DESC, client LIMIT $4)",
        )
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

    #[test]
    fn buckets_and_steps() {
        assert_eq!(Resolution::TenSeconds.bucket(12_345), 10_000);
        assert_eq!(Resolution::Minute.bucket(59_999), 0);
        assert_eq!(Resolution::Minute.bucket(60_000), 60_000);
        assert_eq!(Resolution::Hour.bucket(-1), -3_600_000);
        assert_eq!(Resolution::for_range(3_600_000), Resolution::TenSeconds);
        assert_eq!(Resolution::for_range(3_600_001), Resolution::Minute);
        assert_eq!(Resolution::for_range(2 * 86_400_000), Resolution::Minute);
        assert_eq!(Resolution::for_range(2 * 86_400_000 + 1), Resolution::Hour);
        for r in Resolution::ALL {
            assert_eq!(Resolution::from_label(r.label()), Some(r));
        }
        assert_eq!(Resolution::from_label("5m"), None);
    }

    #[test]
    fn ranges_are_covered_by_few_buckets() {
        const M: i64 = 60_000;
        const H: i64 = 3_600_000;
        let all = |_: Resolution| i64::MIN;
        let span = |resolution, from_ms, to_ms| Span {
            resolution,
            from_ms,
            to_ms,
        };
        // A day from 10:00:05 to 10:00:05 the next day.
        let (from, to) = (10 * H + 5_000, 34 * H + 5_000);
        assert_eq!(
            Span::cover(from, to, all),
            [
                span(Resolution::Hour, 11 * H, 34 * H),
                span(Resolution::Minute, 10 * H + M, 11 * H),
                span(Resolution::TenSeconds, 10 * H, 10 * H + M),
                span(Resolution::TenSeconds, 34 * H, 34 * H + 5_000),
            ]
        );
        // Aligned: one span.
        assert_eq!(
            Span::cover(H, 3 * H, all),
            [span(Resolution::Hour, H, 3 * H)]
        );
        // Within a minute: 10 s buckets overlapping it.
        assert_eq!(
            Span::cover(H + 15_000, H + 25_000, all),
            [span(Resolution::TenSeconds, H + 10_000, H + 25_000)]
        );
        // Minutes no longer kept: the edge hour is read whole.
        let no_minutes = |r: Resolution| {
            if r == Resolution::Hour {
                i64::MIN
            } else {
                i64::MAX
            }
        };
        assert_eq!(
            Span::cover(from, to, no_minutes),
            [
                span(Resolution::Hour, 11 * H, 34 * H),
                span(Resolution::Hour, 10 * H, 11 * H),
                span(Resolution::Hour, 34 * H, 34 * H + 5_000),
            ]
        );
        // Every millisecond of the range is in exactly one span's buckets.
        let spans = Span::cover(from, to, all);
        for t in (from..to).step_by(997) {
            let n = spans
                .iter()
                .filter(|s| {
                    let b = s.resolution.bucket(t);
                    b >= s.from_ms && b < s.to_ms
                })
                .count();
            assert_eq!(n, 1, "{t}");
        }
    }

    #[test]
    fn values_clauses_number_every_parameter() {
        assert_eq!(
            Params::new(Backend::Postgres).values(2, 3),
            "($1, $2, $3), ($4, $5, $6)"
        );
        assert_eq!(Params::new(Backend::Sqlite).values(1, 2), "(?, ?)");
    }

    /// The SQL the three tables were written with before they shared one upsert.
    #[test]
    fn every_metrics_table_adds_to_its_stored_row() {
        assert_eq!(
            upsert_sql::<RuleBucket>(Backend::Postgres, 1),
            "INSERT INTO metric_rule_buckets (resolution, bucket_ms, rule_id, allowed, denied, \
             shadow_denied, near_limit, fail_open, key_missing) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (resolution, bucket_ms, rule_id) DO UPDATE SET \
             allowed = metric_rule_buckets.allowed + excluded.allowed, \
             denied = metric_rule_buckets.denied + excluded.denied, \
             shadow_denied = metric_rule_buckets.shadow_denied + excluded.shadow_denied, \
             near_limit = metric_rule_buckets.near_limit + excluded.near_limit, \
             fail_open = metric_rule_buckets.fail_open + excluded.fail_open, \
             key_missing = metric_rule_buckets.key_missing + excluded.key_missing"
        );
        assert_eq!(
            upsert_sql::<ProxyBucket>(Backend::Sqlite, 1),
            "INSERT INTO metric_proxy_buckets (resolution, proxy_id, bucket_ms, rule_id, allowed, \
             denied, shadow_denied, near_limit, fail_open, key_missing) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (resolution, proxy_id, bucket_ms, rule_id) DO UPDATE SET \
             allowed = metric_proxy_buckets.allowed + excluded.allowed, \
             denied = metric_proxy_buckets.denied + excluded.denied, \
             shadow_denied = metric_proxy_buckets.shadow_denied + excluded.shadow_denied, \
             near_limit = metric_proxy_buckets.near_limit + excluded.near_limit, \
             fail_open = metric_proxy_buckets.fail_open + excluded.fail_open, \
             key_missing = metric_proxy_buckets.key_missing + excluded.key_missing"
        );
        assert_eq!(
            upsert_sql::<ClientBucket>(Backend::Postgres, 2),
            "INSERT INTO metric_clients (resolution, bucket_ms, rule_id, client, throttled, error) \
             VALUES ($1, $2, $3, $4, $5, $6), ($7, $8, $9, $10, $11, $12) \
             ON CONFLICT (resolution, bucket_ms, rule_id, client) DO UPDATE SET \
             throttled = metric_clients.throttled + excluded.throttled, \
             error = metric_clients.error + excluded.error"
        );
    }

    #[test]
    fn ratios_count_shadow_denials_as_throttled() {
        let c = Counts {
            allowed: 6,
            denied: 2,
            shadow_denied: 1,
            fail_open: 1,
            key_missing: 100,
            ..Counts::default()
        };
        assert_eq!(c.throttled(), 3);
        assert!((c.throttle_ratio() - 0.3).abs() < 1e-9);
        assert_eq!(Counts::default().throttle_ratio(), 0.0);
    }
}
