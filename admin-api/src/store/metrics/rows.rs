//! The values metrics are made of: a rule's outcome counts, the rows of each table, and
//! how each row type is stored ([`AdditiveRow`]).

use sqlx::Row;
use sqlx::any::AnyRow;

use super::buckets::Resolution;
use crate::store::{AnyQuery, to_i64, to_u64};

/// Clients kept per rule and bucket.
pub const TOP_CLIENTS_PER_BUCKET: usize = 50;

/// The count columns of `metric_rule_buckets` and `metric_proxy_buckets`, in the order of
/// [`Counts::values`]: requests by outcome, then sums (tokens, milliseconds waited).
pub(super) const COUNT_COLUMNS: [&str; COUNTS] = [
    "allowed",
    "denied",
    "shadow_denied",
    "near_limit",
    "fail_open",
    "key_missing",
    "warned",
    "delayed",
    "in_flight_refused",
    "tokens_used",
    "tokens_throttled",
    "delay_wait_ms",
];

/// How many counts a rule has; the first [`REQUEST_COUNTS`] count requests.
const COUNTS: usize = 12;
/// Counts of requests (the rest are sums: LLM tokens, milliseconds waited).
pub(crate) const REQUEST_COUNTS: usize = 9;

/// Exact counts of one rule's outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    /// Requests admitted over a soft limit or by a warn-mode rule (also in `allowed`).
    pub warned: u64,
    /// Requests paused until their tokens were due, then admitted (also in `allowed`).
    pub delayed: u64,
    /// Requests refused by an in-flight limit (also in `denied`).
    pub in_flight_refused: u64,
    /// Tokens the rule's allowed requests used (`sluice_core::report::RuleCounts`).
    pub tokens_used: u64,
    /// Tokens the rule's throttled requests asked for.
    pub tokens_throttled: u64,
    /// Milliseconds the `delayed` requests waited, summed (mean wait: this over `delayed`).
    pub delay_wait_ms: u64,
}

impl Counts {
    /// Adds `other`, saturating (counts are validated far below `u64::MAX` on the way
    /// in, but a sum must never wrap).
    pub(crate) fn add(&mut self, other: &Counts) {
        *self = self.each(other, u64::saturating_add);
    }

    /// `self - earlier`, for deltas of cumulative counts.
    pub(crate) fn since(&self, earlier: &Counts) -> Counts {
        self.each(earlier, u64::saturating_sub)
    }

