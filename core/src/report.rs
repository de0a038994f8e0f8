//! Decision statistics: aggregated in each worker, merged by the control service, and
//! sent to the admin API as a [`Report`].
//!
//! Memory stays bounded whatever the traffic: per rule, totals are exact counters, and
//! clients are tracked only in a fixed-size *top-K* summary of the most throttled ones
//! (the Space-Saving algorithm of Metwally, Agrawal and El Abbadi, 2005). A summary of
//! `k` entries finds every client whose throttled count exceeds `total / k`, and for each
//! reported client `count - error ≤ true count ≤ count`. Merging two summaries adds their
//! errors, which the report carries so the dashboard can say how exact a figure is.
//!
//! A second summary of the same size keeps the clients that sent the rule the most
//! *requests*, whatever their outcome: what a rule dry run replays through changed limits
//! (`crate::estimate`), since the throttled clients alone cannot say what a lower limit
//! would throttle.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::rule::Rule;
use crate::ruleset::{DecisionSink, RuleOutcome};

/// Clients tracked per rule.
pub const TOP_CLIENTS: usize = 20;
/// Longest client key kept; longer keys are cut (they are identifiers, not payloads).
pub const MAX_CLIENT_LEN: usize = 128;
/// Most rules reported in one interval (a ruleset holds at most 1,000).
pub const MAX_RULES: usize = 1_000;

/// Exact totals for one rule over an interval.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleCounts {
    #[serde(default)]
    pub allowed: u64,
    #[serde(default)]
    pub denied: u64,
    #[serde(default)]
    pub shadow_denied: u64,
    #[serde(default)]
    pub near_limit: u64,
    #[serde(default)]
    pub fail_open: u64,
    #[serde(default)]
    pub key_missing: u64,
    /// Tokens the rule's allowed requests used, as their responses reported (or their
    /// reservation when the usage was unreadable; nothing for a refunded call). Counted
    /// when a response ends, so in the interval it ends in. Rules without token limits
    /// send none (an admin API older than this field still takes their reports).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_used: u64,
    /// Tokens the rule's throttled (denied or shadow-denied) requests asked for: their
    /// estimates.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_throttled: u64,
    /// Requests admitted over a limit (a soft limit's margin, or a warn-mode rule): also
    /// in `allowed`, since they passed; never in `denied`. Sent only when non-zero, so an
    /// admin API older than this field still takes the reports of rules that never warn.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warned: u64,
    /// Requests admitted to wait for their tokens (`on_limit: delay`): also in
    /// `allowed`, since they pass (or give up while waiting). Sent only when non-zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delayed: u64,
    /// The waits computed for the `delayed` requests, in milliseconds (each rounded up):
    /// each then queues that long and at most one tick more, or less if it gives up. Over
    /// `delayed`, the mean wait. Sent only when non-zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_wait_ms: u64,
    /// Requests refused because the client had its in-flight limit's number of requests
    /// open already: also in `denied`. Sent only when non-zero.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub in_flight_refused: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RuleCounts {
    /// Saturating: batches come from shared data, which any worker (or a corrupted
    /// write) fills, and a sum that wrapped would report a tiny count.
    fn add(&mut self, other: &RuleCounts) {
        self.allowed = self.allowed.saturating_add(other.allowed);
        self.denied = self.denied.saturating_add(other.denied);
        self.shadow_denied = self.shadow_denied.saturating_add(other.shadow_denied);
        self.near_limit = self.near_limit.saturating_add(other.near_limit);
        self.fail_open = self.fail_open.saturating_add(other.fail_open);
        self.key_missing = self.key_missing.saturating_add(other.key_missing);
        self.tokens_used = self.tokens_used.saturating_add(other.tokens_used);
        self.tokens_throttled = self.tokens_throttled.saturating_add(other.tokens_throttled);
        self.warned = self.warned.saturating_add(other.warned);
        self.delayed = self.delayed.saturating_add(other.delayed);
        self.delay_wait_ms = self.delay_wait_ms.saturating_add(other.delay_wait_ms);
        self.in_flight_refused = self
            .in_flight_refused
            .saturating_add(other.in_flight_refused);
    }

    pub fn is_zero(&self) -> bool {
        *self == RuleCounts::default()
    }
}

