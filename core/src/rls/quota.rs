//! Envoy's rate limit quota service (RLQS, `envoy.service.rate_limit_quota.v3`) decided
//! by the same rules and buckets as the rate limit service, without I/O.
//!
//! Envoy's `rate_limit_quota` filter decides locally from a *quota assignment* per bucket
//! and reports, every reporting interval, how many requests of each bucket it allowed and
//! denied. Here:
//!
//! - A bucket id (a map of names to values) is read as one descriptor of the stream's
//!   domain, its entries in key order ([`request`]), and decided by the RLS rules as a
//!   `ShouldRateLimit` descriptor is (`select`): the rule, its client and its buckets.
//! - The requests Envoy reports allowed are charged to that client's fleet-wide buckets
//!   whether or not they fit (Envoy served them), so RLS callers of the same rule, other
//!   streams and other replicas see them ([`charge_usage`]).
//! - The assignment ([`assign`]) is a token bucket of the rule's tightest limit, divided
//!   evenly among the streams holding that client's bucket: each gets `1/n` of the rate
//!   and of the burst, and never more burst than the fleet's bucket holds when the
//!   assignment is made. Rules without buckets answer with blanket rules.

use std::collections::HashMap;

use super::request::{RlsDescriptor, RlsRequest};
use super::select::Matched;
use super::spec::Answer;
use crate::rule::Limit;
use crate::time::Nanos;

/// What Envoy is told to do with one bucket's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Assignment {
    /// Allow every request (no rule, an `unlimited` rule, or a shadow rule: shadow rules
    /// never deny).
    AllowAll,
    /// Deny every request (a rule that answers `deny`).
    DenyAll,
    /// A token bucket: `max_tokens` held at most (and at the start), `tokens_per_fill`
    /// added every `fill_interval_seconds`, continuously.
    TokenBucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_seconds: u64,
    },
}

/// The one-descriptor request a bucket id of `domain` stands for: its entries in key
/// order (a bucket id is a map and has no order of its own), costing nothing (usage is
/// charged apart). Check it with [`RlsRequest::check`] before planning it.
pub fn request(domain: &str, bucket: &HashMap<String, String>) -> RlsRequest {
    let mut entries: Vec<(String, String)> =
        bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    entries.sort();
    RlsRequest {
        domain: domain.to_string(),
        descriptors: vec![RlsDescriptor {
            entries,
            hits_addend: Some(0),
        }],
        hits_addend: 0,
    }
}

/// The limit of `matched` an assignment enforces: the one with the lowest rate (Envoy's
/// assignment holds one token bucket; every limit is still charged with the usage).
pub fn assigned_limit(matched: &Matched) -> Option<Limit> {
    matched.charges.iter().map(|c| c.limit).min_by(|a, b| {
        let a_rate = u128::from(a.requests) * u128::from(b.period_seconds);
        let b_rate = u128::from(b.requests) * u128::from(a.period_seconds);
        a_rate.cmp(&b_rate)
    })
}

/// What a bucket decided by `matched` is assigned when `holders` streams hold that
/// client's bucket and the fleet's bucket of the assigned limit has `tokens_left` whole
/// tokens (`None`: unknown, e.g. Redis out of reach).
///
/// The share's rate is exact: `requests` every `period × holders` seconds (Envoy reads
/// the fill interval in whole seconds, and a longer interval keeps the rate exact where
/// dividing the tokens would round); its burst is `burst / holders`, at most
/// `tokens_left`, and at least 1 (Envoy's 0 would deny forever).
pub fn assign(matched: Option<&Matched>, holders: u64, tokens_left: Option<u64>) -> Assignment {
    let Some(matched) = matched else {
        return Assignment::AllowAll;
    };
    match matched.answer {
        Answer::Unlimited => return Assignment::AllowAll,
        Answer::Deny => return Assignment::DenyAll,
        Answer::Limit if matched.shadow => return Assignment::AllowAll,
        Answer::Limit => {}
    }
    let Some(limit) = assigned_limit(matched) else {
        return Assignment::AllowAll;
    };
    let holders = holders.max(1);
    let interval = limit.period_seconds.saturating_mul(holders);
    let (tokens_per_fill, fill_interval_seconds) = match u32::try_from(limit.requests) {
        Ok(requests) => (requests, interval),
        // More than a u32 of requests per period: as many tokens as fit, over an interval
        // rounded up (a hair below the rate, never above).
        Err(_) => (
            u32::MAX,
            u64::try_from(
                (u128::from(interval) * u128::from(u32::MAX)).div_ceil(u128::from(limit.requests)),
            )
            .unwrap_or(u64::MAX),
        ),
    };
    let share = (limit.burst / holders).min(tokens_left.unwrap_or(u64::MAX));
    Assignment::TokenBucket {
        max_tokens: u32::try_from(share.max(1)).unwrap_or(u32::MAX),
        tokens_per_fill,
        fill_interval_seconds: fill_interval_seconds.max(1),
    }
}

