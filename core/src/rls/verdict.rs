//! Charging a plan's buckets: one GCRA check per limit on the bucket's theoretical
//! arrival time, all-or-nothing over the request's enforced descriptors (a denied request
//! consumes no tokens), shadow descriptors apart (charged when they fit, never denying).

use std::collections::HashMap;

use super::select::{Matched, Plan};
use super::spec::Answer;
use crate::gcra::Verdict;
use crate::rule::Limit;
use crate::spec::FailureMode;
use crate::time::Nanos;

/// A descriptor's answer, as `DescriptorStatus.code` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// One descriptor's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// The limit the status describes (`current_limit`): the first that denied, else the
    /// one with the fewest tokens left. `None` for a descriptor no rule decides.
    pub limit: Option<Limit>,
    /// Whole tokens left in that limit's bucket (`limit_remaining`).
    pub remaining: u64,
    /// `duration_until_reset`: when denied, until the request would fit; when allowed,
    /// until the bucket is full again.
    pub reset_ns: u64,
    /// A shadow rule would have denied it (the code stays `Ok`).
    pub shadow_denied: bool,
    /// Decided by the rule's failure mode: the buckets could not be read or written.
    pub failed: bool,
    /// Denied by a rule whose answer is `deny`, without a bucket (`current_limit` says 0).
    pub deny_listed: bool,
}

impl Status {
    const UNLIMITED: Status = Status {
        code: Code::Ok,
        limit: None,
        remaining: 0,
        reset_ns: 0,
        shadow_denied: false,
        failed: false,
        deny_listed: false,
    };

    /// A fixed answer's status: `unlimited` passes with the most left, `deny` denies
    /// (in a shadow rule: passes, saying it would have denied).
    fn fixed(answer: Answer, shadow: bool) -> Status {
        match answer {
            Answer::Deny => Status {
                code: if shadow { Code::Ok } else { Code::OverLimit },
                shadow_denied: shadow,
                deny_listed: true,
                ..Status::UNLIMITED
            },
            Answer::Unlimited | Answer::Limit => Status {
                remaining: u64::MAX,
                ..Status::UNLIMITED
            },
        }
    }
}

/// What deciding a plan gives: a status per descriptor and the buckets to write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decided {
    pub statuses: Vec<Status>,
    /// Each bucket whose theoretical arrival time changed, with its new one.
    pub writes: Vec<(u64, Nanos)>,
}

impl Decided {
    /// `overall_code`: over the limit when any descriptor is.
    pub fn overall(&self) -> Code {
        overall(&self.statuses)
    }
}

/// Over the limit when any status is.
pub fn overall(statuses: &[Status]) -> Code {
    if statuses.iter().any(|s| s.code == Code::OverLimit) {
        Code::OverLimit
    } else {
        Code::Ok
    }
}

/// Decides `plan` at `now` over the buckets' theoretical arrival times `tats`, one per
/// [`Plan::buckets`] in that order (a bucket never written is [`Nanos::ZERO`], full).
pub fn decide(plan: &Plan, tats: &[Nanos], now: Nanos) -> Decided {
    let initial: HashMap<u64, Nanos> = plan
        .buckets()
        .into_iter()
        .zip(tats.iter().copied())
        .collect();
    let mut working = initial.clone();
    let mut statuses = vec![Status::UNLIMITED; plan.descriptors.len()];
    let mut denied = false;
    // Enforced descriptors first, each seeing the charges of those before it (two
    // descriptors of one request may name one bucket).
    for (status, planned) in statuses.iter_mut().zip(&plan.descriptors) {
        let Some(matched) = planned.rule.as_ref().filter(|m| !m.shadow) else {
            continue;
        };
        if !matched.answer.is_limit() {
            *status = Status::fixed(matched.answer, false);
            denied |= status.code == Code::OverLimit;
            continue;
        }
        let (verdicts, fits) = charge(matched, planned.cost, &mut working, now);
        *status = status_of(matched, &verdicts, false);
        denied |= !fits;
    }
    if denied {
        working = initial.clone();
    }
    for (status, planned) in statuses.iter_mut().zip(&plan.descriptors) {
        let Some(matched) = planned.rule.as_ref().filter(|m| m.shadow) else {
            continue;
        };
        if !matched.answer.is_limit() {
            *status = Status::fixed(matched.answer, true);
            continue;
        }
        let (verdicts, _) = charge(matched, planned.cost, &mut working, now);
        *status = status_of(matched, &verdicts, true);
    }
    let writes = plan
        .buckets()
        .into_iter()
        .filter_map(|b| {
            let new = working.get(&b).copied()?;
            (initial.get(&b) != Some(&new)).then_some((b, new))
        })
        .collect();
    Decided { statuses, writes }
}

