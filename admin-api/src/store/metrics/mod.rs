//! Throttle metrics in the database: batched writes from the pipeline's flusher
//! ([`write`]), the range queries behind `/api/v1/metrics/*` ([`read`]), and retention.
//!
//! Four tables (migrations 0002 and 0006): `metric_rule_buckets` (per rule, summed over proxies:
//! what almost every view reads, so a chart over a week reads one row per rule and bucket
//! however many proxies there are), `metric_proxy_buckets` (per proxy and rule, for
//! `?proxy=`), and `metric_clients` (the most throttled clients per rule and bucket), and
//! `metric_requesters` (the clients sending each rule the most requests, 10 s buckets
//! only: what a rule dry run replays).
//! Every write adds to what is stored (one upsert for all three, [`rows::AdditiveRow`]:
//! `ON CONFLICT ... DO UPDATE SET n = n + excluded.n`), so a bucket can be written by many
//! flushes.
//!
//! The parts: [`buckets`] (resolutions and spans of buckets), [`rows`] (counts, the rows
//! of each table and how they are stored), [`params`] (placeholders for statements with
//! many parameters), then [`write`] and [`read`].

mod buckets;
mod params;
mod read;
mod rows;
mod write;

pub use buckets::{Resolution, Span};
pub use rows::{
    ClientBucket, ClientTotal, Counts, METRIC_TABLES, MetricsBatch, ProxyBucket, RequesterBucket,
    RuleBucket, TOP_CLIENTS_PER_BUCKET,
};
pub(crate) use rows::{ProxyBeat, REQUEST_COUNTS};
