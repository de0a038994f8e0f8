//! A validated set of rules and the per-request decision over it.

use std::borrow::Cow;
use std::collections::HashSet;

use smallvec::SmallVec;

use crate::gcra::Verdict;
use crate::hash::client_fingerprint;
use crate::limiter::{
    Acquisition, BucketRequest, BucketResult, INLINE_BUCKETS, LimiterCounters, SlotTable,
    TierVerdict,
};
use crate::request::RequestAttributes;
use crate::rule::{FieldError, Limit, Problems, Rule, ValidationErrors};
use crate::spec::{FailureMode, Mode, RuleSpec};
use crate::store::SharedStore;

/// Most rules in one ruleset.
pub const MAX_RULES: usize = 1_000;

/// A share of a limit used, in percent, from which an allowed request counts as
/// "near the limit".
pub const NEAR_LIMIT_PERCENT: u64 = 80;

/// Validated rules in evaluation order: higher `priority` first, then by name.
#[derive(Debug, Clone, Default)]
pub struct Ruleset {
    rules: Vec<Rule>,
    needs: RequestNeeds,
}

/// What the rules of a ruleset can look at, so a host reads only that from a request
/// (each header read from Envoy is a host call).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestNeeds {
    pub method: bool,
    pub authority: bool,
    pub path: bool,
    pub peer_ip: bool,
    /// Lowercase header names, without duplicates.
    pub headers: Vec<String>,
}

impl RequestNeeds {
    fn of(rules: &[Rule]) -> RequestNeeds {
        let mut needs = RequestNeeds::default();
        for rule in rules.iter().filter(|r| r.enabled) {
            rule.matcher.add_needs(&mut needs);
            rule.key.add_needs(&mut needs);
            rule.cost.add_needs(&mut needs);
        }
        needs
    }

    pub(crate) fn header(&mut self, name: &str) {
        if !self.headers.iter().any(|h| h == name) {
            self.headers.push(name.to_string());
        }
    }
}

