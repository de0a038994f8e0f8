//! The pipeline's reads: what the metrics endpoints show, as domain values. Each query
//! folds what is still in memory into what is stored (see [`Pipeline::read`]), then bins,
//! merges and sorts, so the handlers only parse a request and shape the answer.

use std::collections::{BTreeMap, HashMap, HashSet};

use sluice_core::estimate::{MAX_BUCKETS, RecordedBucket, RecordedClient};

use super::{Bucket, Live, Pending, Pipeline, RequestTally, Tally};
use crate::store::{
    ClientTotal, Counts, Resolution, Span, Store, StoreError, TOP_CLIENTS_PER_BUCKET,
};

/// The range shown when none is given.
pub(crate) const DEFAULT_RANGE_MS: i64 = 15 * 60 * 1000;
/// Most points in one series (a week in minutes is 10,080); a longer range is cut to its
/// last `MAX_POINTS` buckets.
pub(crate) const MAX_POINTS: i64 = 20_000;
/// Values in a rule's sparkline.
pub(crate) const SPARKLINE_POINTS: usize = 30;
/// The most clients one list may ask for.
pub(crate) const MAX_CLIENTS: u32 = 1000;

/// A range that cannot be shown, and why (the request's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RangeError(String);

/// A resolved range: buckets of `resolution` starting in `[first, to)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub(crate) resolution: Resolution,
    /// The range shown, Unix milliseconds: the one asked for, cut to at most
    /// [`MAX_POINTS`] buckets, or empty (`from == to`) when `from` was not before `to`.
    pub(crate) from: i64,
    pub(crate) to: i64,
    /// The start of the bucket holding `from`; `to` when the range is empty.
    pub(crate) first: i64,
}

impl Window {
    /// The window from `from` (default: `to` minus [`DEFAULT_RANGE_MS`], at least 0) to
    /// `to` (default: `now`), in buckets of `step` (`10s`, `1m`, `1h`; default: chosen from
    /// the range).
    ///
    /// Every range the document's parameters admit is answered, because JSON Schema
    /// cannot compare `from` with `to`, nor bound their distance in steps: a `from` at or
    /// after `to` is an empty range (no buckets), and a range of more than [`MAX_POINTS`]
    /// buckets is cut to its last `MAX_POINTS` (its newest, as a dashboard wants; the
    /// default retentions keep fewer 10 s and 1 h buckets than that anyway). The answer's
    /// `from` and `to` say what was shown. Only a negative time or an unknown step (which
    /// the document excludes) is refused.
    pub(crate) fn new(
        from: Option<i64>,
        to: Option<i64>,
        step: Option<&str>,
        now: i64,
    ) -> Result<Window, RangeError> {
        let to = to.unwrap_or(now);
        let from = from.unwrap_or(to.saturating_sub(DEFAULT_RANGE_MS).max(0));
        if from < 0 || to < 0 {
            return Err(RangeError(
                "`from` and `to` are Unix milliseconds and cannot be negative".into(),
            ));
        }
        let resolution = match step {
            None => Resolution::for_range(to.saturating_sub(from).max(0)),
            Some(label) => Resolution::from_label(label).ok_or_else(|| {
                RangeError(format!("`step` must be 10s, 1m or 1h, not `{label}`"))
            })?,
        };
        if from >= to {
            return Ok(Window {
                resolution,
                from: to,
                to,
                first: to,
            });
        }
        let mut window = Window {
            resolution,
            from,
            to,
            first: resolution.bucket(from),
        };
        if window.len() > MAX_POINTS {
            // The last bucket is the one holding `to - 1`; start MAX_POINTS - 1 before it.
            window.first = resolution.bucket(to - 1) - (MAX_POINTS - 1) * resolution.ms();
            window.from = window.first;
        }
        Ok(window)
    }

    /// Buckets in the range.
    fn len(&self) -> i64 {
        let ms = self.resolution.ms();
        (self.to - self.first + ms - 1) / ms
    }

    /// Whether the range holds no bucket (`from` was not before `to`).
    pub fn is_empty(&self) -> bool {
        self.first >= self.to
    }