/// One client in a top-K summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCount {
    pub client: String,
    /// Throttled requests (denied or shadow-denied), an upper bound.
    pub throttled: u64,
    /// How much of `throttled` may belong to clients this entry replaced.
    #[serde(default)]
    pub error: u64,
    /// Tokens the client's throttled requests asked for (rules with token limits), an
    /// upper bound like `throttled`: an entry that replaced another inherits its tokens
    /// too.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens: u64,
}

/// What one record adds to a client's entry.
#[derive(Debug, Clone, Copy)]
struct Throttled {
    requests: u64,
    error: u64,
    tokens: u64,
}

impl Throttled {
    fn of(entry: &ClientCount) -> Throttled {
        Throttled {
            requests: entry.throttled,
            error: entry.error,
            tokens: entry.tokens,
        }
    }
}

/// The most throttled clients of one rule (Space-Saving).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopClients {
    entries: Vec<ClientCount>,
}

impl TopClients {
    /// Counts `weight` throttled requests for `client`, which asked for `tokens` tokens.
    pub fn record(&mut self, client: &str, weight: u64, tokens: u64) {
        self.add(
            client,
            Throttled {
                requests: weight,
                error: 0,
                tokens,
            },
        );
    }

    fn add(&mut self, client: &str, added: Throttled) {
        let client = truncate(client);
        // Saturating, like `RuleCounts::add`: merged summaries come from shared data.
        if let Some(entry) = self.entries.iter_mut().find(|e| e.client == client) {
            entry.throttled = entry.throttled.saturating_add(added.requests);
            entry.error = entry.error.saturating_add(added.error);
            entry.tokens = entry.tokens.saturating_add(added.tokens);
            return;
        }
        if self.entries.len() < TOP_CLIENTS {
            self.entries.push(ClientCount {
                client: client.to_string(),
                throttled: added.requests,
                error: added.error,
                tokens: added.tokens,
            });
            return;
        }
        // Full: the newcomer takes over the smallest entry and inherits its count as
        // possible error (and its tokens, so they stay an upper bound). This is what
        // bounds memory.
        if let Some(min) = self.entries.iter_mut().min_by_key(|e| e.throttled) {
            let inherited = min.throttled;
            // The evicted client's string is reused: with many distinct clients every
            // request can be a newcomer, and this runs on the filter's request path.
            min.client.clear();
            min.client.push_str(client);
            min.throttled = inherited.saturating_add(added.requests);
            min.error = inherited.saturating_add(added.error);
            min.tokens = min.tokens.saturating_add(added.tokens);
        }
    }

    /// Folds another summary in.
    pub fn merge(&mut self, other: &TopClients) {
        for e in &other.entries {
            self.add(&e.client, Throttled::of(e));
        }
    }

    /// The entries, most throttled first.
    pub fn sorted(&self) -> Vec<ClientCount> {
        let mut entries = self.entries.clone();
        entries.sort_by(|a, b| {
            b.throttled
                .cmp(&a.throttled)
                .then_with(|| a.client.cmp(&b.client))
        });
        entries
    }

    pub fn from_entries(entries: Vec<ClientCount>) -> TopClients {
        let mut top = TopClients::default();
        for e in &entries {
            top.add(&e.client, Throttled::of(e));
        }
        top
    }
}

fn truncate(client: &str) -> &str {
    if client.len() <= MAX_CLIENT_LEN {
        return client;
    }
    let mut end = MAX_CLIENT_LEN;
    while !client.is_char_boundary(end) {
        end -= 1;
    }
    client.get(..end).unwrap_or_default()
}

/// One client in a top-K summary of the clients sending a rule the most requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientRequests {
    pub client: String,
    /// Requests the rule decided for this client, whatever their outcome: an upper bound.
    pub requests: u64,
    /// How much of `requests` may belong to clients this entry replaced.
    #[serde(default)]
    pub error: u64,
}

/// The clients sending a rule the most requests: the same Space-Saving summary (and
/// bounds) as [`TopClients`], counting requests instead of throttled requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopRequesters(TopClients);

impl TopRequesters {
    /// Counts `requests` requests of `client`.
    pub fn record(&mut self, client: &str, requests: u64) {
        self.0.record(client, requests, 0);
    }

    /// Folds in a summary as it travels.
    pub fn merge(&mut self, entries: &[ClientRequests]) {
        for e in entries {
            self.0.add(
                &e.client,
                Throttled {
                    requests: e.requests,
                    error: e.error,
                    tokens: 0,
                },
            );
        }
    }

