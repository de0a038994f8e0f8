//! `/api/v1/metrics/*`: throttle metrics for the dashboard and for scripts (viewer role and
//! up). Ranges are Unix milliseconds, `from` inclusive and `to` exclusive (default: the
//! last 15 minutes); a series covers every bucket that overlaps the range, zero-filled.
//! Reads add what proxies reported but the pipeline has not yet written, so the view is
//! live (see [`crate::pipeline`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::{Auth, Read};
use super::body::{Params, PathParam, Whole};
use super::error::ApiError;
use super::openapi::AuthErrors;
use super::{AppState, CONNECTED_WITHIN_MS};
use crate::pipeline::{Live, Pending, Tally};
use crate::store::{ClientTotal, Counts, Resolution, Span, now_ms};

/// The range shown when none is given.
const DEFAULT_RANGE_MS: i64 = 15 * 60 * 1000;
/// Most points in one series (a week in minutes is 10,080).
const MAX_POINTS: i64 = 20_000;
/// Values in a rule's sparkline.
const SPARKLINE_POINTS: usize = 30;
/// Clients listed when no `limit` is given, and the most that may be asked for.
const DEFAULT_CLIENTS: u32 = 20;
const MAX_CLIENTS: u32 = 1000;
/// The overview's default window and the longest it may ask for (the 1 h retention's
/// default).
const DEFAULT_WINDOW_SECONDS: i64 = 300;
const MAX_WINDOW_SECONDS: i64 = 400 * 86_400;
/// How often the stream sends an event.
pub const STREAM_INTERVAL: Duration = Duration::from_secs(2);
/// Keep-alive comments on an otherwise quiet stream (events already come every 2 s; this
/// covers proxies and browsers that time out idle reads).
const STREAM_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The bucket widths a `step` parameter names (`Resolution`'s labels), for the document.
#[derive(Debug, ToSchema)]
#[allow(dead_code)] // Only its schema is used.
enum StepName {
    #[schema(rename = "10s")]
    TenSeconds,
    #[schema(rename = "1m")]
    Minute,
    #[schema(rename = "1h")]
    Hour,
}

/// A resolved range: buckets of `resolution` starting in `[first, to)`.
#[derive(Debug, Clone, Copy)]
struct Window {
    resolution: Resolution,
    from: i64,
    to: i64,
    first: i64,
}

impl Window {
    /// The window a request's `from`, `to` and `step` parameters ask for.
    fn requested(
        from: Option<Whole>,
        to: Option<Whole>,
        step: Option<&str>,
        now: i64,
    ) -> Result<Window, ApiError> {
        Window::new(from.map(Whole::signed), to.map(Whole::signed), step, now)
    }

    fn new(
        from: Option<i64>,
        to: Option<i64>,
        step: Option<&str>,
        now: i64,
    ) -> Result<Window, ApiError> {
        let to = to.unwrap_or(now);
        let from = from.unwrap_or(to.saturating_sub(DEFAULT_RANGE_MS));
        if from < 0 || to < 0 {
            return Err(ApiError::BadRequest(
                "`from` and `to` are Unix milliseconds and cannot be negative".into(),
            ));
        }
        if from >= to {
            return Err(ApiError::BadRequest("`from` must be before `to`".into()));
        }
        let resolution = match step {
            None => Resolution::for_range(to - from),
            Some(label) => Resolution::from_label(label).ok_or_else(|| {
                ApiError::BadRequest(format!("`step` must be 10s, 1m or 1h, not `{label}`"))
            })?,
        };
        let window = Window {
            resolution,
            from,
            to,
            first: resolution.bucket(from),
        };
        if window.len() > MAX_POINTS {
            return Err(ApiError::BadRequest(format!(
                "the range holds {} buckets of {}; at most {MAX_POINTS} are returned: use a larger step",
                window.len(),
                resolution.label()
            )));
        }
        Ok(window)
    }

    /// Buckets in the range.
    fn len(&self) -> i64 {
        let ms = self.resolution.ms();
        (self.to - self.first + ms - 1) / ms
    }

    fn buckets(&self) -> impl Iterator<Item = i64> + use<> {
        let (first, ms) = (self.first, self.resolution.ms());
        (0..self.len()).map(move |i| first + i * ms)
    }

    /// The position of a bucket in the range.
    fn index(&self, bucket: i64) -> Option<usize> {
        let i = (bucket - self.first) / self.resolution.ms();
        (bucket >= self.first && bucket < self.to).then(|| usize::try_from(i).ok())?
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    /// Start of the range, Unix milliseconds (default: `to` minus 15 minutes); before `to`.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    from: Option<Whole>,
    /// End of the range (exclusive), Unix milliseconds (default: now).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    to: Option<Whole>,
    /// Bucket width: `10s`, `1m` or `1h` (default: 10s up to an hour, 1m up to two days,
    /// else 1h).
    #[param(inline, value_type = Option<StepName>)]
    step: Option<String>,
    /// Only this rule (by id).
    rule: Option<String>,
    /// Only this proxy (by id).
    proxy: Option<String>,
}

/// One bucket of a series.
#[derive(Debug, Serialize, ToSchema)]
pub struct SeriesPoint {
    /// The bucket's start, Unix milliseconds.
    pub t: i64,
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
}

impl SeriesPoint {
    fn new(t: i64, c: &Counts) -> SeriesPoint {
        SeriesPoint {
            t,
            allowed: c.allowed,
            denied: c.denied,
            shadow_denied: c.shadow_denied,
            near_limit: c.near_limit,
            fail_open: c.fail_open,
            key_missing: c.key_missing,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Series {
    /// The bucket width: 10, 60 or 3600.
    pub step_seconds: i64,
    /// The range asked for.
    pub from: i64,
    pub to: i64,
    /// Every bucket overlapping the range, oldest first; buckets without reports are 0.
    pub points: Vec<SeriesPoint>,
}

#[utoipa::path(
    get, path = "/api/v1/metrics/series", tag = "metrics",
    params(SeriesQuery),
    responses(
        (status = 200, description = "Counts per bucket, summed over rules and proxies (or for one rule or proxy)", body = Series),
        (status = 400, description = "A malformed range or step", body = super::error::Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// Outcomes over time.
pub async fn metrics_series(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<SeriesQuery>,
) -> Result<Json<Series>, ApiError> {
    let w = Window::requested(q.from, q.to, q.step.as_deref(), now_ms())?;
    let rule = q.rule.as_deref().filter(|r| !r.is_empty());
    let proxy = q.proxy.as_deref().filter(|p| !p.is_empty());
    let store = state.store();
    let (memory, stored) = state
        .pipeline()
        .read(
            |acc: &mut HashMap<i64, Counts>, p: &Pending| {
                for (t, bucket) in p.buckets_in(w.resolution, w.first, w.to) {
                    for (r, c) in bucket.rules(proxy) {
                        if rule.is_none_or(|want| want == r) {
                            acc.entry(t).or_default().add(c);
                        }
                    }
                }
            },
            |_| store.metric_series(w.resolution, w.first, w.to, rule, proxy),
        )
        .await?;
    let mut by_bucket = memory;
    for (t, c) in stored {
        by_bucket.entry(t).or_default().add(&c);
    }
    Ok(Json(Series {
        step_seconds: w.resolution.seconds(),
        from: w.from,
        to: w.to,
        points: w
            .buckets()
            .map(|t| SeriesPoint::new(t, &by_bucket.get(&t).copied().unwrap_or_default()))
            .collect(),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RangeQuery {
    /// Start of the range, Unix milliseconds (default: `to` minus 15 minutes); before `to`.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    from: Option<Whole>,
    /// End of the range (exclusive), Unix milliseconds (default: now).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    to: Option<Whole>,
    /// Bucket width: `10s`, `1m` or `1h` (default: chosen from the range).
    #[param(inline, value_type = Option<StepName>)]
    step: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RuleMetrics {
    /// The rule id.
    pub rule: String,
    /// The rule's current name; null for a rule that no longer exists.
    pub name: Option<String>,
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    /// (denied + shadow_denied) / (allowed + denied + shadow_denied + fail_open); 0
    /// without traffic.
    pub throttle_ratio: f64,
    /// denied + shadow_denied over the range in up to 30 equal slices, oldest first.
    pub sparkline: Vec<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RuleMetricsList {
    pub step_seconds: i64,
    pub from: i64,
    pub to: i64,
    /// Every rule with traffic in the range or defined now: most throttled first, then
    /// busiest, then by id.
    pub rules: Vec<RuleMetrics>,
}

#[utoipa::path(
    get, path = "/api/v1/metrics/rules", tag = "metrics",
    params(RangeQuery),
    responses(
        (status = 200, description = "Per-rule totals and sparklines", body = RuleMetricsList),
        (status = 400, description = "A malformed range or step", body = super::error::Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// Totals per rule, with a sparkline of throttled requests.
pub async fn metrics_rules(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<RangeQuery>,
) -> Result<Json<RuleMetricsList>, ApiError> {
    let w = Window::requested(q.from, q.to, q.step.as_deref(), now_ms())?;
    let store = state.store();
    let (memory, stored) = state
        .pipeline()
        .read(
            |acc: &mut HashMap<(i64, String), Counts>, p: &Pending| {
                for (t, bucket) in p.buckets_in(w.resolution, w.first, w.to) {
                    for (r, c) in bucket.rules(None) {
                        acc.entry((t, r.to_string())).or_default().add(c);
                    }
                }
            },
            |_| store.metric_rule_buckets(w.resolution, w.first, w.to),
        )
        .await?;
    let names = store.rule_names().await?;
    let n = usize::try_from(w.len()).unwrap_or(0);
    let slots = n.clamp(1, SPARKLINE_POINTS);
    let mut per_rule: HashMap<String, (Counts, Vec<u64>)> = names
        .keys()
        .map(|id| (id.clone(), (Counts::default(), vec![0; slots])))
        .collect();
    let rows = memory.into_iter().chain(
        stored
            .into_iter()
            .map(|b| ((b.bucket_ms, b.rule), b.counts)),
    );
    for ((t, rule), counts) in rows {
        let (total, spark) = per_rule
            .entry(rule)
            .or_insert_with(|| (Counts::default(), vec![0; slots]));
        total.add(&counts);
        if let Some(i) = w.index(t) {
            let slot = (i * slots / n.max(1)).min(slots - 1);
            spark[slot] = spark[slot].saturating_add(counts.throttled());
        }
    }
    let mut rules: Vec<RuleMetrics> = per_rule
        .into_iter()
        .map(|(rule, (c, sparkline))| RuleMetrics {
            name: names.get(&rule).cloned(),
            rule,
            allowed: c.allowed,
            denied: c.denied,
            shadow_denied: c.shadow_denied,
            near_limit: c.near_limit,
            fail_open: c.fail_open,
            key_missing: c.key_missing,
            throttle_ratio: c.throttle_ratio(),
            sparkline,
        })
        .collect();
    rules.sort_by(|a, b| {
        (b.denied + b.shadow_denied)
            .cmp(&(a.denied + a.shadow_denied))
            .then((b.allowed + b.denied).cmp(&(a.allowed + a.denied)))
            .then(a.rule.cmp(&b.rule))
    });
    Ok(Json(RuleMetricsList {
        step_seconds: w.resolution.seconds(),
        from: w.from,
        to: w.to,
        rules,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ClientsQuery {
    /// Start of the range, Unix milliseconds (default: `to` minus 15 minutes); before `to`.
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    from: Option<Whole>,
    /// End of the range (exclusive), Unix milliseconds (default: now).
    #[param(value_type = Option<u64>, minimum = 0, maximum = 9_007_199_254_740_991_u64)]
    to: Option<Whole>,
    /// Read only buckets of this width: `10s`, `1m` or `1h`. By default the range is
    /// read in whole hours, then whole minutes at its edges, then 10 s buckets: exact to
    /// 10 s at either end, and quick over long ranges.
    #[param(inline, value_type = Option<StepName>)]
    step: Option<String>,
    /// Only this rule (by id).
    rule: Option<String>,
    /// How many (default 20).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClientMetrics {
    pub client: String,
    /// The rule that throttled it (a client throttled by two rules is listed twice).
    pub rule: String,
    /// Throttled requests (denied or shadow-denied): an upper bound, exact when `error`
    /// is 0.
    pub throttled: u64,
    /// How much of `throttled` may belong to other clients (Space-Saving summaries).
    pub error: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClientMetricsList {
    pub from: i64,
    pub to: i64,
    /// Most throttled first.
    pub clients: Vec<ClientMetrics>,
}

#[utoipa::path(
    get, path = "/api/v1/metrics/clients", tag = "metrics",
    params(ClientsQuery),
    responses(
        (status = 200, description = "The most throttled clients", body = ClientMetricsList),
        (status = 400, description = "A malformed range, step or limit", body = super::error::Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// The most throttled clients, per rule. Each bucket keeps its 50 most throttled clients
/// per rule, merged over proxies.
pub async fn metrics_clients(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<ClientsQuery>,
) -> Result<Json<ClientMetricsList>, ApiError> {
    let now = now_ms();
    let w = Window::requested(q.from, q.to, q.step.as_deref(), now)?;
    let spans = match q.step.as_deref() {
        Some(step) if !step.is_empty() => vec![Span::overlapping(w.resolution, w.from, w.to)],
        _ => {
            let config = state.pipeline().config();
            Span::cover(w.from, w.to, |r| config.cutoff(r, now))
        }
    };
    let spans = spans.as_slice();
    let limit = q.limit.unwrap_or(DEFAULT_CLIENTS);
    if !(1..=MAX_CLIENTS).contains(&limit) {
        return Err(ApiError::BadRequest(format!(
            "`limit` must be between 1 and {MAX_CLIENTS}"
        )));
    }
    let rule = q.rule.as_deref().filter(|r| !r.is_empty());
    let store = state.store();
    // The stored top `limit` plus what is in memory is the answer, except for a pair in
    // memory whose stored total is unknown: outside the stored top it is at most the
    // stored `limit`-th total, so only pairs that could still make the list with that
    // much are looked up (usually none: memory holds two seconds of reports).
    let (memory, (top, extra)) = state
        .pipeline()
        .read(
            |acc: &mut HashMap<(String, String), Tally>, p: &Pending| {
                let buckets = spans
                    .iter()
                    .flat_map(|s| p.buckets_in(s.resolution, s.from_ms, s.to_ms));
                for (_, bucket) in buckets {
                    for (r, clients) in &bucket.clients {
                        if rule.is_none_or(|want| want == r) {
                            for (c, t) in clients {
                                acc.entry((c.clone(), r.clone())).or_default().add(*t);
                            }
                        }
                    }
                }
            },
            |memory| {
                let in_memory: HashMap<(String, String), u64> = memory
                    .iter()
                    .map(|(pair, t)| (pair.clone(), t.throttled))
                    .collect();
                async move {
                    let fetched = fetch_for(limit);
                    let top = store.metric_top_clients(spans, rule, fetched).await?;
                    let candidates = unresolved(&top, &in_memory, fetched, limit);
                    let extra = if candidates.is_empty() {
                        Vec::new()
                    } else {
                        let mut clients: Vec<String> =
                            candidates.iter().map(|(c, _)| c.clone()).collect();
                        clients.sort_unstable();
                        clients.dedup();
                        store
                            .metric_client_totals(spans, rule, &clients)
                            .await?
                            .into_iter()
                            .filter(|t| candidates.contains(&(t.client.clone(), t.rule.clone())))
                            .collect()
                    };
                    Ok((top, extra))
                }
            },
        )
        .await?;
    let mut totals: HashMap<(String, String), Tally> = memory;
    let mut seen = HashSet::new();
    for ClientTotal {
        client,
        rule,
        throttled,
        error,
    } in top.into_iter().chain(extra)
    {
        if seen.insert((client.clone(), rule.clone())) {
            totals
                .entry((client, rule))
                .or_default()
                .add(Tally { throttled, error });
        }
    }
    let mut clients: Vec<ClientMetrics> = totals
        .into_iter()
        .map(|((client, rule), t)| ClientMetrics {
            client,
            rule,
            throttled: t.throttled,
            error: t.error,
        })
        .collect();
    clients.sort_by(|a, b| {
        b.throttled
            .cmp(&a.throttled)
            .then_with(|| a.client.cmp(&b.client))
            .then_with(|| a.rule.cmp(&b.rule))
    });
    clients.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(Json(ClientMetricsList {
        from: w.from,
        to: w.to,
        clients,
    }))
}

/// How many stored pairs to fetch for a list of `limit`: more than asked, so that the
/// last one fetched (the most any other stored pair can have) is low and few pairs in
/// memory need their stored totals looked up.
fn fetch_for(limit: u32) -> u32 {
    limit
        .saturating_mul(4)
        .max(limit.saturating_add(100))
        .min(4 * MAX_CLIENTS)
}

/// The pairs in memory but not in the stored `top` (the `fetched` most throttled stored
/// pairs) whose stored totals could put them in the top `limit`: everything stored
/// outside `top` is at most its last total.
fn unresolved(
    top: &[ClientTotal],
    in_memory: &HashMap<(String, String), u64>,
    fetched: u32,
    limit: u32,
) -> HashSet<(String, String)> {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX).max(1);
    if top.len() < usize::try_from(fetched).unwrap_or(usize::MAX) {
        // Everything stored is in `top` already.
        return HashSet::new();
    }
    let ceiling = top.last().map_or(0, |t| t.throttled);
    let stored: HashSet<(&str, &str)> = top
        .iter()
        .map(|t| (t.client.as_str(), t.rule.as_str()))
        .collect();
    // Totals each pair has at least: stored ones plus memory, memory-only ones alone.
    let mut lower: Vec<u64> = top
        .iter()
        .map(|t| {
            let pair = (t.client.clone(), t.rule.clone());
            t.throttled
                .saturating_add(in_memory.get(&pair).copied().unwrap_or(0))
        })
        .collect();
    lower.extend(
        in_memory
            .iter()
            .filter(|((c, r), _)| !stored.contains(&(c.as_str(), r.as_str())))
            .map(|(_, n)| *n),
    );
    lower.sort_unstable_by(|a, b| b.cmp(a));
    let bar = lower.get(limit - 1).copied().unwrap_or(0);
    in_memory
        .iter()
        .filter(|((c, r), n)| {
            !stored.contains(&(c.as_str(), r.as_str())) && n.saturating_add(ceiling) >= bar
        })
        .map(|(pair, _)| pair.clone())
        .collect()
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClientPoint {
    /// The bucket's start, Unix milliseconds.
    pub t: i64,
    pub throttled: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClientRule {
    pub rule: String,
    /// Over the range.
    pub throttled: u64,
    /// Every bucket of the range, zero-filled (0 also where the client was not among
    /// the bucket's 50 most throttled).
    pub points: Vec<ClientPoint>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClientHistory {
    pub client: String,
    pub step_seconds: i64,
    pub from: i64,
    pub to: i64,
    /// The rules that throttled the client in the range, most first.
    pub rules: Vec<ClientRule>,
}

#[utoipa::path(
    get, path = "/api/v1/metrics/clients/{client}", tag = "metrics",
    params(("client" = String, Path, description = "The client key, percent-encoded"), RangeQuery),
    responses(
        (status = 200, description = "One client's throttled requests per rule over time", body = ClientHistory),
        (status = 400, description = "A malformed range or step", body = super::error::Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// One client's history.
pub async fn metrics_client(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    PathParam(client): PathParam<String>,
    Params(q): Params<RangeQuery>,
) -> Result<Json<ClientHistory>, ApiError> {
    let w = Window::requested(q.from, q.to, q.step.as_deref(), now_ms())?;
    let store = state.store();
    let who = client.as_str();
    let (memory, stored) = state
        .pipeline()
        .read(
            |acc: &mut HashMap<(String, i64), u64>, p: &Pending| {
                for (t, bucket) in p.buckets_in(w.resolution, w.first, w.to) {
                    for (r, clients) in &bucket.clients {
                        if let Some(tally) = clients.get(who) {
                            let n = acc.entry((r.clone(), t)).or_default();
                            *n = n.saturating_add(tally.throttled);
                        }
                    }
                }
            },
            |_| store.metric_client_series(w.resolution, w.first, w.to, who),
        )
        .await?;
    let n = usize::try_from(w.len()).unwrap_or(0);
    let mut per_rule: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let rows = memory.into_iter().chain(
        stored
            .into_iter()
            .map(|b| ((b.rule, b.bucket_ms), b.throttled)),
    );
    for ((rule, t), throttled) in rows {
        if let Some(i) = w.index(t) {
            let points = per_rule.entry(rule).or_insert_with(|| vec![0; n]);
            if let Some(p) = points.get_mut(i) {
                *p = p.saturating_add(throttled);
            }
        }
    }
    let mut rules: Vec<ClientRule> = per_rule
        .into_iter()
        .map(|(rule, values)| ClientRule {
            rule,
            throttled: values.iter().fold(0u64, |a, v| a.saturating_add(*v)),
            points: w
                .buckets()
                .zip(values)
                .map(|(t, throttled)| ClientPoint { t, throttled })
                .collect(),
        })
        .collect();
    rules.sort_by(|a, b| b.throttled.cmp(&a.throttled).then(a.rule.cmp(&b.rule)));
    Ok(Json(ClientHistory {
        client,
        step_seconds: w.resolution.seconds(),
        from: w.from,
        to: w.to,
        rules,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    /// The window, in seconds up to now (default 300; at most 400 days).
    #[param(minimum = 1, maximum = 34_560_000)]
    window: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProxySummary {
    /// Polling now, or polled or reported within the last 60 seconds.
    pub connected: u64,
    /// Every proxy ever seen.
    pub total: u64,
    /// How many connected proxies run each ruleset version.
    pub versions: BTreeMap<String, u64>,
    /// Connected proxies enforcing global limits with their fallback shares (their syncs
    /// with the coordinator fail); see `GET /api/v1/proxies`.
    pub on_fallback: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Overview {
    pub window_seconds: i64,
    /// Sums over rules (a request matched by two rules counts in both).
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    pub throttle_ratio: f64,
    /// Decided requests (allowed, denied, shadow-denied, failed open) per second.
    pub requests_per_second: f64,
    /// Denied and shadow-denied requests per second.
    pub throttled_per_second: f64,
    /// The current ruleset version.
    pub ruleset_version: u64,
    pub proxies: ProxySummary,
    /// Proxies reporting an error (e.g. a ruleset they refused).
    pub errors: u64,
}

#[derive(Default)]
struct OverviewMemory {
    counts: Counts,
    beats: HashMap<String, (i64, u64)>,
}

#[utoipa::path(
    get, path = "/api/v1/metrics/overview", tag = "metrics",
    params(OverviewQuery),
    responses(
        (status = 200, description = "Totals over the last `window` seconds, and the fleet", body = Overview),
        (status = 400, description = "A malformed window", body = super::error::Problem, content_type = "application/problem+json"),
        AuthErrors,
    ),
)]
/// The numbers at the top of the dashboard.
pub async fn metrics_overview(
    State(state): State<AppState>,
    _auth: Auth<Read>,
    Params(q): Params<OverviewQuery>,
) -> Result<Json<Overview>, ApiError> {
    let window = q.window.unwrap_or(DEFAULT_WINDOW_SECONDS);
    if !(1..=MAX_WINDOW_SECONDS).contains(&window) {
        return Err(ApiError::BadRequest(format!(
            "`window` must be between 1 and {MAX_WINDOW_SECONDS} seconds"
        )));
    }
    let now = now_ms();
    let w = Window::new(Some(now - window * 1000), Some(now), None, now)?;
    let store = state.store();
    let (memory, (stored, proxies)) = state
        .pipeline()
        .read(
            |acc: &mut OverviewMemory, p: &Pending| {
                for (_, bucket) in p.buckets_in(w.resolution, w.first, w.to) {
                    for (_, c) in bucket.rules(None) {
                        acc.counts.add(c);
                    }
                }
                for beat in p.beats.values() {
                    let e = acc.beats.entry(beat.id.clone()).or_default();
                    if beat.at_ms > e.0 {
                        *e = (beat.at_ms, beat.ruleset_version);
                    }
                }
            },
            |_| async {
                let series = store
                    .metric_series(w.resolution, w.first, w.to, None, None)
                    .await?;
                Ok((series, store.list_proxies().await?))
            },
        )
        .await?;
    let mut c = memory.counts;
    for (_, counts) in &stored {
        c.add(counts);
    }
    // The buckets overlapping the window start a little before it.
    let seconds = ((w.to - w.first) as f64 / 1000.0).max(1.0);
    let mut fleet = ProxySummary {
        connected: 0,
        total: 0,
        versions: BTreeMap::new(),
        on_fallback: 0,
    };
    let mut errors = 0;
    let mut beats = memory.beats;
    let syncs = state.coordinator().syncs_seen().await;
    let connected = |id: &str, last_seen: i64, version: u64, fleet: &mut ProxySummary| {
        fleet.total += 1;
        if state.polling_now(id) || now - last_seen <= CONNECTED_WITHIN_MS {
            fleet.connected += 1;
            fleet.on_fallback += u64::from(syncs.get(id).is_some_and(|s| s.on_fallback(now)));
            *fleet.versions.entry(version.to_string()).or_default() += 1;
        }
    };
    for p in proxies {
        let last_seen = match beats.remove(&p.id) {
            Some((at, _)) => at.max(p.last_seen),
            None => p.last_seen,
        };
        errors += u64::from(p.last_error.is_some());
        connected(&p.id, last_seen, p.ruleset_version, &mut fleet);
    }
    // Proxies that reported but never polled, not written yet.
    for (id, (at, version)) in beats {
        connected(&id, at, version, &mut fleet);
    }
    Ok(Json(Overview {
        window_seconds: window,
        allowed: c.allowed,
        denied: c.denied,
        shadow_denied: c.shadow_denied,
        near_limit: c.near_limit,
        fail_open: c.fail_open,
        key_missing: c.key_missing,
        throttle_ratio: c.throttle_ratio(),
        requests_per_second: c.decided() as f64 / seconds,
        throttled_per_second: c.throttled() as f64 / seconds,
        ruleset_version: *state.inner.version.borrow(),
        proxies: fleet,
        errors,
    }))
}

/// One rule in a stream event.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamRule {
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
}

/// The data of an `event: metrics`: what reports brought in the last 2 s.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamEvent {
    /// When the event was made, Unix milliseconds.
    pub t: i64,
    pub allowed: u64,
    pub denied: u64,
    pub shadow_denied: u64,
    pub near_limit: u64,
    pub fail_open: u64,
    pub key_missing: u64,
    /// The rules with reported traffic in the last 2 s, by id.
    pub rules: BTreeMap<String, StreamRule>,
}

fn stream_event(t: i64, before: &Live, now: &Live) -> StreamEvent {
    let c = now.total.since(&before.total);
    let rules = now
        .rules
        .iter()
        .filter_map(|(id, counts)| {
            let d = match before.rules.get(id) {
                Some(b) => counts.since(b),
                None => *counts,
            };
            (!d.is_zero()).then(|| {
                (
                    id.clone(),
                    StreamRule {
                        allowed: d.allowed,
                        denied: d.denied,
                        shadow_denied: d.shadow_denied,
                    },
                )
            })
        })
        .collect();
    StreamEvent {
        t,
        allowed: c.allowed,
        denied: c.denied,
        shadow_denied: c.shadow_denied,
        near_limit: c.near_limit,
        fail_open: c.fail_open,
        key_missing: c.key_missing,
        rules,
    }
}

/// One server-sent event of the stream as a client parses it (OpenAPI 3.1 describes an
/// event stream by its events): `event: metrics`, and `data` holding a [`StreamEvent`] as
/// JSON.
#[derive(Debug)]
pub struct StreamFrame;

impl utoipa::ToSchema for StreamFrame {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("StreamFrame")
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        schemas.push((
            StreamEvent::name().into_owned(),
            <StreamEvent as utoipa::PartialSchema>::schema(),
        ));
        <StreamEvent as utoipa::ToSchema>::schemas(schemas);
    }
}

impl utoipa::PartialSchema for StreamFrame {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let frame = serde_json::json!({
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"type": "string", "enum": ["metrics"]},
                "data": {"type": "string", "contentMediaType": "application/json",
                         "contentSchema": {"$ref": "#/components/schemas/StreamEvent"}},
            },
        });
        serde_json::from_value(frame).unwrap_or_else(|_| {
            utoipa::openapi::RefOr::T(utoipa::openapi::schema::Schema::Object(
                utoipa::openapi::ObjectBuilder::new().build(),
            ))
        })
    }
}

#[utoipa::path(
    get, path = "/api/v1/metrics/stream", tag = "metrics",
    responses(
        (status = 200, description = "Server-sent events: `event: metrics` every 2 s with what reports brought since the last one (data: this schema), and keep-alive comments. Ends when the server shuts down.",
         body = StreamFrame, content_type = "text/event-stream"),
        AuthErrors,
    ),
)]
/// Live counts, every 2 seconds.
pub async fn metrics_stream(
    State(state): State<AppState>,
    _auth: Auth<Read>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let start = state.pipeline().live();
    let ticks = tokio::time::interval_at(
        tokio::time::Instant::now() + STREAM_INTERVAL,
        STREAM_INTERVAL,
    );
    let events = stream::unfold(
        (state, start, ticks),
        |(state, before, mut ticks)| async move {
            tokio::select! {
                _ = ticks.tick() => {}
                () = state.shutting_down() => return None,
            }
            let now = state.pipeline().live();
            let data = stream_event(now_ms(), &before, &now);
            let event = Event::default()
                .event("metrics")
                .json_data(&data)
                .unwrap_or_else(|_| Event::default().comment("unserialisable event"));
            Some((Ok(event), (state, now, ticks)))
        },
    );
    Sse::new(events).keep_alive(KeepAlive::new().interval(STREAM_KEEP_ALIVE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_pick_their_step_and_cover_every_overlapping_bucket() {
        let w = Window::new(Some(5_000), Some(65_000), None, 0).unwrap();
        assert_eq!(w.resolution, Resolution::TenSeconds);
        assert_eq!(
            w.buckets().collect::<Vec<_>>(),
            [0, 10_000, 20_000, 30_000, 40_000, 50_000, 60_000]
        );
        assert_eq!(w.index(60_000), Some(6));
        assert_eq!(w.index(70_000), None);
        let now = 1_800_000_000_000;
        let w = Window::new(None, None, None, now).unwrap();
        assert_eq!((w.from, w.to), (now - DEFAULT_RANGE_MS, now));
        assert_eq!(w.len(), 90);
        let day = Window::new(Some(0), Some(86_400_000), None, now).unwrap();
        assert_eq!(day.resolution, Resolution::Minute);
        let week = Window::new(Some(0), Some(7 * 86_400_000), None, now).unwrap();
        assert_eq!((week.resolution, week.len()), (Resolution::Hour, 168));
        let forced = Window::new(Some(0), Some(3_600_000), Some("1m"), now).unwrap();
        assert_eq!(forced.len(), 60);
        assert!(Window::new(Some(0), Some(7 * 86_400_000), Some("10s"), now).is_err());
        assert!(Window::new(Some(10), Some(10), None, now).is_err());
        assert!(Window::new(Some(0), Some(10), Some("5m"), now).is_err());
        assert!(Window::new(Some(-10), Some(10), None, now).is_err());
    }

    #[test]
    fn only_pairs_that_could_make_the_list_are_looked_up() {
        let total = |client: &str, throttled| ClientTotal {
            client: client.into(),
            rule: "r".into(),
            throttled,
            error: 0,
        };
        let pair = |c: &str| (c.to_string(), "r".to_string());
        let top = [total("a", 100), total("b", 50)];
        let memory: HashMap<_, _> = [
            (pair("a"), 1),
            (pair("x"), 60),
            (pair("y"), 1),
            (pair("z"), 0),
        ]
        .into_iter()
        .collect();
        // The 2nd best is at least 60 (x), y can reach at most 1 + 50.
        assert_eq!(
            unresolved(&top, &memory, 2, 2),
            [pair("x")].into_iter().collect()
        );
        // Fewer stored than asked for: every stored pair is known already.
        assert!(unresolved(&top, &memory, 4, 2).is_empty());
        // Full: the 4th best is at least 40 (c); y (1 + 30) and z cannot reach it, x can.
        let full = [
            total("a", 100),
            total("b", 50),
            total("c", 40),
            total("d", 30),
        ];
        assert_eq!(
            unresolved(&full, &memory, 4, 4),
            [pair("x")].into_iter().collect()
        );
        let mut memory = memory;
        memory.insert(pair("y"), 15);
        assert_eq!(unresolved(&full, &memory, 4, 4).len(), 2);
        // Fetching more than asked lowers the ceiling: for a list of 2 from 4 fetched,
        // only x (60 + 30 >= 60) can make it, y (15 + 30) cannot.
        assert_eq!(
            unresolved(&full, &memory, 4, 2),
            [pair("x")].into_iter().collect()
        );
        assert_eq!(fetch_for(20), 120);
        assert_eq!(fetch_for(1000), 4000);
    }

    #[test]
    fn stream_events_are_differences() {
        let mut before = Live::default();
        let mut now = Live::default();
        let c = |denied| Counts {
            denied,
            ..Counts::default()
        };
        before.total = c(5);
        before.rules.insert("a".into(), c(5));
        now.total = c(8);
        now.rules.insert("a".into(), c(5));
        now.rules.insert("b".into(), c(3));
        let e = stream_event(1, &before, &now);
        assert_eq!(e.denied, 3);
        assert_eq!(e.rules.keys().collect::<Vec<_>>(), ["b"]);
    }
}
