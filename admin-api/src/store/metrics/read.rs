//! Reading metrics: per-bucket series, per-rule rows, the most throttled clients and one
//! client's history, each over a range of bucket starts.
//!
//! Sums are cast back to `BIGINT`: PostgreSQL's `SUM(bigint)` is `numeric`, which the
//! `Any` driver cannot decode.

use std::collections::HashMap;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::buckets::Span;
use super::params::{Params, ROWS_PER_STATEMENT};
use super::rows::{
    AdditiveRow, COUNT_COLUMNS, ClientBucket, ClientTotal, Counts, ProxyBucket, RequesterBucket,
    RuleBucket,
};
use crate::store::{AnyQuery, Store, StoreError, to_u64};

/// The condition of a read of one resolution's buckets starting in `[$2, $3)`.
const IN_RANGE: &str = "resolution = $1 AND bucket_ms >= $2 AND bucket_ms < $3";

/// `sql`, whose condition starts with [`IN_RANGE`], with those three parameters bound to
/// `span`.
fn in_range(sql: &str, span: Span) -> AnyQuery<'_> {
    sqlx::query(sql)
        .bind(span.resolution.seconds())
        .bind(span.from_ms)
        .bind(span.to_ms)
}

/// Clients' throttled totals per rule over `pieces` (a `UNION ALL` of client rows), then
/// `rest` (a filter, grouping and order).
fn client_sums(pieces: &str, rest: &str) -> String {
    format!(
        "SELECT client, rule_id, CAST(SUM(throttled) AS BIGINT) AS throttled, \
         CAST(SUM(error) AS BIGINT) AS error, CAST(SUM(tokens) AS BIGINT) AS tokens \
         FROM ({pieces}) AS pieces {rest}"
    )
}

impl Store {
    /// Per-bucket sums over `span`, for one rule or all, over all proxies or one.
    /// Buckets without rows are absent.
    pub async fn metric_series(
        &self,
        span: Span,
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
        let mut sql = format!("SELECT bucket_ms, {summed} FROM {table} WHERE {IN_RANGE}");
        let mut next = 4;
        if rule.is_some() {
            sql.push_str(&format!(" AND rule_id = ${next}"));
            next += 1;
        }
        if proxy.is_some() {
            sql.push_str(&format!(" AND proxy_id = ${next}"));
        }
        sql.push_str(" GROUP BY bucket_ms ORDER BY bucket_ms");
        let mut query = in_range(&sql, span);
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

    /// Every (bucket, rule) row over `span`, summed over proxies.
    pub(crate) async fn metric_rule_buckets(
        &self,
        span: Span,
    ) -> Result<Vec<RuleBucket>, StoreError> {
        let sql = format!(
            "SELECT bucket_ms, rule_id, {} FROM {} WHERE {IN_RANGE}",
            COUNT_COLUMNS.join(", "),
            RuleBucket::TABLE,
        );
        let rows = in_range(&sql, span).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                Ok(RuleBucket {
                    resolution: span.resolution,
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
        let sql = client_sums(
            &pieces,
            &format!("GROUP BY client, rule_id ORDER BY 3 DESC, 1, 2 LIMIT {limit_param}"),
        );
        let rows = bind_pieces(sqlx::query(&sql), spans, rule)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(client_total).collect()
    }

    /// The totals over `spans` of the given clients (any rule, or `rule`).
    pub(crate) async fn metric_client_totals(
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
            let list = params.list(chunk.len());
            let sql = client_sums(
                &pieces,
                &format!("WHERE client IN ({list}) GROUP BY client, rule_id"),
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

    /// One client's throttled counts per rule and bucket over `span`.
    pub(crate) async fn metric_client_series(
        &self,
        span: Span,
        client: &str,
    ) -> Result<Vec<ClientBucket>, StoreError> {
        let sql = format!(
            "SELECT bucket_ms, client, rule_id, throttled, error, tokens FROM {} \
             WHERE {IN_RANGE} AND client = $4",
            ClientBucket::TABLE,
        );
        let rows = in_range(&sql, span)
            .bind(client)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                let total = client_total(row)?;
                Ok(ClientBucket {
                    resolution: span.resolution,
                    bucket_ms: row.try_get("bucket_ms")?,
                    rule: total.rule,
                    client: total.client,
                    throttled: total.throttled,
                    error: total.error,
                    tokens: total.tokens,
                })
            })
            .collect()
    }

    /// The clients with the most requests to `rule` in each bucket of `span`, at most
    /// `limit` rows (the newest buckets first, then the most requests).
    pub(crate) async fn metric_requesters(
        &self,
        span: Span,
        rule: &str,
        limit: u32,
    ) -> Result<Vec<RequesterBucket>, StoreError> {
        let sql = format!(
            "SELECT bucket_ms, client, requests, error FROM {} \
             WHERE {IN_RANGE} AND rule_id = $4 ORDER BY bucket_ms DESC, requests DESC LIMIT $5",
            RequesterBucket::TABLE,
        );
        let rows = in_range(&sql, span)
            .bind(rule)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| {
                Ok(RequesterBucket {
                    resolution: span.resolution,
                    bucket_ms: row.try_get("bucket_ms")?,
                    rule: rule.to_string(),
                    client: row.try_get("client")?,
                    requests: to_u64(row.try_get("requests")?),
                    error: to_u64(row.try_get("error")?),
                })
            })
            .collect()
    }

    /// The current name of every rule, by id.
    pub(crate) async fn rule_names(&self) -> Result<HashMap<String, String>, StoreError> {
        let rows = sqlx::query("SELECT id, name FROM rules")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|row| Ok((row.try_get("id")?, row.try_get("name")?)))
            .collect()
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
                "SELECT client, rule_id, throttled, error, tokens FROM metric_clients \
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
        tokens: to_u64(row.try_get("tokens")?),
    })
}