    /// The entries, most requests first.
    pub fn sorted(&self) -> Vec<ClientRequests> {
        self.0
            .sorted()
            .into_iter()
            .map(|e| ClientRequests {
                client: e.client,
                requests: e.throttled,
                error: e.error,
            })
            .collect()
    }
}

/// Statistics of one rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleStats {
    pub counts: RuleCounts,
    pub top: TopClients,
    pub requesters: TopRequesters,
}

/// Per-rule statistics over an interval: what a worker collects between flushes and
/// what the control service accumulates between reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aggregate {
    /// Keyed by rule id.
    rules: BTreeMap<String, RuleStats>,
    /// Outcomes dropped because `MAX_RULES` rules were already tracked.
    pub overflow: u64,
}

impl DecisionSink for Aggregate {
    fn record(&mut self, rule: &Rule, outcome: RuleOutcome, client: &str, tokens: u64) {
        self.record_outcomes(&rule.id, outcome, client, 1, tokens);
    }
}

impl Aggregate {
    /// The statistics of rule `id`, created if there is room; counts an overflow if not.
    fn stats_for(&mut self, id: &str) -> Option<&mut RuleStats> {
        if !self.rules.contains_key(id) {
            if self.rules.len() >= MAX_RULES {
                self.overflow += 1;
                return None;
            }
            self.rules.insert(id.to_string(), RuleStats::default());
        }
        self.rules.get_mut(id)
    }

    /// Counts `requests` requests of rule `rule_id` that had the same `outcome` for the same
    /// `client`, asking its token limits for `tokens` in all: one request of the filter,
    /// one descriptor of the rate limit service, or a quota report's usage of one bucket.
    pub fn record_outcomes(
        &mut self,
        rule_id: &str,
        outcome: RuleOutcome,
        client: &str,
        requests: u64,
        tokens: u64,
    ) {
        let Some(stats) = self.stats_for(rule_id) else {
            return;
        };
        // Every request the rule decided for a client counts towards its requesters, whatever
        // the outcome, as the counts count them: not a request without a key (the rule did
        // not apply), nor one another rule denied first (the rule was not asked).
        if !matches!(outcome, RuleOutcome::KeyMissing | RuleOutcome::NotCharged) {
            stats.requesters.record(client, requests);
        }
        let c = &mut stats.counts;
        let throttled = |count: &mut u64, throttled_tokens: &mut u64, top: &mut TopClients| {
            *count = count.saturating_add(requests);
            *throttled_tokens = throttled_tokens.saturating_add(tokens);
            top.record(client, requests, tokens);
        };
        match outcome {
            RuleOutcome::Allowed { near_limit } => {
                c.allowed = c.allowed.saturating_add(requests);
                if near_limit {
                    c.near_limit = c.near_limit.saturating_add(requests);
                }
            }
            RuleOutcome::Delayed { wait_ns } => {
                c.allowed = c.allowed.saturating_add(requests);
                c.delayed = c.delayed.saturating_add(requests);
                let wait_ms = wait_ns.div_ceil(crate::time::NANOS_PER_MILLI);
                c.delay_wait_ms = c
                    .delay_wait_ms
                    .saturating_add(wait_ms.saturating_mul(requests));
            }
            RuleOutcome::Warned => {
                c.allowed = c.allowed.saturating_add(requests);
                c.warned = c.warned.saturating_add(requests);
            }
            RuleOutcome::InFlightRefused => {
                c.denied = c.denied.saturating_add(requests);
                c.in_flight_refused = c.in_flight_refused.saturating_add(requests);
                stats.top.record(client, requests, tokens);
            }
            RuleOutcome::Denied | RuleOutcome::FailedClosed => {
                throttled(&mut c.denied, &mut c.tokens_throttled, &mut stats.top);
            }
            RuleOutcome::ShadowDenied => {
                throttled(
                    &mut c.shadow_denied,
                    &mut c.tokens_throttled,
                    &mut stats.top,
                );
            }
            RuleOutcome::FailedOpen => c.fail_open = c.fail_open.saturating_add(requests),
            RuleOutcome::KeyMissing => c.key_missing = c.key_missing.saturating_add(requests),
            RuleOutcome::NotCharged => {}
        }
    }