    /// The start of every bucket in the range, oldest first.
    fn buckets(&self) -> impl Iterator<Item = i64> + use<> {
        let (first, ms) = (self.first, self.resolution.ms());
        (0..self.len()).map(move |i| first + i * ms)
    }

    /// The position of a bucket in the range.
    fn index(&self, bucket: i64) -> Option<usize> {
        let i = (bucket - self.first) / self.resolution.ms();
        (bucket >= self.first && bucket < self.to).then(|| usize::try_from(i).ok())?
    }

    /// Buckets in the range, as a length.
    fn slots(&self) -> usize {
        usize::try_from(self.len()).unwrap_or(0)
    }

    /// The range's buckets, as the store reads them.
    fn span(&self) -> Span {
        Span {
            resolution: self.resolution,
            from_ms: self.first,
            to_ms: self.to,
        }
    }
}

/// One rule's totals over a window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RuleTotals {
    pub(crate) rule: String,
    /// Its current name; `None` for a rule that no longer exists.
    pub(crate) name: Option<String>,
    pub(crate) counts: Counts,
    /// Throttled requests over the window in up to [`SPARKLINE_POINTS`] equal slices,
    /// oldest first.
    pub(crate) sparkline: Vec<u64>,
}

/// One rule's throttling of one client over a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientRuleHistory {
    pub(crate) rule: String,
    /// Over the window.
    pub(crate) throttled: u64,
    /// (bucket start, throttled) for every bucket of the window, zero-filled.
    pub(crate) points: Vec<(i64, u64)>,
}

/// The fleet as the overview counts it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Fleet {
    /// Proxies that count as connected.
    pub(crate) connected: u64,
    /// Every proxy ever seen.
    pub(crate) total: u64,
    /// Connected proxies by the ruleset version they run.
    pub(crate) versions: BTreeMap<u64, u64>,
    /// Connected proxies on their fallback shares.
    pub(crate) on_fallback: u64,
    /// Proxies reporting an error.
    pub(crate) errors: u64,
}

/// Totals over a window and the fleet: the numbers at the top of the dashboard.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Totals {
    pub(crate) counts: Counts,
    /// The seconds the counts cover: the buckets overlapping the window start a little
    /// before it.
    pub(crate) seconds: f64,
    pub(crate) fleet: Fleet,
}

/// What reports brought between two readings of the live totals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LiveDelta {
    pub(crate) total: Counts,
    /// Only the rules with traffic in between.
    pub(crate) rules: BTreeMap<String, Counts>,
}

impl Live {
    /// What arrived since `before`, an earlier reading.
    pub(crate) fn since(&self, before: &Live) -> LiveDelta {
        let rules = self
            .rules
            .iter()
            .filter_map(|(id, counts)| {
                let delta = match before.rules.get(id) {
                    Some(b) => counts.since(b),
                    None => *counts,
                };
                (!delta.is_zero()).then(|| (id.clone(), delta))
            })
            .collect();
        LiveDelta {
            total: self.total.since(&before.total),
            rules,
        }
    }
}

#[derive(Default)]
struct OverviewMemory {
    counts: Counts,
    /// proxy → (last report, ruleset version it ran).
    beats: HashMap<String, (i64, u64)>,
}

impl Pipeline {
    /// [`Pipeline::read`] of a window: `visit` sees each of its buckets still in memory,
    /// with its start.
    async fn read_window<M, D, Fut>(
        &self,
        w: &Window,
        visit: impl Fn(&mut M, i64, &Bucket),
        db: impl Fn(&M) -> Fut,
    ) -> Result<(M, D), StoreError>
    where
        M: Default,
        Fut: Future<Output = Result<D, StoreError>>,
    {
        let span = w.span();
        let visit_pending = |acc: &mut M, p: &Pending| {
            for (t, bucket) in p.buckets_in(span) {
                visit(acc, t, bucket);
            }
        };
        self.read(visit_pending, db).await
    }

