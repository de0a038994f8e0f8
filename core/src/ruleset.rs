//! A validated set of rules and the per-request decision over it.

use std::borrow::Cow;
use std::collections::HashSet;

use smallvec::SmallVec;

use crate::bucket::{BucketRequest, BucketResult, INLINE_BUCKETS, LimiterCounters, TierVerdict};
use crate::gcra::Verdict;
use crate::global::lease::{FleetView, Spend};
use crate::global::table::{LeaseFailure, LeaseTable, Spent};
use crate::hash::{client_fingerprint, global_bucket};
use crate::limiter::{Acquisition, SlotTable};
use crate::request::{RequestAttributes, RequestNeeds};
use crate::response::RenderedRule;
use crate::rule::{Limit, Rule};
use crate::spec::{FailureMode, Mode, RuleSpec};
use crate::store::SharedStore;
use crate::time::Nanos;
use crate::validation::{Problems, ValidationErrors};

// What a decision's limits are presented with; it kept this path when it moved there.
pub use crate::response::Limited;

/// Most rules in one ruleset.
pub const MAX_RULES: usize = 1_000;

/// A share of a limit used, in percent, from which an allowed request counts as
/// "near the limit".
pub const NEAR_LIMIT_PERCENT: u64 = 80;

/// Validated rules in evaluation order: higher `priority` first, then by name.
#[derive(Debug, Clone, Default)]
pub struct Ruleset {
    rules: Vec<Rule>,
    /// The fixed text of each rule's rate-limit fields and denial body, one per rule, in
    /// the same order.
    rendered: Vec<RenderedRule>,
    needs: RequestNeeds,
}