/// What charging one report's usage of a bucket did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageCharge {
    /// Whole tokens left in the bucket of the [`assigned_limit`] (`u64::MAX`: none).
    pub left: u64,
    /// Of the requests reported allowed, those a shadow rule would have denied (its
    /// buckets had no room for them); 0 for an enforced rule.
    pub shadow_denied: u64,
    /// The buckets' new theoretical arrival times (the shape the coordinator's `charge`
    /// takes).
    pub writes: Vec<(u64, Nanos)>,
}

/// Charges `allowed` requests, which Envoy already served, to every bucket of `matched`
/// (`tats`: their theoretical arrival times, in the order of `matched.charges`).
///
/// An enforced rule's requests are charged whole, into debt if need be (at most one
/// burst of it, as a token limit's commit). A shadow rule's bucket is assigned
/// `ALLOW_ALL`, so Envoy admitted everything: the requests that fit every bucket are
/// charged, and the rest are its would-be denials, charged nothing, as a shadow
/// descriptor of `ShouldRateLimit` is. (The reported requests came over the reporting
/// interval; they are weighed against the buckets as they stand at the report, refilled
/// meanwhile up to their burst.)
pub fn charge_usage(matched: &Matched, tats: &[Nanos], now: Nanos, allowed: u64) -> UsageCharge {
    let charged = if matched.shadow {
        matched
            .charges
            .iter()
            .zip(tats)
            .map(|(charge, tat)| charge.limit.gcra.check(*tat, now, 0).remaining)
            .fold(allowed, u64::min)
    } else {
        allowed
    };
    let assigned = assigned_limit(matched);
    let mut left = u64::MAX;
    let writes = matched
        .charges
        .iter()
        .zip(tats)
        .map(|(charge, tat)| {
            let (new_tat, _forgiven) = charge.limit.gcra.charge_debt(*tat, now, charged);
            if Some(charge.limit) == assigned {
                left = charge.limit.gcra.check(new_tat, now, 0).remaining;
            }
            (charge.bucket, new_tat)
        })
        .collect();
    UsageCharge {
        left,
        shadow_denied: allowed - charged,
        writes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::select::tests::rules;

    const PER_KEY: &str = r#"{"name":"per-key","key":"global","limits":[{"requests":100,"period":"minute","burst":30},{"requests":10,"period":"second","burst":20}],"descriptor":{"domain":"edge","entries":[{"key":"api_key"},{"key":"tier","value":"free"}]}}"#;
    const UNLIMITED: &str = r#"{"name":"vip","key":"global","limits":[],"descriptor":{"domain":"edge","entries":[{"key":"api_key","value":"vip"}],"answer":"unlimited"}}"#;
    const DENY: &str = r#"{"name":"banned","key":"global","limits":[],"descriptor":{"domain":"edge","entries":[{"key":"api_key","value":"banned"}],"answer":"deny"}}"#;
    const SHADOW: &str = r#"{"name":"trial","key":"global","mode":"shadow","limits":[{"requests":1,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"trial"}]}}"#;

    fn matched(bucket: &[(&str, &str)]) -> Option<Matched> {
        let bucket: HashMap<String, String> = bucket
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let request = request("edge", &bucket);
        request.check().unwrap();
        rules(&[PER_KEY, UNLIMITED, DENY, SHADOW])
            .plan(&request)
            .descriptors
            .remove(0)
            .rule
    }

    #[test]
    fn a_bucket_id_is_a_descriptor_in_key_order() {
        let m = matched(&[("tier", "free"), ("api_key", "acme")]).unwrap();
        assert_eq!(
            (m.rule_name.as_str(), m.client.as_str()),
            ("per-key", "acme")
        );
        assert!(matched(&[("tier", "paid"), ("api_key", "acme")]).is_none());
        assert!(matched(&[("other", "x")]).is_none());
    }

    #[test]
    fn the_tightest_limit_is_shared_evenly_among_the_streams_holding_it() {
        let m = matched(&[("tier", "free"), ("api_key", "acme")]);
        // 100 a minute is tighter than 10 a second.
        assert_eq!(
            assign(m.as_ref(), 1, None),
            Assignment::TokenBucket {
                max_tokens: 30,
                tokens_per_fill: 100,
                fill_interval_seconds: 60
            }
        );
        // Three streams: each 100 per 180 s (a third of the rate, exactly) and 10 tokens.
        assert_eq!(
            assign(m.as_ref(), 3, None),
            Assignment::TokenBucket {
                max_tokens: 10,
                tokens_per_fill: 100,
                fill_interval_seconds: 180
            }
        );
        // Never more burst than the fleet's bucket holds, never 0.
        let burst = |left| match assign(m.as_ref(), 1, Some(left)) {
            Assignment::TokenBucket { max_tokens, .. } => max_tokens,
            other => panic!("{other:?}"),
        };
        assert_eq!((burst(12), burst(0), burst(1_000)), (12, 1, 30));
        // More streams than tokens: one token each, the rate still divided.
        assert!(matches!(
            assign(m.as_ref(), 100, None),
            Assignment::TokenBucket {
                max_tokens: 1,
                fill_interval_seconds: 6_000,
                ..
            }
        ));
    }

    #[test]
    fn rules_without_buckets_and_shadow_rules_answer_with_blanket_rules() {
        assert_eq!(assign(None, 1, None), Assignment::AllowAll);
        let vip = matched(&[("api_key", "vip")]);
        assert_eq!(assign(vip.as_ref(), 1, None), Assignment::AllowAll);
        let banned = matched(&[("api_key", "banned")]);
        assert_eq!(assign(banned.as_ref(), 1, None), Assignment::DenyAll);
        let trial = matched(&[("trial", "t1")]);
        assert_eq!(assign(trial.as_ref(), 1, None), Assignment::AllowAll);
    }

    #[test]
    fn usage_is_charged_to_every_limit_into_debt_and_reports_what_is_left() {
        let m = matched(&[("tier", "free"), ("api_key", "acme")]).unwrap();
        let now = Nanos::from_secs(1_000);
        let first = charge_usage(&m, &[Nanos::ZERO, Nanos::ZERO], now, 12);
        assert_eq!(first.writes.len(), 2);
        assert_eq!(first.left, 18, "30 − 12 in the bucket of 100 a minute");
        let tats: Vec<Nanos> = first.writes.iter().map(|(_, t)| *t).collect();
        // 40 more than the 18 left: served anyway, the bucket in debt, nothing left.
        let over = charge_usage(&m, &tats, now, 40);
        assert_eq!((over.left, over.shadow_denied), (0, 0));
        assert!(over.writes[0].1 > now.saturating_add(Nanos::from_secs(18)));
        // Nothing reported: nothing changes.
        let again = charge_usage(&m, &tats, now, 0);
        assert_eq!(
            again.writes.iter().map(|(_, t)| *t).collect::<Vec<_>>(),
            tats
        );
    }

    #[test]
    fn a_shadow_rule_charges_what_fits_and_counts_the_rest_as_would_be_denials() {
        // One a second, burst 1: a full bucket has room for one request.
        let m = matched(&[("trial", "t1")]).unwrap();
        let now = Nanos::from_secs(1_000);
        let one = charge_usage(&m, &[Nanos::ZERO], now, 1);
        assert_eq!(one.shadow_denied, 0, "within the limit: no would-be denial");
        let five = charge_usage(&m, &[Nanos::ZERO], now, 5);
        assert_eq!(five.shadow_denied, 4);
        assert_eq!(
            five.writes, one.writes,
            "only the request that fitted is charged"
        );
        let tats: Vec<Nanos> = five.writes.iter().map(|(_, t)| *t).collect();
        // The bucket is empty now: every further request would have been denied.
        let empty = charge_usage(&m, &tats, now, 3);
        assert_eq!(empty.shadow_denied, 3);
        assert_eq!(empty.writes[0].1, tats[0], "nothing charged");
        // A second later it has refilled one.
        let later = charge_usage(&m, &tats, now.saturating_add(Nanos::from_secs(1)), 3);
        assert_eq!(later.shadow_denied, 2);
    }
}