    /// Counts the tokens an allowed request of rule `rule_id` used, when its response
    /// ended (see [`crate::tokens::Reservation::tokens_used`]).
    pub fn record_tokens_used(&mut self, rule_id: &str, tokens: u64) {
        if let Some(stats) = self.stats_for(rule_id) {
            stats.counts.tokens_used = stats.counts.tokens_used.saturating_add(tokens);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.overflow == 0
    }

    /// Folds a batch in (from a worker, or an earlier unsent report).
    pub fn merge(&mut self, batch: &RuleBatch) {
        for rule in &batch.rules {
            let Some(stats) = self.stats_for(&rule.rule) else {
                continue;
            };
            stats.counts.add(&rule.counts);
            stats
                .top
                .merge(&TopClients::from_entries(rule.top_clients.clone()));
            stats.requesters.merge(&rule.top_requesters);
        }
        self.overflow = self.overflow.saturating_add(batch.overflow);
    }

    /// Empties the aggregate into a batch.
    pub fn take(&mut self) -> RuleBatch {
        let rules = std::mem::take(&mut self.rules)
            .into_iter()
            .map(|(rule, stats)| RuleReport {
                rule,
                counts: stats.counts,
                top_clients: stats.top.sorted(),
                top_requesters: stats.requesters.sorted(),
            })
            .collect();
        RuleBatch {
            rules,
            overflow: std::mem::take(&mut self.overflow),
        }
    }
}

/// Per-rule statistics of one interval, as they travel (worker → control service in a
/// shared queue; inside a [`Report`] to the admin API).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleBatch {
    pub rules: Vec<RuleReport>,
    #[serde(default)]
    pub overflow: u64,
}

/// One rule's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleReport {
    /// The rule id.
    pub rule: String,
    #[serde(flatten)]
    pub counts: RuleCounts,
    /// Most throttled first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_clients: Vec<ClientCount>,
    /// Most requests first: the clients sending the rule the most requests, whatever
    /// their outcome (for rule dry runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_requesters: Vec<ClientRequests>,
}

/// Longest proxy id.
pub const MAX_PROXY_ID_LEN: usize = 128;