/// What the enabled rules of `rules` read from a request.
fn needs_of(rules: &[Rule]) -> RequestNeeds {
    let mut needs = RequestNeeds::default();
    for rule in rules.iter().filter(|r| r.enabled) {
        rule.add_needs(&mut needs);
    }
    needs
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
            let needs = needs_of(&rules);
            let rendered = rules.iter().map(RenderedRule::new).collect();
            Ruleset {
                rules,
                rendered,
                needs,
            }
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
        global: &GlobalBuckets<'_, impl SharedStore>,
        now: Nanos,
        default_failure: FailureMode,
    ) -> Decision<'r> {
        self.decide_observed(request, store, table, global, now, default_failure, &mut ())
    }

    /// [`Ruleset::decide`], also telling `sink` what happened for each matching rule (for
    /// per-rule and per-client statistics).
    ///
    /// Global limits are spent from the lease table first (each can be undone); then the
    /// proxy limits of every enforce-mode rule are charged all-or-nothing in the slot table.
    /// A denial anywhere undoes every global spend of the request (its attempts stay
    /// counted: they are demand).
    #[allow(clippy::too_many_arguments)] // The request, its two stores and the clock.
    pub fn decide_observed<'r>(
        &'r self,
        request: &impl RequestAttributes,
        store: &impl SharedStore,
        table: &SlotTable,
        global: &GlobalBuckets<'_, impl SharedStore>,
        now: Nanos,
        default_failure: FailureMode,
        sink: &mut impl DecisionSink,
    ) -> Decision<'r> {
        let mut decision = Decision::default();
        let mut enforced: SmallVec<[Enforced<'r, '_>; INLINE_BUCKETS]> = SmallVec::new();
        let mut spends = GlobalSpends::default();
        for (rule, rendered) in self
            .rules
            .iter()
            .zip(&self.rendered)
            .filter(|(r, _)| r.enabled && r.matcher.matches(request))
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
                Mode::Enforce => enforced.push(Enforced {
                    rule,
                    rendered,
                    bucket,
                    client,
                    global: None,
                }),
                Mode::Shadow => {
                    let outcome = self.shadow(&bucket, store, table, global, now, &mut decision);
                    match outcome {
                        RuleOutcome::ShadowDenied => decision.shadow_denied.push(rule),
                        RuleOutcome::FailedOpen => decision.failed_open += 1,
                        _ => {}
                    }
                    sink.record(rule, outcome, &client);
                }
            }
        }
        if enforced.is_empty() {
            return decision;
        }

        // Phase 1: every enforce-mode rule's global limits.
        for i in 0..enforced.len() {
            let Some(entry) = enforced.get(i) else { break };
            let (rule, bucket) = (entry.rule, entry.bucket);
            match spends.charge(&bucket, global, now, &mut decision) {
                Ok(tightest) => {
                    if let Some(e) = enforced.get_mut(i) {
                        e.global = tightest;
                    }
                }
                Err(GlobalDenial::Denied(binding)) => {
                    spends.undo_all(global, now);
                    decision.outcome = Outcome::Denied(entry.limited(binding));
                    return finish_early(decision, &enforced, i, RuleOutcome::Denied, sink);
                }
                Err(GlobalDenial::Failed) => match bucket.on_failure {
                    FailureMode::Open => decision.failed_open += 1,
                    FailureMode::Closed => {
                        spends.undo_all(global, now);
                        decision.outcome = Outcome::FailedClosed(rule);
                        return finish_early(
                            decision,
                            &enforced,
                            i,
                            RuleOutcome::FailedClosed,
                            sink,
                        );
                    }
                },
            }
        }

        // Phase 2: the proxy limits, all-or-nothing, in the slot table.
        let local: SmallVec<[BucketRequest<'r>; INLINE_BUCKETS]> = enforced
            .iter()
            .filter(|e| has_proxy_limits(e.bucket.limits))
            .map(|e| e.bucket)
            .collect();
        let acquisition = table.acquire(store, now, &local);
        decision.absorb_counters(&acquisition);
        if !acquisition.allowed {
            spends.undo_all(global, now);
        }
        let mut results = acquisition.buckets.iter();
        for e in &enforced {
            let result = if has_proxy_limits(e.bucket.limits) {
                results.next()
            } else {
                None
            };
            let outcome = match result {
                None if acquisition.allowed => {
                    if let Some(tightest) = e.global {
                        decision.note_allowed(e, tightest);
                    }
                    RuleOutcome::Allowed {
                        near_limit: e.global.is_some_and(|t| is_near_limit(e.bucket.limits, &t)),
                    }
                }
                None => RuleOutcome::NotCharged,
                Some(BucketResult::Allowed { tightest }) if acquisition.allowed => {
                    let tightest = tighter_of(*tightest, e.global);
                    decision.note_allowed(e, tightest);
                    RuleOutcome::Allowed {
                        near_limit: is_near_limit(e.bucket.limits, &tightest),
                    }
                }
                // Charged, then refunded because another rule denied the request.
                Some(BucketResult::Allowed { .. } | BucketResult::Skipped) => {
                    RuleOutcome::NotCharged
                }
                Some(BucketResult::Denied { binding }) => {
                    decision.outcome = Outcome::Denied(e.limited(*binding));
                    RuleOutcome::Denied
                }
                Some(BucketResult::FailedOpen(_)) => {
                    decision.failed_open += 1;
                    RuleOutcome::FailedOpen
                }
                Some(BucketResult::FailedClosed(_)) => {
                    decision.outcome = Outcome::FailedClosed(e.rule);
                    RuleOutcome::FailedClosed
                }
            };
            sink.record(e.rule, outcome, &e.client);
        }
        decision
    }

    /// Charges one shadow-mode rule on its own: global limits, then proxy limits. It never
    /// denies; the outcome says what it would have done.
    fn shadow(
        &self,
        bucket: &BucketRequest<'_>,
        store: &impl SharedStore,
        table: &SlotTable,
        global: &GlobalBuckets<'_, impl SharedStore>,
        now: Nanos,
        decision: &mut Decision<'_>,
    ) -> RuleOutcome {
        let mut spends = GlobalSpends::default();
        let global_tightest = match spends.charge(bucket, global, now, decision) {
            Ok(tightest) => tightest,
            Err(GlobalDenial::Denied(_)) => return RuleOutcome::ShadowDenied,
            Err(GlobalDenial::Failed) => return RuleOutcome::FailedOpen,
        };
        if !has_proxy_limits(bucket.limits) {
            return RuleOutcome::Allowed {
                near_limit: global_tightest.is_some_and(|t| is_near_limit(bucket.limits, &t)),
            };
        }
        let acquisition = table.acquire(store, now, std::slice::from_ref(bucket));
        decision.absorb_counters(&acquisition);
        match acquisition.buckets.first() {
            Some(BucketResult::Denied { .. } | BucketResult::FailedClosed(_)) => {
                spends.undo_all(global, now);
                RuleOutcome::ShadowDenied
            }
            Some(BucketResult::FailedOpen(_)) => RuleOutcome::FailedOpen,
            Some(BucketResult::Allowed { tightest }) => RuleOutcome::Allowed {
                near_limit: is_near_limit(bucket.limits, &tighter_of(*tightest, global_tightest)),
            },
            Some(BucketResult::Skipped) | None => RuleOutcome::NotCharged,
        }
    }
}

/// The fleet-wide side of a decision: the lease table, the shared data it lives in, and
/// what the control service last told the workers about the fleet.
#[derive(Debug)]
pub struct GlobalBuckets<'a, S> {
    pub table: &'a LeaseTable,
    pub store: &'a S,
    pub view: FleetView,
}

/// An enforce-mode rule that matched, its bucket set, and its tightest global verdict.
struct Enforced<'r, 'c> {
    rule: &'r Rule,
    rendered: &'r RenderedRule,
    bucket: BucketRequest<'r>,
    client: Cow<'c, str>,
    global: Option<TierVerdict>,
}

impl<'r> Enforced<'r, '_> {
    /// This rule's limit `tier` and its verdict, with the text of the client's limits.
    fn limited(&self, tier: TierVerdict) -> Limited<'r> {
        Limited {
            rule: self.rule,
            limits: self.bucket.limits,
            rendered: self.rendered.for_client(&self.client),
            tier,
        }
    }
}

/// Why a rule's global limits did not admit the request.
enum GlobalDenial {
    Denied(TierVerdict),
    /// The lease table could not be used (full, contended, or a host error).
    Failed,
}

