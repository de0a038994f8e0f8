//! What the pipeline holds in memory between flushes: counts per (resolution, bucket,
//! proxy, rule), client tallies per (resolution, bucket, rule), the clients with the most
//! requests per (10 s bucket, rule), and proxies' signs of life.

use std::collections::{BTreeMap, HashMap};

use crate::store::{
    ClientBucket, Counts, MetricsBatch, ProxyBeat, ProxyBucket, RequesterBucket, Resolution,
    RuleBucket, Span, TOP_CLIENTS_PER_BUCKET,
};

/// Clients tracked in memory per rule and bucket before the tally is cut back to
/// [`CLIENTS_KEPT_ON_TRIM`]. Far more than the 50 stored, so that merging one flush
/// interval's reports from many proxies loses nothing that could reach the top 50.
const MAX_CLIENTS_IN_MEMORY: usize = 2_000;
const CLIENTS_KEPT_ON_TRIM: usize = 500;

/// A client's throttled count (an upper bound), how much of it may belong to others, and
/// the tokens its throttled requests asked for (an upper bound too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tally {
    pub(crate) throttled: u64,
    pub(crate) error: u64,
    pub(crate) tokens: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, other: Tally) {
        self.throttled = self.throttled.saturating_add(other.throttled);
        self.error = self.error.saturating_add(other.error);
        self.tokens = self.tokens.saturating_add(other.tokens);
    }
}

/// A client's requests to a rule, whatever their outcome (an upper bound), and how much of
/// them may belong to others.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RequestTally {
    pub(crate) requests: u64,
    pub(crate) error: u64,
}

impl RequestTally {
    pub(crate) fn add(&mut self, other: RequestTally) {
        self.requests = self.requests.saturating_add(other.requests);
        self.error = self.error.saturating_add(other.error);
    }
}

/// One bucket of one resolution.
#[derive(Debug, Default, Clone)]
pub(crate) struct Bucket {
    /// proxy → rule → counts.
    pub(crate) proxies: HashMap<String, HashMap<String, Counts>>,
    /// rule → client → tally.
    pub(crate) clients: HashMap<String, HashMap<String, Tally>>,
    /// rule → client → requests (10 s buckets only).
    pub(crate) requesters: HashMap<String, HashMap<String, RequestTally>>,
}

impl Bucket {
    /// The counts of every rule, summed over proxies (or of one proxy's rules).
    pub(crate) fn rules<'a>(
        &'a self,
        proxy: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a str, &'a Counts)> + 'a {
        self.proxies
            .iter()
            .filter(move |(p, _)| proxy.is_none_or(|want| want == p.as_str()))
            .flat_map(|(_, rules)| rules.iter().map(|(r, c)| (r.as_str(), c)))
    }
}

/// Not yet written data.
#[derive(Debug, Default, Clone)]
pub(crate) struct Pending {
    pub(crate) buckets: BTreeMap<(Resolution, i64), Bucket>,
    /// proxy → its latest report.
    pub(crate) beats: HashMap<String, ProxyBeat>,
    /// Count and client entries held: the bound on memory.
    pub(crate) entries: usize,
}

impl Pending {
    pub(crate) fn is_empty(&self) -> bool {
        self.buckets.is_empty() && self.beats.is_empty()
    }

    /// The buckets of `span`.
    pub(crate) fn buckets_in(&self, span: Span) -> impl Iterator<Item = (i64, &Bucket)> {
        let Span {
            resolution,
            from_ms,
            to_ms,
        } = span;
        let range = if from_ms < to_ms {
            (resolution, from_ms)..(resolution, to_ms)
        } else {
            (resolution, from_ms)..(resolution, from_ms)
        };
        self.buckets.range(range).map(|((_, t), b)| (*t, b))
    }

    /// Adds one rule's counts for one proxy to a bucket.
    pub(crate) fn add_counts(
        &mut self,
        resolution: Resolution,
        bucket_ms: i64,
        proxy: &str,
        rule: &str,
        counts: &Counts,
    ) {
        let bucket = self.buckets.entry((resolution, bucket_ms)).or_default();
        if add_nested(&mut bucket.proxies, proxy, rule, *counts, |c, n| c.add(&n)).is_some() {
            self.entries += 1;
        }
    }

    /// Adds a client's tally for a rule to a bucket.
    pub(crate) fn add_client(
        &mut self,
        resolution: Resolution,
        bucket_ms: i64,
        rule: &str,
        client: &str,
        tally: Tally,
    ) {
        let bucket = self.buckets.entry((resolution, bucket_ms)).or_default();
        let clients = &mut bucket.clients;
        add_tracked(
            clients,
            rule,
            client,
            tally,
            Tally::add,
            |t| t.throttled,
            &mut self.entries,
        );
    }