/// Checks every limit of `matched` for `cost` tokens on `working`; writes them into
/// `working` only when all fit. Returns the verdicts and whether all fit.
fn charge(
    matched: &Matched,
    cost: u64,
    working: &mut HashMap<u64, Nanos>,
    now: Nanos,
) -> (Vec<Verdict>, bool) {
    let mut mine: Vec<(u64, Nanos)> = Vec::with_capacity(matched.charges.len());
    let mut verdicts = Vec::with_capacity(matched.charges.len());
    for c in &matched.charges {
        let tat = mine
            .iter()
            .rev()
            .find(|(b, _)| *b == c.bucket)
            .map(|(_, t)| *t)
            .or_else(|| working.get(&c.bucket).copied())
            .unwrap_or(Nanos::ZERO);
        let verdict = c.limit.gcra.check(tat, now, cost);
        if verdict.allowed {
            mine.push((c.bucket, verdict.new_tat));
        }
        verdicts.push(verdict);
    }
    let fits = verdicts.iter().all(|v| v.allowed);
    if fits {
        working.extend(mine);
    }
    (verdicts, fits)
}

fn status_of(matched: &Matched, verdicts: &[Verdict], shadow: bool) -> Status {
    let shown = verdicts.iter().position(|v| !v.allowed).or_else(|| {
        verdicts
            .iter()
            .enumerate()
            .min_by_key(|(_, v)| v.remaining)
            .map(|(i, _)| i)
    });
    let (Some(i), false) = (shown, verdicts.is_empty()) else {
        return Status::UNLIMITED;
    };
    let (Some(verdict), Some(charge)) = (verdicts.get(i), matched.charges.get(i)) else {
        return Status::UNLIMITED;
    };
    Status {
        code: if verdict.allowed || shadow {
            Code::Ok
        } else {
            Code::OverLimit
        },
        limit: Some(charge.limit),
        remaining: verdict.remaining,
        reset_ns: if verdict.allowed {
            verdict.reset_ns
        } else {
            verdict.retry_after_ns
        },
        shadow_denied: shadow && !verdict.allowed,
        failed: false,
        deny_listed: false,
    }
}