/// The global spends of one request, kept so that a later denial can undo them.
#[derive(Default)]
struct GlobalSpends {
    spent: SmallVec<[(u64, u64, Spent); INLINE_BUCKETS]>,
}

impl GlobalSpends {
    /// Spends `bucket`'s cost from each of its global limits; on a denial or a failure the
    /// rule's own spends are undone. Returns the tightest global verdict, if any.
    fn charge(
        &mut self,
        bucket: &BucketRequest<'_>,
        global: &GlobalBuckets<'_, impl SharedStore>,
        now: Nanos,
        decision: &mut Decision<'_>,
    ) -> Result<Option<TierVerdict>, GlobalDenial> {
        let first_of_rule = self.spent.len();
        let mut tightest: Option<TierVerdict> = None;
        for (tier, limit) in bucket.limits.iter().enumerate().filter(|(_, l)| l.global) {
            let id = global_bucket(limit.identity, bucket.fingerprint);
            let spent = global.table.spend(
                global.store,
                id,
                &limit.gcra,
                bucket.cost,
                now,
                &global.view,
            );
            let denial = match spent {
                Ok(spent) => match spent.spend {
                    Spend::Denied { retry_after_ns } => GlobalDenial::Denied(TierVerdict {
                        tier,
                        verdict: Verdict {
                            allowed: false,
                            new_tat: Nanos::ZERO,
                            remaining: 0,
                            reset_ns: retry_after_ns,
                            retry_after_ns,
                        },
                    }),
                    spend => {
                        if spend == Spend::Fallback {
                            decision.global_fallback += 1;
                        }
                        decision.global_created += u32::from(spent.created);
                        self.spent.push((id, bucket.cost, spent));
                        let verdict = TierVerdict {
                            tier,
                            verdict: Verdict {
                                allowed: true,
                                new_tat: Nanos::ZERO,
                                remaining: spent.remaining,
                                // As this proxy sees it: the time its share takes to refill.
                                reset_ns: limit
                                    .burst
                                    .saturating_sub(spent.remaining)
                                    .saturating_mul(limit.gcra.interval_ns()),
                                retry_after_ns: 0,
                            },
                        };
                        if tightest.is_none_or(|t| verdict.verdict.remaining < t.verdict.remaining)
                        {
                            tightest = Some(verdict);
                        }
                        continue;
                    }
                },
                Err(failure) => {
                    decision.global_failures += 1;
                    if failure == LeaseFailure::TableFull {
                        decision.global_table_full += 1;
                    }
                    GlobalDenial::Failed
                }
            };
            self.undo_from(first_of_rule, global, now);
            return Err(denial);
        }
        Ok(tightest)
    }

    fn undo_all(&mut self, global: &GlobalBuckets<'_, impl SharedStore>, now: Nanos) {
        self.undo_from(0, global, now);
    }

    fn undo_from(
        &mut self,
        first: usize,
        global: &GlobalBuckets<'_, impl SharedStore>,
        now: Nanos,
    ) {
        for (id, cost, spent) in self.spent.drain(first..) {
            global
                .table
                .undo(global.store, id, cost, &spent, now, &global.view);
        }
    }
}

fn has_proxy_limits(limits: &[Limit]) -> bool {
    limits.iter().any(|l| !l.global)
}

/// The tighter of a proxy limit's verdict and a global one.
fn tighter_of(local: TierVerdict, global: Option<TierVerdict>) -> TierVerdict {
    match global {
        Some(g) if g.verdict.remaining < local.verdict.remaining => g,
        _ => local,
    }
}

/// Ends a decision that a rule decided before the slot table was charged: that rule gets
/// `outcome`, the others are not charged.
fn finish_early<'r>(
    decision: Decision<'r>,
    enforced: &[Enforced<'r, '_>],
    decided: usize,
    outcome: RuleOutcome,
    sink: &mut impl DecisionSink,
) -> Decision<'r> {
    for (i, e) in enforced.iter().enumerate() {
        let o = if i == decided {
            outcome
        } else {
            RuleOutcome::NotCharged
        };
        sink.record(e.rule, o, &e.client);
    }
    decision
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
    /// Global limits admitted from the fallback share (the coordinator out of reach).
    pub global_fallback: u32,
    /// Global limits that could not be evaluated (the rule's failure mode decided).
    pub global_failures: u32,
    /// Of those, how many because the lease table was full.
    pub global_table_full: u32,
    /// Global buckets this request was the first on this proxy to use.
    pub global_created: u32,
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
        self.counters.remembered_denials += c.remembered_denials;
    }

    fn note_allowed(&mut self, rule: &Enforced<'r, '_>, tightest: TierVerdict) {
        self.near_limit |= is_near_limit(rule.bucket.limits, &tightest);
        if !rule.rule.rate_limit_headers {
            return;
        }
        let replace = self
            .tightest
            .is_none_or(|t| tightest.verdict.remaining < t.tier.verdict.remaining);
        if replace {
            self.tightest = Some(rule.limited(tightest));
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