    /// Adds a client's requests to a rule to a 10 s bucket.
    pub(crate) fn add_requester(
        &mut self,
        bucket_ms: i64,
        rule: &str,
        client: &str,
        tally: RequestTally,
    ) {
        let key = (Resolution::TenSeconds, bucket_ms);
        let bucket = self.buckets.entry(key).or_default();
        let requesters = &mut bucket.requesters;
        let requests = |t: &RequestTally| t.requests;
        add_tracked(
            requesters,
            rule,
            client,
            tally,
            RequestTally::add,
            requests,
            &mut self.entries,
        );
    }

    /// Folds another pending set in (a failed flush's data, back for the next attempt).
    pub(crate) fn merge(&mut self, other: &Pending) {
        for ((resolution, bucket_ms), bucket) in &other.buckets {
            for (proxy, rules) in &bucket.proxies {
                for (rule, counts) in rules {
                    self.add_counts(*resolution, *bucket_ms, proxy, rule, counts);
                }
            }
            for (rule, clients) in &bucket.clients {
                for (client, tally) in clients {
                    self.add_client(*resolution, *bucket_ms, rule, client, *tally);
                }
            }
            for (rule, clients) in &bucket.requesters {
                for (client, tally) in clients {
                    self.add_requester(*bucket_ms, rule, client, *tally);
                }
            }
        }
        for beat in other.beats.values() {
            self.beat(beat.clone());
        }
    }

    /// Records a sign of life, keeping the latest.
    pub(crate) fn beat(&mut self, beat: ProxyBeat) {
        match self.beats.get_mut(&beat.id) {
            Some(known) if known.at_ms >= beat.at_ms => {}
            Some(known) => *known = beat,
            None => {
                self.beats.insert(beat.id.clone(), beat);
            }
        }
    }

    /// The rows to write: per proxy, per rule (summed over proxies), and each bucket's
    /// top clients per rule.
    pub(crate) fn to_batch(&self) -> MetricsBatch {
        let mut batch = MetricsBatch::default();
        for (&(resolution, bucket_ms), bucket) in &self.buckets {
            let mut per_rule: HashMap<&str, Counts> = HashMap::new();
            for (proxy, rules) in &bucket.proxies {
                for (rule, counts) in rules {
                    per_rule.entry(rule.as_str()).or_default().add(counts);
                    batch.proxies.push(ProxyBucket {
                        resolution,
                        bucket_ms,
                        proxy: proxy.clone(),
                        rule: rule.clone(),
                        counts: *counts,
                    });
                }
            }
            batch
                .rules
                .extend(per_rule.into_iter().map(|(rule, counts)| RuleBucket {
                    resolution,
                    bucket_ms,
                    rule: rule.to_string(),
                    counts,
                }));
            for (rule, clients) in &bucket.clients {
                for (client, tally) in top(clients, TOP_CLIENTS_PER_BUCKET) {
                    batch.clients.push(ClientBucket {
                        resolution,
                        bucket_ms,
                        rule: rule.clone(),
                        client: client.to_string(),
                        throttled: tally.throttled,
                        error: tally.error,
                        tokens: tally.tokens,
                    });
                }
            }
            for (rule, clients) in &bucket.requesters {
                for (client, tally) in top_by(clients, TOP_CLIENTS_PER_BUCKET, |t| t.requests) {
                    batch.requesters.push(RequesterBucket {
                        resolution,
                        bucket_ms,
                        rule: rule.clone(),
                        client: client.to_string(),
                        requests: tally.requests,
                        error: tally.error,
                    });
                }
            }
        }
        batch.beats = self.beats.values().cloned().collect();
        batch
    }
}

/// Adds `value` at `outer` → `inner` in a two-level map (`add` to what is there, or the
/// entry made), allocating keys only for new entries. A new entry returns how many entries
/// `outer` holds now.
fn add_nested<V>(
    map: &mut HashMap<String, HashMap<String, V>>,
    outer: &str,
    inner: &str,
    value: V,
    add: impl FnOnce(&mut V, V),
) -> Option<usize> {
    let entries = match map.get_mut(outer) {
        Some(entries) => entries,
        None => map.entry(outer.to_string()).or_default(),
    };
    match entries.get_mut(inner) {
        Some(known) => {
            add(known, value);
            None
        }
        None => {
            entries.insert(inner.to_string(), value);
            Some(entries.len())
        }
    }
}