    /// Counts per bucket of the window, summed over rules and proxies (or for one rule
    /// or one proxy); every bucket is listed, oldest first, zero-filled.
    pub(crate) async fn series(
        &self,
        store: &Store,
        w: &Window,
        rule: Option<&str>,
        proxy: Option<&str>,
    ) -> Result<Vec<(i64, Counts)>, StoreError> {
        let (memory, stored) = self
            .read_window(
                w,
                |acc: &mut HashMap<i64, Counts>, t, bucket| {
                    for (r, c) in bucket.rules(proxy) {
                        if rule.is_none_or(|want| want == r) {
                            acc.entry(t).or_default().add(c);
                        }
                    }
                },
                |_| store.metric_series(w.span(), rule, proxy),
            )
            .await?;
        let mut by_bucket = memory;
        for (t, c) in stored {
            by_bucket.entry(t).or_default().add(&c);
        }
        Ok(w.buckets()
            .map(|t| (t, by_bucket.get(&t).copied().unwrap_or_default()))
            .collect())
    }

    /// What rule `rule` decided over the window (10 s buckets): the requests, exactly,
    /// and the clients that sent it the most, per bucket, for a dry run to replay.
    pub(crate) async fn recorded_traffic(
        &self,
        store: &Store,
        w: &Window,
        rule: &str,
    ) -> Result<(u64, Vec<RecordedClient>), StoreError> {
        #[derive(Default)]
        struct Memory {
            decided: u64,
            requesters: HashMap<(String, i64), RequestTally>,
        }
        let most_rows = u32::try_from(MAX_BUCKETS * TOP_CLIENTS_PER_BUCKET).unwrap_or(u32::MAX);
        let (memory, (series, stored)) = self
            .read_window(
                w,
                |acc: &mut Memory, t, bucket| {
                    for (r, c) in bucket.rules(None) {
                        if r == rule {
                            acc.decided = acc.decided.saturating_add(c.decided());
                        }
                    }
                    for (client, tally) in bucket.requesters.get(rule).into_iter().flatten() {
                        let key = (client.clone(), t);
                        acc.requesters.entry(key).or_default().add(*tally);
                    }
                },
                |_| async move {
                    let series = store.metric_series(w.span(), Some(rule), None).await?;
                    let requesters = store.metric_requesters(w.span(), rule, most_rows).await?;
                    Ok((series, requesters))
                },
            )
            .await?;
        let decided = (series.iter()).fold(memory.decided, |sum, (_, c)| {
            sum.saturating_add(c.decided())
        });
        let mut per_pair = memory.requesters;
        for row in stored {
            let tally = RequestTally {
                requests: row.requests,
                error: row.error,
            };
            per_pair
                .entry((row.client, row.bucket_ms))
                .or_default()
                .add(tally);
        }
        let mut clients: BTreeMap<String, Vec<RecordedBucket>> = BTreeMap::new();
        for ((client, bucket_ms), tally) in per_pair {
            clients.entry(client).or_default().push(RecordedBucket {
                start_ms: u64::try_from(bucket_ms).unwrap_or(0),
                requests: tally.requests,
                error: tally.error,
            });
        }
        let clients = clients
            .into_iter()
            .map(|(client, buckets)| RecordedClient { client, buckets })
            .collect();
        Ok((decided, clients))
    }

    /// Every rule with traffic in the window or defined now, with its totals and
    /// sparkline: most throttled first, then busiest, then by id.
    pub(crate) async fn rule_totals(
        &self,
        store: &Store,
        w: &Window,
    ) -> Result<Vec<RuleTotals>, StoreError> {
        let (memory, stored) = self
            .read_window(
                w,
                |acc: &mut HashMap<(i64, String), Counts>, t, bucket| {
                    for (r, c) in bucket.rules(None) {
                        acc.entry((t, r.to_string())).or_default().add(c);
                    }
                },
                |_| store.metric_rule_buckets(w.span()),
            )
            .await?;
        let names = store.rule_names().await?;
        let rows = memory.into_iter().chain(
            stored
                .into_iter()
                .map(|b| ((b.bucket_ms, b.rule), b.counts)),
        );
        Ok(rule_totals(w, &names, rows))
    }