    /// Each count with its name: the report's field and the table's column.
    pub(crate) fn named(&self) -> [(&'static str, u64); COUNTS] {
        let values = [
            self.allowed,
            self.denied,
            self.shadow_denied,
            self.near_limit,
            self.fail_open,
            self.key_missing,
            self.warned,
            self.delayed,
            self.in_flight_refused,
            self.tokens_used,
            self.tokens_throttled,
            self.delay_wait_ms,
        ];
        std::array::from_fn(|i| (COUNT_COLUMNS[i], values[i]))
    }

    /// Requests a rule denied or, in shadow mode, would have denied.
    pub(crate) fn throttled(&self) -> u64 {
        self.denied.saturating_add(self.shadow_denied)
    }

    /// Requests a rule decided: allowed, denied, shadow-denied or let through on failure
    /// (requests without the rule's key are not counted: the rule did not apply).
    pub(crate) fn decided(&self) -> u64 {
        self.allowed
            .saturating_add(self.denied)
            .saturating_add(self.shadow_denied)
            .saturating_add(self.fail_open)
    }

    /// Throttled over decided, 0 without traffic.
    pub(crate) fn throttle_ratio(&self) -> f64 {
        match self.decided() {
            0 => 0.0,
            n => self.throttled() as f64 / n as f64,
        }
    }

    pub(crate) fn is_zero(&self) -> bool {
        *self == Counts::default()
    }

    /// `f` of each count of `self` and the same count of `other`.
    fn each(&self, other: &Counts, f: impl Fn(u64, u64) -> u64) -> Counts {
        Counts {
            allowed: f(self.allowed, other.allowed),
            denied: f(self.denied, other.denied),
            shadow_denied: f(self.shadow_denied, other.shadow_denied),
            near_limit: f(self.near_limit, other.near_limit),
            fail_open: f(self.fail_open, other.fail_open),
            key_missing: f(self.key_missing, other.key_missing),
            tokens_used: f(self.tokens_used, other.tokens_used),
            warned: f(self.warned, other.warned),
            delayed: f(self.delayed, other.delayed),
            in_flight_refused: f(self.in_flight_refused, other.in_flight_refused),
            tokens_throttled: f(self.tokens_throttled, other.tokens_throttled),
            delay_wait_ms: f(self.delay_wait_ms, other.delay_wait_ms),
        }
    }

    /// The values of [`COUNT_COLUMNS`], as stored.
    pub(super) fn values(&self) -> [i64; COUNTS] {
        self.named().map(|(_, v)| to_i64(v))
    }

    /// Reads [`COUNT_COLUMNS`] from a row.
    pub(super) fn from_row(row: &AnyRow) -> Result<Counts, sqlx::Error> {
        let count = |column| row.try_get(column).map(to_u64);
        Ok(Counts {
            allowed: count("allowed")?,
            denied: count("denied")?,
            shadow_denied: count("shadow_denied")?,
            near_limit: count("near_limit")?,
            fail_open: count("fail_open")?,
            key_missing: count("key_missing")?,
            tokens_used: count("tokens_used")?,
            warned: count("warned")?,
            delayed: count("delayed")?,
            in_flight_refused: count("in_flight_refused")?,
            tokens_throttled: count("tokens_throttled")?,
            delay_wait_ms: count("delay_wait_ms")?,
        })
    }
}

#[cfg(test)]
impl Counts {
    /// `n` allowed requests and nothing else.
    pub(crate) fn only_allowed(n: u64) -> Counts {
        Counts {
            allowed: n,
            ..Counts::default()
        }
    }

    /// `n` denied requests and nothing else.
    pub(crate) fn only_denied(n: u64) -> Counts {
        Counts {
            denied: n,
            ..Counts::default()
        }
    }
}

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
    /// Tokens its throttled requests asked for (an upper bound, like `throttled`).
    pub tokens: u64,
}

/// A client sending a rule many requests in a bucket (a dry run replays these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequesterBucket {
    pub resolution: Resolution,
    pub bucket_ms: i64,
    pub rule: String,
    pub client: String,
    /// Requests the rule decided for the client, whatever their outcome: an upper bound.
    pub requests: u64,
    /// How much of `requests` may belong to others.
    pub error: u64,
}

/// A proxy that sent a report: a sign of life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProxyBeat {
    pub(crate) id: String,
    pub(crate) at_ms: i64,
    /// Used only for a proxy never seen before; polls keep these current.
    pub(crate) address: String,
    pub(crate) token_id: Option<String>,
    pub(crate) ruleset_version: u64,
}

/// One flush's worth of rows. Within a batch each key appears once.
#[derive(Debug, Clone, Default)]
pub struct MetricsBatch {
    pub rules: Vec<RuleBucket>,
    pub proxies: Vec<ProxyBucket>,
    pub clients: Vec<ClientBucket>,
    pub requesters: Vec<RequesterBucket>,
    pub(crate) beats: Vec<ProxyBeat>,
}

impl MetricsBatch {
    /// Rows this batch writes (upserts), for the rows-written metric.
    pub fn rows(&self) -> usize {
        self.rules.len()
            + self.proxies.len()
            + self.clients.len()
            + self.requesters.len()
            + self.beats.len()
    }
}

/// A client's throttled total for a rule over a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTotal {
    pub(crate) client: String,
    pub(crate) rule: String,
    pub throttled: u64,
    pub(crate) error: u64,
    pub(crate) tokens: u64,
}