/// Adds `value` for `client` of `rule` to a bucket's rule → client map, cutting the rule's
/// clients back to [`CLIENTS_KEPT_ON_TRIM`] (those with the most `count`) when they grow
/// past [`MAX_CLIENTS_IN_MEMORY`]; keeps `entries`, the entries held, up to date.
fn add_tracked<T: Copy>(
    map: &mut HashMap<String, HashMap<String, T>>,
    rule: &str,
    client: &str,
    value: T,
    add: impl FnOnce(&mut T, T),
    count: impl Fn(&T) -> u64,
    entries: &mut usize,
) {
    let Some(tracked) = add_nested(map, rule, client, value, add) else {
        return;
    };
    *entries += 1;
    if tracked > MAX_CLIENTS_IN_MEMORY
        && let Some(clients) = map.get_mut(rule)
    {
        let kept: HashMap<String, T> = top_by(clients, CLIENTS_KEPT_ON_TRIM, count)
            .into_iter()
            .map(|(c, t)| (c.to_string(), t))
            .collect();
        *entries -= tracked - kept.len();
        *clients = kept;
    }
}

/// The `n` most throttled clients, most throttled first (ties by name, so the choice is
/// stable).
pub(crate) fn top(clients: &HashMap<String, Tally>, n: usize) -> Vec<(&str, Tally)> {
    top_by(clients, n, |t| t.throttled)
}

/// The `n` clients with the most `count`, most first (ties by name).
fn top_by<T: Copy>(
    clients: &HashMap<String, T>,
    n: usize,
    count: impl Fn(&T) -> u64,
) -> Vec<(&str, T)> {
    let mut all: Vec<(&str, T)> = clients.iter().map(|(c, t)| (c.as_str(), *t)).collect();
    all.sort_unstable_by(|a, b| count(&b.1).cmp(&count(&a.1)).then(a.0.cmp(b.0)));
    all.truncate(n);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_sum_rules_over_proxies_and_keep_the_top_clients() {
        let mut p = Pending::default();
        let r = Resolution::TenSeconds;
        p.add_counts(r, 0, "p1", "a", &Counts::only_allowed(1));
        p.add_counts(r, 0, "p2", "a", &Counts::only_allowed(2));
        p.add_counts(r, 0, "p2", "a", &Counts::only_allowed(4));
        for i in 0..60u64 {
            p.add_client(
                r,
                0,
                "a",
                &format!("c{i:02}"),
                Tally {
                    throttled: i,
                    ..Tally::default()
                },
            );
        }
        assert_eq!(p.entries, 2 + 60);
        let batch = p.to_batch();
        assert_eq!(batch.proxies.len(), 2);
        assert_eq!(batch.rules.len(), 1);
        assert_eq!(batch.rules[0].counts.allowed, 7);
        assert_eq!(batch.clients.len(), TOP_CLIENTS_PER_BUCKET);
        assert!(batch.clients.iter().all(|c| c.throttled >= 10));

        let mut q = Pending::default();
        q.merge(&p);
        q.merge(&p);
        assert_eq!(q.to_batch().rules[0].counts.allowed, 14);
    }

    #[test]
    fn client_tallies_are_bounded() {
        let mut p = Pending::default();
        for i in 0..(MAX_CLIENTS_IN_MEMORY as u64 + 1) {
            p.add_client(
                Resolution::Hour,
                0,
                "a",
                &format!("c{i}"),
                Tally {
                    throttled: i,
                    ..Tally::default()
                },
            );
        }
        assert_eq!(p.entries, CLIENTS_KEPT_ON_TRIM);
        let kept = &p.buckets[&(Resolution::Hour, 0)].clients["a"];
        assert!(kept.contains_key(&format!("c{MAX_CLIENTS_IN_MEMORY}")));
    }

    #[test]
    fn ranges_select_one_resolution() {
        let mut p = Pending::default();
        p.add_counts(
            Resolution::TenSeconds,
            10_000,
            "p",
            "a",
            &Counts::only_allowed(1),
        );
        p.add_counts(Resolution::Minute, 0, "p", "a", &Counts::only_allowed(1));
        let span = |from_ms, to_ms| Span {
            resolution: Resolution::TenSeconds,
            from_ms,
            to_ms,
        };
        let got: Vec<i64> = p.buckets_in(span(0, 20_000)).map(|(t, _)| t).collect();
        assert_eq!(got, vec![10_000]);
        assert_eq!(p.buckets_in(span(20_000, 0)).count(), 0);
    }
}