    /// The `limit` most throttled (client, rule) pairs in the window, most first. Reads
    /// the window from the coarsest buckets still kept unless `step` fixes a resolution.
    pub(crate) async fn top_clients(
        &self,
        store: &Store,
        w: &Window,
        step: Option<Resolution>,
        rule: Option<&str>,
        limit: u32,
        now: i64,
    ) -> Result<Vec<ClientTotal>, StoreError> {
        let spans = match step {
            Some(_) if w.is_empty() => Vec::new(),
            Some(resolution) => vec![Span::overlapping(resolution, w.from, w.to)],
            None => Span::cover(w.from, w.to, |r| self.config.cutoff(r, now)),
        };
        let spans = spans.as_slice();
        // The stored top `limit` plus what is in memory is the answer, except for a pair
        // in memory whose stored total is unknown: outside the stored top it is at most
        // the stored `limit`-th total, so only pairs that could still make the list with
        // that much are looked up (usually none: memory holds two seconds of reports).
        let (memory, (top, extra)) = self
            .read(
                |acc: &mut HashMap<(String, String), Tally>, p: &Pending| {
                    let buckets = spans.iter().flat_map(|s| p.buckets_in(*s));
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
                                .filter(|t| {
                                    candidates.contains(&(t.client.clone(), t.rule.clone()))
                                })
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
            tokens,
        } in top.into_iter().chain(extra)
        {
            if seen.insert((client.clone(), rule.clone())) {
                totals.entry((client, rule)).or_default().add(Tally {
                    throttled,
                    error,
                    tokens,
                });
            }
        }
        let mut clients: Vec<ClientTotal> = totals
            .into_iter()
            .map(|((client, rule), t)| ClientTotal {
                client,
                rule,
                throttled: t.throttled,
                error: t.error,
                tokens: t.tokens,
            })
            .collect();
        clients.sort_by(|a, b| {
            b.throttled
                .cmp(&a.throttled)
                .then_with(|| a.client.cmp(&b.client))
                .then_with(|| a.rule.cmp(&b.rule))
        });
        clients.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(clients)
    }

    /// One client's throttled requests per rule over the window, the rule that
    /// throttled it most first.
    pub(crate) async fn client_history(
        &self,
        store: &Store,
        w: &Window,
        client: &str,
    ) -> Result<Vec<ClientRuleHistory>, StoreError> {
        let (memory, stored) = self
            .read_window(
                w,
                |acc: &mut HashMap<(String, i64), u64>, t, bucket| {
                    for (r, clients) in &bucket.clients {
                        if let Some(tally) = clients.get(client) {
                            let n = acc.entry((r.clone(), t)).or_default();
                            *n = n.saturating_add(tally.throttled);
                        }
                    }
                },
                |_| store.metric_client_series(w.span(), client),
            )
            .await?;
        let rows = memory.into_iter().chain(
            stored
                .into_iter()
                .map(|b| ((b.rule, b.bucket_ms), b.throttled)),
        );
        Ok(client_history(w, rows))
    }

    /// Totals over the window, and the fleet: `connected(id, last_seen)` says whether a
    /// proxy last seen then counts as connected, `on_fallback(id)` whether it enforces
    /// global limits with its fallback shares.
    pub(crate) async fn totals(
        &self,
        store: &Store,
        w: &Window,
        connected: impl Fn(&str, i64) -> bool,
        on_fallback: impl Fn(&str) -> bool,
    ) -> Result<Totals, StoreError> {
        let (memory, (stored, proxies)) = self
            .read(
                |acc: &mut OverviewMemory, p: &Pending| {
                    for (_, bucket) in p.buckets_in(w.span()) {
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
                    let series = store.metric_series(w.span(), None, None).await?;
                    Ok((series, store.list_proxies().await?))
                },
            )
            .await?;
        let mut counts = memory.counts;
        for (_, c) in &stored {
            counts.add(c);
        }
        let mut fleet = Fleet::default();
        let count = |id: &str, last_seen: i64, version: u64, fleet: &mut Fleet| {
            fleet.total += 1;
            if connected(id, last_seen) {
                fleet.connected += 1;
                fleet.on_fallback += u64::from(on_fallback(id));
                *fleet.versions.entry(version).or_default() += 1;
            }
        };
        let mut beats = memory.beats;
        for p in proxies {
            let last_seen = match beats.remove(&p.id) {
                Some((at, _)) => at.max(p.last_seen),
                None => p.last_seen,
            };
            fleet.errors += u64::from(p.last_error.is_some());
            count(&p.id, last_seen, p.ruleset_version, &mut fleet);
        }
        // Proxies that reported but never polled, not written yet.
        for (id, (at, version)) in beats {
            count(&id, at, version, &mut fleet);
        }
        Ok(Totals {
            counts,
            seconds: ((w.to - w.first) as f64 / 1000.0).max(1.0),
            fleet,
        })
    }
}

/// Per-rule totals and sparklines from (bucket, rule) rows, for every rule in `names`
/// too; sorted most throttled first, then busiest, then by id.
fn rule_totals(
    w: &Window,
    names: &HashMap<String, String>,
    rows: impl Iterator<Item = ((i64, String), Counts)>,
) -> Vec<RuleTotals> {
    let n = w.slots();
    let slots = n.clamp(1, SPARKLINE_POINTS);
    let mut per_rule: HashMap<String, (Counts, Vec<u64>)> = names
        .keys()
        .map(|id| (id.clone(), (Counts::default(), vec![0; slots])))
        .collect();
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
    let mut rules: Vec<RuleTotals> = per_rule
        .into_iter()
        .map(|(rule, (counts, sparkline))| RuleTotals {
            name: names.get(&rule).cloned(),
            rule,
            counts,
            sparkline,
        })
        .collect();
    rules.sort_by(|a, b| {
        let (a_c, b_c) = (&a.counts, &b.counts);
        (b_c.denied + b_c.shadow_denied)
            .cmp(&(a_c.denied + a_c.shadow_denied))
            .then((b_c.allowed + b_c.denied).cmp(&(a_c.allowed + a_c.denied)))
            .then(a.rule.cmp(&b.rule))
    });
    rules
}

/// A client's per-rule series from ((rule, bucket), throttled) rows; most throttled
/// rule first.
fn client_history(
    w: &Window,
    rows: impl Iterator<Item = ((String, i64), u64)>,
) -> Vec<ClientRuleHistory> {
    let n = w.slots();
    let mut per_rule: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for ((rule, t), throttled) in rows {
        if let Some(i) = w.index(t) {
            let points = per_rule.entry(rule).or_insert_with(|| vec![0; n]);
            if let Some(p) = points.get_mut(i) {
                *p = p.saturating_add(throttled);
            }
        }
    }
    let mut rules: Vec<ClientRuleHistory> = per_rule
        .into_iter()
        .map(|(rule, values)| ClientRuleHistory {
            rule,
            throttled: values.iter().fold(0u64, |a, v| a.saturating_add(*v)),
            points: w.buckets().zip(values).collect(),
        })
        .collect();
    rules.sort_by(|a, b| b.throttled.cmp(&a.throttled).then(a.rule.cmp(&b.rule)));
    rules
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest time the document admits (2^53 - 1).
    const MAX_SAFE_MS: i64 = 9_007_199_254_740_991;

    fn denied(denied: u64) -> Counts {
        Counts::only_denied(denied)
    }

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
        assert!(Window::new(Some(0), Some(10), Some("5m"), now).is_err());
        assert!(Window::new(Some(-10), Some(10), None, now).is_err());
    }

    #[test]
    fn every_range_is_answered_cut_to_its_last_buckets_or_empty() {
        let now = 1_800_000_000_000;
        // A week in 10 s buckets is 60,480: the last 20,000 are shown, the newest intact.
        let week = 7 * 86_400_000;
        let cut = Window::new(Some(5), Some(week + 5), Some("10s"), now).unwrap();
        assert_eq!(cut.len(), MAX_POINTS);
        assert_eq!(cut.buckets().last(), Some(week));
        assert_eq!(cut.from, cut.first);
        assert_eq!(cut.first, week - (MAX_POINTS - 1) * 10_000);
        // The longest range the document admits, at every step.
        for step in ["10s", "1m", "1h"] {
            let w = Window::new(Some(0), Some(MAX_SAFE_MS), Some(step), now).unwrap();
            assert_eq!(w.len(), MAX_POINTS, "{step}");
            assert_eq!(w.to, MAX_SAFE_MS);
        }
        let w = Window::new(Some(0), Some(MAX_SAFE_MS), None, now).unwrap();
        assert_eq!((w.resolution, w.len()), (Resolution::Hour, MAX_POINTS));
        // `from` at or after `to`: an empty range, shown as `to..to`.
        for (from, to) in [(10, 10), (15, 12), (MAX_SAFE_MS, 0)] {
            let w = Window::new(Some(from), Some(to), None, now).unwrap();
            assert!(w.is_empty());
            assert_eq!((w.from, w.to, w.len()), (to, to, 0));
            assert_eq!(w.buckets().count(), 0);
            assert_eq!(w.index(Resolution::TenSeconds.bucket(to)), None);
        }
        // `to` within 15 minutes of the epoch: the default `from` is 0, not negative.
        let early = Window::new(None, Some(60_000), None, now).unwrap();
        assert_eq!((early.from, early.len()), (0, 6));
        assert!(Window::new(None, Some(0), None, now).unwrap().is_empty());
    }

    #[test]
    fn rules_are_binned_into_sparklines_and_sorted_most_throttled_first() {
        // 60 buckets of 10 s: two per sparkline slot.
        let w = Window::new(Some(0), Some(600_000), Some("10s"), 0).unwrap();
        let names: HashMap<String, String> = [("quiet".to_string(), "Quiet".to_string())]
            .into_iter()
            .collect();
        let rows = [
            ((0, "a".to_string()), denied(1)),
            ((10_000, "a".to_string()), denied(2)),
            ((590_000, "a".to_string()), denied(4)),
            ((20_000, "b".to_string()), denied(9)),
            // Outside the window: counted in the totals, not in the sparkline.
            ((600_000, "b".to_string()), denied(1)),
        ];
        let rules = rule_totals(&w, &names, rows.into_iter());
        let ids: Vec<&str> = rules.iter().map(|r| r.rule.as_str()).collect();
        assert_eq!(ids, ["b", "a", "quiet"]);
        assert_eq!(rules[0].counts.denied, 10);
        assert_eq!(rules[0].sparkline[1], 9);
        assert_eq!(rules[0].sparkline.iter().sum::<u64>(), 9);
        assert_eq!(rules[1].sparkline.len(), SPARKLINE_POINTS);
        assert_eq!((rules[1].sparkline[0], rules[1].sparkline[29]), (3, 4));
        assert_eq!(rules[1].name, None);
        assert_eq!(rules[2].name.as_deref(), Some("Quiet"));
        assert!(rules[2].counts.is_zero());
    }

    #[test]
    fn a_clients_history_is_zero_filled_and_sorted_by_rule_total() {
        let w = Window::new(Some(0), Some(30_000), Some("10s"), 0).unwrap();
        let rows = [
            (("a".to_string(), 0), 1),
            (("a".to_string(), 0), 1),
            (("b".to_string(), 20_000), 5),
            (("b".to_string(), 40_000), 7),
        ];
        let history = client_history(&w, rows.into_iter());
        assert_eq!(history.len(), 2);
        assert_eq!(history[0].rule, "b");
        assert_eq!(history[0].throttled, 5);
        assert_eq!(history[0].points, [(0, 0), (10_000, 0), (20_000, 5)]);
        assert_eq!(history[1].points, [(0, 2), (10_000, 0), (20_000, 0)]);
    }

    #[test]
    fn only_pairs_that_could_make_the_list_are_looked_up() {
        let total = |client: &str, throttled| ClientTotal {
            client: client.into(),
            rule: "r".into(),
            throttled,
            error: 0,
            tokens: 0,
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
    fn live_deltas_are_differences() {
        let mut before = Live::default();
        let mut now = Live::default();
        before.total = denied(5);
        before.rules.insert("a".into(), denied(5));
        now.total = denied(8);
        now.rules.insert("a".into(), denied(5));
        now.rules.insert("b".into(), denied(3));
        let delta = now.since(&before);
        assert_eq!(delta.total.denied, 3);
        assert_eq!(delta.rules.keys().collect::<Vec<_>>(), ["b"]);
    }
}