/// The metrics tables, each written by one [`AdditiveRow`] type.
pub const METRIC_TABLES: [&str; 4] = [
    RuleBucket::TABLE,
    ProxyBucket::TABLE,
    ClientBucket::TABLE,
    RequesterBucket::TABLE,
];

/// A metrics row stored by adding to the stored row with the same key: a bucket is
/// written by many flushes, and each adds its counts to what the others stored.
pub(super) trait AdditiveRow {
    /// The table, whose primary key is [`AdditiveRow::KEY`].
    const TABLE: &'static str;
    /// The key columns, in the order [`AdditiveRow::bind`] binds them.
    const KEY: &'static [&'static str];
    /// The counter columns, bound after the key, each added to the stored value: a rule's
    /// outcome counts unless the table keeps others.
    const COUNTERS: &'static [&'static str] = &COUNT_COLUMNS;

    /// Binds this row's key, then its counters.
    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q>;
}

/// Binds a row of counts of one rule in one bucket, per proxy (`proxy_id` second) or
/// summed over proxies: its key, then its counts.
fn bind_counts_row<'q>(
    query: AnyQuery<'q>,
    bucket: (Resolution, i64),
    proxy: Option<&'q str>,
    rule: &'q str,
    counts: &Counts,
) -> AnyQuery<'q> {
    let (resolution, bucket_ms) = bucket;
    let mut query = query.bind(resolution.seconds());
    if let Some(proxy) = proxy {
        query = query.bind(proxy);
    }
    query = query.bind(bucket_ms).bind(rule);
    for v in counts.values() {
        query = query.bind(v);
    }
    query
}

impl AdditiveRow for RuleBucket {
    const TABLE: &'static str = "metric_rule_buckets";
    const KEY: &'static [&'static str] = &["resolution", "bucket_ms", "rule_id"];

    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        let bucket = (self.resolution, self.bucket_ms);
        bind_counts_row(query, bucket, None, &self.rule, &self.counts)
    }
}

impl AdditiveRow for ProxyBucket {
    const TABLE: &'static str = "metric_proxy_buckets";
    const KEY: &'static [&'static str] = &["resolution", "proxy_id", "bucket_ms", "rule_id"];

    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        let bucket = (self.resolution, self.bucket_ms);
        bind_counts_row(query, bucket, Some(&self.proxy), &self.rule, &self.counts)
    }
}

/// The key columns of a client's row of one rule in one bucket (`metric_clients`,
/// `metric_requesters`).
const CLIENT_KEY: &[&str] = &["resolution", "bucket_ms", "rule_id", "client"];

/// Binds a client row's key (resolution, bucket, rule, client), then its `counters`.
fn bind_client_row<'q>(
    query: AnyQuery<'q>,
    bucket: (Resolution, i64),
    rule: &'q str,
    client: &'q str,
    counters: &[u64],
) -> AnyQuery<'q> {
    let (resolution, bucket_ms) = bucket;
    let mut query = (query.bind(resolution.seconds()).bind(bucket_ms))
        .bind(rule)
        .bind(client);
    for &n in counters {
        query = query.bind(to_i64(n));
    }
    query
}

impl AdditiveRow for ClientBucket {
    const TABLE: &'static str = "metric_clients";
    const KEY: &'static [&'static str] = CLIENT_KEY;
    const COUNTERS: &'static [&'static str] = &["throttled", "error", "tokens"];

    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        let bucket = (self.resolution, self.bucket_ms);
        let counters = [self.throttled, self.error, self.tokens];
        bind_client_row(query, bucket, &self.rule, &self.client, &counters)
    }
}

impl AdditiveRow for RequesterBucket {
    const TABLE: &'static str = "metric_requesters";
    const KEY: &'static [&'static str] = CLIENT_KEY;
    const COUNTERS: &'static [&'static str] = &["requests", "error"];

    fn bind<'q>(&'q self, query: AnyQuery<'q>) -> AnyQuery<'q> {
        let bucket = (self.resolution, self.bucket_ms);
        bind_client_row(
            query,
            bucket,
            &self.rule,
            &self.client,
            &[self.requests, self.error],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