/// The statuses when the buckets cannot be reached: each limited descriptor as its rule's
/// failure mode says (`default` where the rule names none): open passes, closed denies.
pub fn failed(plan: &Plan, default: FailureMode) -> Vec<Status> {
    plan.descriptors
        .iter()
        .map(|planned| match &planned.rule {
            None => Status::UNLIMITED,
            Some(m) if !m.answer.is_limit() => Status::fixed(m.answer, m.shadow),
            Some(m) => Status {
                code: match (m.shadow, m.failure_mode.unwrap_or(default)) {
                    (false, FailureMode::Closed) => Code::OverLimit,
                    _ => Code::Ok,
                },
                limit: m.charges.first().map(|c| c.limit),
                failed: true,
                ..Status::UNLIMITED
            },
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::rls::select::tests::{request, rules};
    use crate::time::NANOS_PER_SECOND;

    /// 2 per second, burst 2, per address; and 1 per second for /login, shadow.
    const PER_ADDRESS: &str = r#"{"name":"per-address","key":"global","limits":[{"requests":2,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"remote_address"}]}}"#;
    const TWO_LIMITS: &str = r#"{"name":"two","key":"global","limits":[{"requests":10,"period":"second"},{"requests":3,"period":"minute"}],"descriptor":{"domain":"edge","entries":[{"key":"user"}]}}"#;
    const SHADOW: &str = r#"{"name":"shadow","key":"global","mode":"shadow","failure_mode":"closed","limits":[{"requests":1,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"path"}]}}"#;
    const CLOSED: &str = r#"{"name":"closed","key":"global","failure_mode":"closed","limits":[{"requests":1,"period":"second"}],"descriptor":{"domain":"edge","entries":[{"key":"tenant"}]}}"#;

    /// Runs `plan`s one after another on one store, as the coordinator would.
    #[derive(Default)]
    pub(crate) struct Buckets(pub(crate) HashMap<u64, Nanos>);

    impl Buckets {
        pub(crate) fn run(&mut self, plan: &Plan, now: Nanos) -> Decided {
            let tats: Vec<Nanos> = plan
                .buckets()
                .iter()
                .map(|b| self.0.get(b).copied().unwrap_or(Nanos::ZERO))
                .collect();
            let decided = decide(plan, &tats, now);
            self.0.extend(decided.writes.iter().copied());
            decided
        }
    }

    pub(crate) const T0: Nanos = Nanos::from_secs(1_000);

    #[test]
    fn a_limit_admits_its_burst_then_denies_with_the_wait() {
        let rules = rules(&[PER_ADDRESS]);
        let plan = rules.plan(&request("edge", &[&[("remote_address", "a")]]));
        let mut buckets = Buckets(HashMap::new());
        let first = buckets.run(&plan, T0);
        assert_eq!(first.overall(), Code::Ok);
        assert_eq!(first.statuses[0].remaining, 1);
        assert_eq!(first.statuses[0].limit.unwrap().requests, 2);
        assert_eq!(buckets.run(&plan, T0).statuses[0].remaining, 0);
        let third = buckets.run(&plan, T0);
        assert_eq!(third.overall(), Code::OverLimit);
        assert_eq!(third.statuses[0].reset_ns, NANOS_PER_SECOND / 2);
        assert!(third.writes.is_empty(), "a denial writes nothing");
        let later = T0.saturating_add(Nanos::new(NANOS_PER_SECOND / 2));
        assert_eq!(buckets.run(&plan, later).overall(), Code::Ok);
    }

    #[test]
    fn every_limit_of_a_descriptor_must_fit_and_the_binding_one_is_shown() {
        let rules = rules(&[TWO_LIMITS]);
        let plan = rules.plan(&request("edge", &[&[("user", "u")]]));
        let mut buckets = Buckets(HashMap::new());
        let first = buckets.run(&plan, T0);
        assert_eq!(first.statuses[0].limit.unwrap().requests, 3, "fewest left");
        assert_eq!(first.statuses[0].remaining, 2);
        buckets.run(&plan, T0);
        buckets.run(&plan, T0);
        let denied = buckets.run(&plan, T0);
        assert_eq!(denied.overall(), Code::OverLimit);
        assert_eq!(denied.statuses[0].limit.unwrap().period_seconds, 60);
        assert_eq!(denied.statuses[0].reset_ns, 20 * NANOS_PER_SECOND);
    }

    #[test]
    fn a_denied_request_charges_none_of_its_descriptors() {
        let rules = rules(&[PER_ADDRESS, TWO_LIMITS]);
        let mut buckets = Buckets(HashMap::new());
        let user_only = rules.plan(&request("edge", &[&[("user", "u")]]));
        for _ in 0..3 {
            buckets.run(&user_only, T0);
        }
        let both = rules.plan(&request(
            "edge",
            &[&[("remote_address", "a")], &[("user", "u")]],
        ));
        let denied = buckets.run(&both, T0);
        assert_eq!(denied.overall(), Code::OverLimit);
        assert_eq!(denied.statuses[0].code, Code::Ok);
        assert!(denied.writes.is_empty());
        let address = rules.plan(&request("edge", &[&[("remote_address", "a")]]));
        assert_eq!(
            buckets.run(&address, T0).statuses[0].remaining,
            1,
            "the address's bucket is still full"
        );
    }

    #[test]
    fn two_descriptors_on_one_bucket_both_count() {
        let rules = rules(&[PER_ADDRESS]);
        let twice = rules.plan(&request(
            "edge",
            &[&[("remote_address", "a")], &[("remote_address", "a")]],
        ));
        let mut buckets = Buckets(HashMap::new());
        assert_eq!(buckets.run(&twice, T0).overall(), Code::Ok);
        assert_eq!(buckets.run(&twice, T0).overall(), Code::OverLimit);
    }

    #[test]
    fn shadow_descriptors_never_deny_but_say_they_would() {
        let rules = rules(&[SHADOW]);
        let plan = rules.plan(&request("edge", &[&[("path", "/")]]));
        let mut buckets = Buckets(HashMap::new());
        assert!(!buckets.run(&plan, T0).statuses[0].shadow_denied);
        let second = buckets.run(&plan, T0);
        assert_eq!(second.overall(), Code::Ok);
        assert!(second.statuses[0].shadow_denied);
    }

    #[test]
    fn hits_addend_is_the_cost() {
        let rules = rules(&[TWO_LIMITS]);
        let mut req = request("edge", &[&[("user", "u")]]);
        req.hits_addend = 3;
        let plan = rules.plan(&req);
        let mut buckets = Buckets(HashMap::new());
        assert_eq!(buckets.run(&plan, T0).statuses[0].remaining, 0);
        req.hits_addend = 1;
        assert_eq!(
            buckets.run(&rules.plan(&req), T0).overall(),
            Code::OverLimit
        );
        req.descriptors[0].hits_addend = Some(0);
        assert_eq!(
            buckets.run(&rules.plan(&req), T0).overall(),
            Code::Ok,
            "a check that takes nothing"
        );
    }

    const UNLIMITED: &str = r#"{"name":"ops","key":"global","limits":[],"descriptor":{"answer":"unlimited","domain":"edge","entries":[{"key":"user","value":"ops"}]}}"#;
    const BANNED: &str = r#"{"name":"banned","key":"global","limits":[],"descriptor":{"answer":"deny","domain":"edge","entries":[{"key":"user","value":"mallory"}]}}"#;
    const BANNED_SHADOW: &str = r#"{"name":"banned-shadow","key":"global","mode":"shadow","limits":[],"descriptor":{"answer":"deny","domain":"edge","entries":[{"key":"user","value":"eve"}]}}"#;

    #[test]
    fn fixed_answers_pass_or_deny_without_a_bucket() {
        let rules = rules(&[TWO_LIMITS, UNLIMITED, BANNED, BANNED_SHADOW]);
        let mut buckets = Buckets(HashMap::new());
        let ops = rules.plan(&request("edge", &[&[("user", "ops")]]));
        for _ in 0..10 {
            let d = buckets.run(&ops, T0);
            assert_eq!(d.overall(), Code::Ok);
            assert_eq!(d.statuses[0].remaining, u64::MAX);
            assert!(d.writes.is_empty());
        }
        let mallory = rules.plan(&request(
            "edge",
            &[&[("user", "mallory")], &[("user", "u")]],
        ));
        let d = buckets.run(&mallory, T0);
        assert_eq!(d.overall(), Code::OverLimit);
        assert!(d.statuses[0].deny_listed);
        assert!(
            d.writes.is_empty(),
            "the denied request charged no other descriptor"
        );
        let eve = rules.plan(&request("edge", &[&[("user", "eve")]]));
        let d = buckets.run(&eve, T0);
        assert_eq!(d.overall(), Code::Ok);
        assert!(d.statuses[0].shadow_denied);
        let failed_codes: Vec<Code> = failed(&mallory, FailureMode::Open)
            .iter()
            .map(|s| s.code)
            .collect();
        assert_eq!(
            failed_codes,
            [Code::OverLimit, Code::Ok],
            "a deny list needs no bucket"
        );
    }

    #[test]
    fn unreachable_buckets_follow_each_rules_failure_mode() {
        let rules = rules(&[PER_ADDRESS, SHADOW, CLOSED]);
        let plan = rules.plan(&request(
            "edge",
            &[
                &[("remote_address", "a")],
                &[("path", "/")],
                &[("tenant", "t")],
                &[("x", "y")],
            ],
        ));
        let codes: Vec<Code> = failed(&plan, FailureMode::Open)
            .iter()
            .map(|s| s.code)
            .collect();
        assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit, Code::Ok]);
        assert_eq!(failed(&plan, FailureMode::Closed)[0].code, Code::OverLimit);
    }
}