impl Ruleset {
    /// Validates every rule and the set as a whole (unique names and ids), reporting all
    /// problems with `rules[i].` field paths.
    pub fn from_specs(specs: Vec<RuleSpec>) -> Result<Ruleset, ValidationErrors> {
        let mut problems = Problems::default();
        if specs.len() > MAX_RULES {
            problems.add("rules", format!("at most {MAX_RULES} rules are allowed"));
        }
        let mut rules = Vec::with_capacity(specs.len());
        let mut names = HashSet::new();
        let mut ids = HashSet::new();
        for (i, spec) in specs.into_iter().enumerate() {
            let prefix = format!("rules[{i}]");
            match Rule::try_from(spec) {
                Ok(rule) => {
                    if !names.insert(rule.name.clone()) {
                        problems.add(
                            format!("{prefix}.name"),
                            format!("`{}` is used by another rule", rule.name),
                        );
                    }
                    if !ids.insert(rule.id.clone()) {
                        problems.add(
                            format!("{prefix}.id"),
                            format!("`{}` is used by another rule", rule.id),
                        );
                    }
                    rules.push(rule);
                }
                Err(errors) => problems.nest(&prefix, errors),
            }
        }
        rules.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then_with(|| a.name.cmp(&b.name))
        });
        problems.finish(|| {
            let needs = RequestNeeds::of(&rules);
            Ruleset { rules, needs }
        })
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The request attributes these rules read.
    pub fn needs(&self) -> &RequestNeeds {
        &self.needs
    }

    /// Whether any enabled rule is in shadow mode.
    pub fn has_shadow_rules(&self) -> bool {
        self.rules
            .iter()
            .any(|r| r.enabled && r.mode == Mode::Shadow)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Decides one request: charges the buckets of every matching enabled rule and says
    /// whether it may pass. Enforce-mode rules are charged all-or-nothing together;
    /// each shadow-mode rule is charged on its own and never denies.
    pub fn decide<'r>(
        &'r self,
        request: &impl RequestAttributes,
        store: &impl SharedStore,
        table: &SlotTable,
        now: u64,
        default_failure: FailureMode,
    ) -> Decision<'r> {
        self.decide_observed(request, store, table, now, default_failure, &mut ())
    }

    /// [`Ruleset::decide`], also telling `sink` what happened for each matching rule (for
    /// per-rule and per-client statistics).
    pub fn decide_observed<'r>(
        &'r self,
        request: &impl RequestAttributes,
        store: &impl SharedStore,
        table: &SlotTable,
        now: u64,
        default_failure: FailureMode,
        sink: &mut impl DecisionSink,
    ) -> Decision<'r> {
        let mut decision = Decision::default();
        let mut enforced: SmallVec<[(&'r Rule, BucketRequest<'r>, Cow<'_, str>); INLINE_BUCKETS]> =
            SmallVec::new();
        for rule in self
            .rules
            .iter()
            .filter(|r| r.enabled && r.matcher.matches(request))
        {
            decision.matched_rules += 1;
            let Some(client) = rule.key.extract(request) else {
                decision.keys_missing += 1;
                sink.record(rule, RuleOutcome::KeyMissing, "");
                continue;
            };
            let bucket = BucketRequest {
                fingerprint: client_fingerprint(&rule.id, &client),
                limits: rule.limits_for(&client),
                cost: rule.cost.of(request),
                on_failure: rule.failure_mode_or(default_failure),
            };
            match rule.mode {
                Mode::Enforce => enforced.push((rule, bucket, client)),
                Mode::Shadow => {
                    let acquisition = table.acquire(store, now, &[bucket]);
                    decision.absorb_counters(&acquisition);
                    let outcome = match acquisition.buckets.first() {
                        Some(BucketResult::Denied { .. } | BucketResult::FailedClosed(_)) => {
                            decision.shadow_denied.push(rule);
                            RuleOutcome::ShadowDenied
                        }
                        Some(BucketResult::FailedOpen(_)) => {
                            decision.failed_open += 1;
                            RuleOutcome::FailedOpen
                        }
                        Some(BucketResult::Allowed { tightest }) => RuleOutcome::Allowed {
                            near_limit: is_near_limit(bucket.limits, tightest),
                        },
                        Some(BucketResult::Skipped) | None => RuleOutcome::NotCharged,
                    };
                    sink.record(rule, outcome, &client);
                }
            }
        }
        if enforced.is_empty() {
            return decision;
        }
        let buckets: SmallVec<[BucketRequest<'r>; INLINE_BUCKETS]> =
            enforced.iter().map(|(_, b, _)| *b).collect();
        let acquisition = table.acquire(store, now, &buckets);
        decision.absorb_counters(&acquisition);
        for ((rule, bucket, client), result) in enforced.iter().zip(&acquisition.buckets) {
            let outcome = match result {
                BucketResult::Allowed { tightest } if acquisition.allowed => {
                    decision.note_allowed(rule, bucket.limits, *tightest);
                    RuleOutcome::Allowed {
                        near_limit: is_near_limit(bucket.limits, tightest),
                    }
                }
                // Charged, then refunded because another rule denied the request.
                BucketResult::Allowed { .. } | BucketResult::Skipped => RuleOutcome::NotCharged,
                BucketResult::Denied { binding } => {
                    decision.outcome = Outcome::Denied(Limited {
                        rule,
                        limits: bucket.limits,
                        tier: *binding,
                    });
                    RuleOutcome::Denied
                }
                BucketResult::FailedOpen(_) => {
                    decision.failed_open += 1;
                    RuleOutcome::FailedOpen
                }
                BucketResult::FailedClosed(_) => {
                    decision.outcome = Outcome::FailedClosed(rule);
                    RuleOutcome::FailedClosed
                }
            };
            sink.record(rule, outcome, client);
        }
        decision
    }
}

/// A limit of a rule and its verdict: what the rate-limit headers describe.
#[derive(Debug, Clone, Copy)]
pub struct Limited<'r> {
    pub rule: &'r Rule,
    pub limits: &'r [Limit],
    pub tier: TierVerdict,
}