/// Whether `id` is a proxy id: 1 to [`MAX_PROXY_ID_LEN`] visible ASCII characters (no
/// spaces, no markup-only bytes beyond ASCII). The one rule for every place a proxy names
/// itself (a sync's `proxy`, a report's `proxy_id`, the ruleset poll's
/// `x-sluice-proxy-id`), so an id the server lists is one it would accept everywhere.
pub fn is_proxy_id(id: &str) -> bool {
    (1..=MAX_PROXY_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

/// The message for an id that is not one, naming the rule.
pub const PROXY_ID_RULE: &str = "must be 1 to 128 visible ASCII characters (no spaces)";

/// What a proxy sends to `POST /api/v1/reports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub proxy_id: String,
    /// The interval covered, in milliseconds since the Unix epoch.
    pub start_ms: u64,
    pub end_ms: u64,
    /// The ruleset version the proxy ran at the end of the interval.
    pub ruleset_version: u64,
    #[serde(flatten)]
    pub batch: RuleBatch,
    /// Earlier reports this proxy dropped because the admin API was unreachable.
    #[serde(default)]
    pub dropped_reports: u64,
}

impl Report {
    /// The JSON body of `POST /api/v1/reports`.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// The endpoint reports go to.
pub const REPORTS_PATH: &str = "/api/v1/reports";
/// Format byte of [`RuleBatch::encode`] (shared-queue messages).
pub const BATCH_FORMAT_VERSION: u8 = 1;

impl RuleBatch {
    /// The shared-queue encoding: a format byte, then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![BATCH_FORMAT_VERSION];
        let _ = serde_json::to_writer(&mut out, self);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<RuleBatch> {
        match bytes.split_first() {
            Some((&BATCH_FORMAT_VERSION, json)) => serde_json::from_slice(json).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_saving_keeps_every_heavy_client_within_its_error_bound() {
        let mut top = TopClients::default();
        let mut truth = BTreeMap::new();
        // Ten heavy clients (200 each) among a thousand light ones: 3,000 in all, so
        // anyone above 3000 / 20 = 150 is guaranteed a place. Each throttled request
        // asked for 7 tokens.
        for round in 0..200u64 {
            for heavy in 0..10u64 {
                top.record(&format!("heavy-{heavy}"), 1, 7);
                *truth.entry(format!("heavy-{heavy}")).or_insert(0u64) += 1;
            }
            for light in 0..5u64 {
                let name = format!("light-{}", round * 5 + light);
                top.record(&name, 1, 7);
                *truth.entry(name).or_insert(0u64) += 1;
            }
        }
        let entries = top.sorted();
        assert_eq!(entries.len(), TOP_CLIENTS);
        for heavy in 0..10 {
            let name = format!("heavy-{heavy}");
            let e = entries
                .iter()
                .find(|e| e.client == name)
                .expect("heavy client tracked");
            assert!(
                e.throttled - e.error <= truth[&name] && truth[&name] <= e.throttled,
                "{e:?}"
            );
            // Tokens are an upper bound in the same way: every request here asked for 7.
            assert!(
                7 * truth[&name] <= e.tokens && e.tokens <= 7 * e.throttled,
                "{e:?}"
            );
        }
    }

    #[test]
    fn long_client_keys_are_cut_on_a_character_boundary() {
        let mut top = TopClients::default();
        top.record(&"é".repeat(100), 1, 0);
        assert!(top.sorted()[0].client.len() <= MAX_CLIENT_LEN);
    }

    #[test]
    fn batches_round_trip_through_the_queue_encoding() {
        let batch = RuleBatch {
            rules: vec![RuleReport {
                rule: "r".into(),
                counts: RuleCounts {
                    allowed: 3,
                    denied: 1,
                    tokens_used: 900,
                    tokens_throttled: 250,
                    ..RuleCounts::default()
                },
                top_clients: vec![ClientCount {
                    client: "c".into(),
                    throttled: 1,
                    error: 0,
                    tokens: 250,
                }],
                top_requesters: vec![ClientRequests {
                    client: "c".into(),
                    requests: 4,
                    error: 0,
                }],
            }],
            overflow: 0,
        };
        let bytes = batch.encode();
        assert_eq!(bytes[0], BATCH_FORMAT_VERSION);
        assert_eq!(RuleBatch::decode(&bytes), Some(batch.clone()));
        let mut agg = Aggregate::default();
        agg.merge(&batch);
        agg.merge(&batch);
        let merged = agg.take();
        assert_eq!(merged.rules[0].counts.allowed, 6);
        assert_eq!(merged.rules[0].counts.tokens_used, 1_800);
        assert_eq!(merged.rules[0].counts.tokens_throttled, 500);
        assert_eq!(merged.rules[0].top_clients[0].throttled, 2);
        assert_eq!(merged.rules[0].top_clients[0].tokens, 500);
        assert_eq!(merged.rules[0].top_requesters[0].requests, 8);
        assert!(agg.is_empty());
    }

    #[test]
    fn rules_without_tokens_report_no_token_fields() {
        // An admin API older than the token fields refuses unknown fields: a proxy that
        // runs no token limit must send it exactly what it sent before.
        let report = RuleReport {
            rule: "r".into(),
            counts: RuleCounts {
                denied: 1,
                ..RuleCounts::default()
            },
            top_clients: vec![ClientCount {
                client: "c".into(),
                throttled: 1,
                error: 0,
                tokens: 0,
            }],
            top_requesters: Vec::new(),
        };
        let json = serde_json::to_string(&report).unwrap();
        assert!(!json.contains("tokens"), "{json}");
        let with_tokens = RuleReport {
            counts: RuleCounts {
                tokens_used: 5,
                ..report.counts.clone()
            },
            ..report
        };
        let json = serde_json::to_string(&with_tokens).unwrap();
        assert!(json.contains(r#""tokens_used":5"#), "{json}");
        assert_eq!(
            serde_json::from_str::<RuleReport>(&json).unwrap(),
            with_tokens
        );
    }

    #[test]
    fn tokens_used_are_counted_per_rule() {
        let mut agg = Aggregate::default();
        agg.record_tokens_used("a", 120);
        agg.record_tokens_used("a", 30);
        agg.record_tokens_used("b", 1);
        let batch = agg.take();
        let used: Vec<_> = batch
            .rules
            .iter()
            .map(|r| (r.rule.as_str(), r.counts.tokens_used))
            .collect();
        assert_eq!(used, [("a", 150), ("b", 1)]);
    }

    #[test]
    fn several_requests_of_one_outcome_count_as_that_many_single_ones() {
        let outcomes = [
            (RuleOutcome::Allowed { near_limit: true }, "a"),
            (RuleOutcome::Allowed { near_limit: false }, "a"),
            (RuleOutcome::Denied, "bob"),
            (RuleOutcome::FailedClosed, "bob"),
            (RuleOutcome::ShadowDenied, "carol"),
            (RuleOutcome::FailedOpen, "a"),
            (RuleOutcome::KeyMissing, ""),
            (RuleOutcome::NotCharged, "a"),
        ];
        let mut at_once = Aggregate::default();
        let mut one_by_one = Aggregate::default();
        for (outcome, client) in outcomes {
            at_once.record_outcomes("r", outcome, client, 3, 30);
            for _ in 0..3 {
                one_by_one.record_outcomes("r", outcome, client, 1, 10);
            }
        }
        let batch = at_once.take();
        assert_eq!(batch, one_by_one.take());
        let counts = &batch.rules[0].counts;
        assert_eq!(
            (
                counts.allowed,
                counts.near_limit,
                counts.denied,
                counts.shadow_denied,
                counts.fail_open,
                counts.key_missing,
                counts.tokens_throttled
            ),
            (6, 3, 6, 3, 3, 3, 90)
        );
        let top: Vec<_> = batch.rules[0]
            .top_clients
            .iter()
            .map(|c| (c.client.as_str(), c.throttled))
            .collect();
        assert_eq!(top, [("bob", 6), ("carol", 3)]);
    }

    #[test]
    fn requesters_count_every_decided_request_and_merge_like_top_clients() {
        let mut worker = Aggregate::default();
        for (outcome, client, n) in [
            (RuleOutcome::Allowed { near_limit: false }, "alice", 5),
            (RuleOutcome::Denied, "alice", 2),
            (RuleOutcome::ShadowDenied, "bob", 3),
            (RuleOutcome::Warned, "carol", 1),
            // Not the rule's to decide: no key, or another rule denied first.
            (RuleOutcome::KeyMissing, "", 4),
            (RuleOutcome::NotCharged, "dave", 4),
        ] {
            worker.record_outcomes("r", outcome, client, n, 0);
        }
        let batch = worker.take();
        let requesters: Vec<_> = batch.rules[0]
            .top_requesters
            .iter()
            .map(|c| (c.client.as_str(), c.requests))
            .collect();
        assert_eq!(requesters, [("alice", 7), ("bob", 3), ("carol", 1)]);
        // Merged as the control service merges workers' batches, and bounded the same way:
        // a newcomer to a full summary inherits the smallest count as its error.
        let mut merged = Aggregate::default();
        merged.merge(&batch);
        merged.merge(&batch);
        for i in 0..TOP_CLIENTS as u64 {
            merged.record_outcomes("r", RuleOutcome::Denied, &format!("c{i}"), 100 + i, 0);
        }
        let top = merged.take().rules[0].top_requesters.clone();
        assert_eq!(top.len(), TOP_CLIENTS);
        assert!(top.iter().all(|c| c.client.starts_with('c')), "{top:?}");
        let replaced = top
            .iter()
            .find(|c| c.error > 0)
            .expect("an inherited count");
        assert!(replaced.requests - replaced.error >= 100, "{replaced:?}");
        let json = serde_json::to_string(&batch.rules[0]).unwrap();
        assert!(
            json.contains(r#""top_requesters":[{"client":"alice","requests":7,"error":0}"#),
            "{json}"
        );
    }

    #[test]
    fn merged_counts_saturate_instead_of_wrapping() {
        // Found by the `rule_batch` fuzz target: two batches from shared data whose
        // counts add up past u64::MAX panicked (debug) or wrapped to a small count.
        let batch = RuleBatch {
            rules: vec![RuleReport {
                rule: "r".into(),
                counts: RuleCounts {
                    allowed: u64::MAX,
                    tokens_used: u64::MAX,
                    ..RuleCounts::default()
                },
                top_clients: vec![ClientCount {
                    client: "c".into(),
                    throttled: u64::MAX,
                    error: u64::MAX,
                    tokens: u64::MAX,
                }],
                top_requesters: vec![ClientRequests {
                    client: "c".into(),
                    requests: u64::MAX,
                    error: u64::MAX,
                }],
            }],
            overflow: u64::MAX,
        };
        let mut agg = Aggregate::default();
        agg.merge(&batch);
        agg.merge(&batch);
        assert_eq!(agg.overflow, u64::MAX);
        let merged = agg.take();
        assert_eq!(merged.rules[0].counts.allowed, u64::MAX);
        assert_eq!(merged.rules[0].top_clients[0].throttled, u64::MAX);
        assert_eq!(merged.rules[0].top_clients[0].error, u64::MAX);
        assert_eq!(merged.rules[0].top_clients[0].tokens, u64::MAX);
        assert_eq!(merged.rules[0].top_requesters[0].requests, u64::MAX);
        assert_eq!(merged.rules[0].counts.tokens_used, u64::MAX);
    }
}