impl Limited<'_> {
    pub fn limit(&self) -> Option<&Limit> {
        self.limits.get(self.tier.tier)
    }

    pub fn verdict(&self) -> &Verdict {
        &self.tier.verdict
    }
}

/// Whether the request may pass.
#[derive(Debug, Clone, Copy, Default)]
pub enum Outcome<'r> {
    #[default]
    Allowed,
    /// An enforce-mode limit is exhausted.
    Denied(Limited<'r>),
    /// A fail-closed rule could not be evaluated.
    FailedClosed(&'r Rule),
}

/// Everything the filter needs to answer a request and count it.
#[derive(Debug, Clone, Default)]
pub struct Decision<'r> {
    pub outcome: Outcome<'r>,
    /// For an allowed request: the enforce-mode limit with the fewest tokens left among
    /// rules that send rate-limit headers.
    pub tightest: Option<Limited<'r>>,
    /// Shadow-mode rules that would have denied the request.
    pub shadow_denied: Vec<&'r Rule>,
    /// Enabled rules whose match held.
    pub matched_rules: u32,
    /// Matching rules skipped because the request carried no client key.
    pub keys_missing: u32,
    /// Buckets that could not be evaluated and let the request through.
    pub failed_open: u32,
    /// Whether an allowed request left some limit at least [`NEAR_LIMIT_PERCENT`] used.
    pub near_limit: bool,
    pub counters: LimiterCounters,
}

impl<'r> Decision<'r> {
    pub fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed)
    }

    fn absorb_counters(&mut self, acquisition: &Acquisition) {
        let c = &acquisition.counters;
        self.counters.cas_conflicts += c.cas_conflicts;
        self.counters.shared_slots += c.shared_slots;
        self.counters.evictions += c.evictions;
        self.counters.corrupt_slots += c.corrupt_slots;
        self.counters.refund_failures += c.refund_failures;
    }

    fn note_allowed(&mut self, rule: &'r Rule, limits: &'r [Limit], tightest: TierVerdict) {
        self.near_limit |= is_near_limit(limits, &tightest);
        if !rule.rate_limit_headers {
            return;
        }
        let candidate = Limited {
            rule,
            limits,
            tier: tightest,
        };
        let replace = self
            .tightest
            .is_none_or(|t| tightest.verdict.remaining < t.tier.verdict.remaining);
        if replace {
            self.tightest = Some(candidate);
        }
    }
}

/// Whether an allowed request left its tightest limit at least [`NEAR_LIMIT_PERCENT`] used.
fn is_near_limit(limits: &[Limit], tightest: &TierVerdict) -> bool {
    limits.get(tightest.tier).is_some_and(|limit| {
        let used = limit.burst.saturating_sub(tightest.verdict.remaining);
        used.saturating_mul(100) >= limit.burst.saturating_mul(NEAR_LIMIT_PERCENT)
    })
}

/// What happened to one matching rule in one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleOutcome {
    /// Charged; the request may pass as far as this rule is concerned.
    Allowed { near_limit: bool },
    /// This rule denied the request.
    Denied,
    /// A shadow-mode rule would have denied the request.
    ShadowDenied,
    /// Not charged: another rule denied the request first (or raced it into a denial).
    NotCharged,
    /// Could not be evaluated; the request was let through.
    FailedOpen,
    /// Could not be evaluated; the request was denied (fail-closed rule).
    FailedClosed,
    /// The request carried no client key for this rule.
    KeyMissing,
}

/// Receives per-rule outcomes during [`Ruleset::decide_observed`]. Called on the request
/// path: implementations must be cheap and must not block.
pub trait DecisionSink {
    /// `client` is the rule's client key for this request ("" when missing).
    fn record(&mut self, rule: &Rule, outcome: RuleOutcome, client: &str);
}

/// Ignores everything.
impl DecisionSink for () {
    fn record(&mut self, _: &Rule, _: RuleOutcome, _: &str) {}
}

impl From<FieldError> for ValidationErrors {
    fn from(e: FieldError) -> Self {
        ValidationErrors(vec![e])
    }
}
