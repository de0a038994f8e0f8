//! The per-request decision, in the order it happens:
//!
//! 1. `match_rules`: the enabled rules that match, each with its client's bucket set. A
//!    shadow-mode rule is charged there and then, on its own: it never denies, and its
//!    outcome says what it would have done.
//!    With in-flight limits (`Ruleset::decide_in_flight`), a shadow-mode rule also
//!    takes a place for the request there (`in_flight.rs`); then
//!    `take_enforced_places` takes one under each enforce-mode in-flight limit, and a
//!    full one decides the request (`Early`) before any token is charged.
//! 2. `GlobalSpends::charge_enforced`: every enforce-mode rule's global limits, from the
//!    lease table. A denial (or a fail-closed failure) here decides the request (`Early`)
//!    and undoes every global spend: nothing is charged.
//! 3. `acquire_local`: their proxy limits, all-or-nothing, in the slot table.
//! 4. Settling: when the slot table denies, every global spend is undone too.
//! 5. `record_outcomes`: each rule's outcome, the request's, and its tightest limit.
//! 6. `reserve_tokens`: for an allowed request, what each rule's token limits took, to
//!    be settled when the response ends (`crate::tokens`); and `delayed`: for one whose
//!    tokens a rule with `on_limit: delay` reserved ahead (step 3, while the worker's
//!    delay queue had room), how long it waits and what to give back if it gives up.
//!
//! A denied request, however it was denied, lets its in-flight places go before the
//! decision returns (`in_flight::let_go_if_denied`).
//!
//! So a denied request consumes no tokens: all enforce-mode limits must allow, and none
//! is charged when one denies. Global spends that were undone stay counted at the lease
//! table: they are demand.

use std::borrow::Cow;

use smallvec::SmallVec;

use super::in_flight::{self, InFlightContext, Place, take_place};
use super::{Decision, DecisionSink, Outcome, RuleOutcome, Ruleset};
use crate::bucket::{BucketRequest, BucketResult, INLINE_BUCKETS, LimiterCounters, TierVerdict};
use crate::delay::{DelayQueue, Delayed, QueueKey, Refund};
use crate::gcra::Verdict;
use crate::global::lease::{FleetView, Spend};
use crate::global::table::{LeaseFailure, LeaseTable, Spent};
use crate::hash::{client_fingerprint, global_bucket};
use crate::limiter::{Acquisition, SlotTable};
use crate::request::RequestAttributes;
use crate::response::{Limited, RenderedLimits, RenderedRule};
use crate::rule::{Counts, Limit, Rule};
use crate::spec::{FailureMode, Mode};
use crate::store::SharedStore;
use crate::time::Nanos;
use crate::tokens::{Reservation, Reserved, TokenChange, TokenEstimate};

/// What a decision works with besides the request: the slot table and the shared data it
/// lives in, the fleet-wide buckets, the time, and the failure mode of rules that set
/// none. The filter builds one per request from its configuration and the host clock.
#[derive(Debug)]
pub struct DecisionContext<'a, S, L> {
    /// The shared data the slot table's buckets live in.
    pub store: &'a S,
    pub table: &'a SlotTable,
    pub global: GlobalBuckets<'a, L>,
    pub now: Nanos,
    /// The failure mode of rules that set none (the plugin configuration's).
    pub default_failure: FailureMode,
    /// The worker's delay queue, for rules with `on_limit: delay`: whether it has room
    /// decides whether such a rule may reserve ahead. `None`: every rule refuses.
    pub queue: Option<&'a DelayQueue>,
}

/// The fleet-wide side of a decision: the lease table, the shared data it lives in, and
/// what the control service last told the workers about the fleet.
#[derive(Debug)]
pub struct GlobalBuckets<'a, S> {
    pub table: &'a LeaseTable,
    pub store: &'a S,
    pub view: FleetView,
}

/// The enforce-mode rules of one request, held without a heap allocation up to
/// [`INLINE_BUCKETS`].
type EnforcedRules<'r, 'q> = SmallVec<[Enforced<'r, 'q>; INLINE_BUCKETS]>;

impl Ruleset {
    /// Decides one request: charges the buckets of every matching enabled rule and says
    /// whether it may pass. Enforce-mode rules are charged all-or-nothing together;
    /// each shadow-mode rule is charged on its own and never denies.
    pub fn decide<'r>(
        &'r self,
        request: &impl RequestAttributes,
        cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
    ) -> Decision<'r> {
        self.decide_observed(request, cx, &mut ())
    }

    /// [`Ruleset::decide`], also telling `sink` what happened for each matching rule (for
    /// per-rule and per-client statistics).
    pub fn decide_observed<'r>(
        &'r self,
        request: &impl RequestAttributes,
        cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
        sink: &mut impl DecisionSink,
    ) -> Decision<'r> {
        self.decide_counting(request, cx, None, sink)
    }

    /// [`Ruleset::decide_observed`] for a ruleset with in-flight limits
    /// ([`Ruleset::has_in_flight_rules`]): an allowed request also holds a place under
    /// each matching one (`Decision::holds`), which the caller lets go when its stream
    /// ends; a denied one holds none.
    pub fn decide_in_flight<'r>(
        &'r self,
        request: &impl RequestAttributes,
        cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
        in_flight: &InFlightContext<'_>,
        sink: &mut impl DecisionSink,
    ) -> Decision<'r> {
        self.decide_counting(request, cx, Some(in_flight), sink)
    }

    fn decide_counting<'r>(
        &'r self,
        request: &impl RequestAttributes,
        cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
        in_flight: Option<&InFlightContext<'_>>,
        sink: &mut impl DecisionSink,
    ) -> Decision<'r> {
        let mut decision = Decision::default();
        self.decide_into(request, cx, in_flight, sink, &mut decision);
        in_flight::let_go_if_denied(in_flight, cx.now, &mut decision);
        decision
    }

    fn decide_into<'r>(
        &'r self,
        request: &impl RequestAttributes,
        cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
        in_flight: Option<&InFlightContext<'_>>,
        sink: &mut impl DecisionSink,
        decision: &mut Decision<'r>,
    ) {
        let mut enforced = EnforcedRules::new();
        self.match_rules(request, cx, in_flight, decision, &mut enforced, sink);
        if enforced.is_empty() {
            return;
        }
        if let Err(early) = take_enforced_places(&enforced, in_flight, cx, decision) {
            early.finish(decision, &enforced, sink);
            return;
        }
        let mut spends = GlobalSpends::default();
        if let Err(early) = spends.charge_enforced(&mut enforced, cx, decision) {
            early.finish(decision, &enforced, sink);
            return;
        }
        let acquisition = acquire_local(&enforced, cx);
        decision.absorb_counters(&acquisition.counters);
        if !acquisition.allowed {
            // Step 4: what the slot table denied keeps no global tokens either.
            spends.undo_all(&cx.global, cx.now);
        }
        record_outcomes(decision, &enforced, &acquisition, sink);
        if acquisition.allowed && decision.is_allowed() {
            // An elastic rule's pool measures what the rule admitted.
            for e in &enforced {
                if let Some(pool) = &e.rule.elastic {
                    let counters = &mut decision.counters;
                    cx.table
                        .charge_pool(cx.store, cx.now, pool, e.bucket.cost, counters);
                }
            }
            reserve_tokens(decision, &enforced, &acquisition, &spends, request.path());
            if acquisition.wait_ns > 0 {
                decision.delayed = Some(delayed(&enforced, &acquisition));
            }
        }
    }

    /// Step 1: the enabled rules that match `request`, in order, each with its client's
    /// bucket set. A rule whose client key the request lacks is only counted; a
    /// shadow-mode rule is charged at once, on its own; the enforce-mode rules go into
    /// `enforced`, to be charged together. (Filled in place: returning the inline buffer
    /// would copy it on every request.)
    fn match_rules<'r, 'q>(
        &'r self,
        request: &'q impl RequestAttributes,
        cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
        in_flight: Option<&InFlightContext<'_>>,
        decision: &mut Decision<'r>,
        enforced: &mut EnforcedRules<'r, 'q>,
        sink: &mut impl DecisionSink,
    ) {
        let matching = self
            .rules
            .iter()
            .zip(&self.rendered)
            .filter(|(r, _)| r.enabled && r.descriptor.is_none() && r.matcher.matches(request));
        for (rule, rendered) in matching {
            decision.matched_rules += 1;
            let client = match (rule.key.extract(request), &rule.key_fallback) {
                (Some(client), _) => client,
                (None, Some(fallback)) => {
                    decision.keys_fallback += 1;
                    Cow::Owned(fallback.clone())
                }
                (None, None) => {
                    decision.keys_missing += 1;
                    sink.record(rule, RuleOutcome::KeyMissing, "", 0);
                    continue;
                }
            };
            let bucket = BucketRequest {
                fingerprint: client_fingerprint(&rule.id, &client),
                limits: rule.limits_for(&client),
                cost: rule.cost.of(request),
                on_failure: rule.failure_mode_or(cx.default_failure),
                tokens: rule
                    .tokens
                    .as_ref()
                    .map_or_else(TokenEstimate::default, |b| {
                        TokenEstimate::of(b, &request.body_facts().unwrap_or_default())
                    }),
                max_delay_ns: None,
                elastic_open: false,
            };
            let mode = rule.mode_for(&client);
            if mode != rule.mode {
                decision.rollout_shadowed += 1;
            }
            let bucket = BucketRequest {
                max_delay_ns: crate::delay::allowance(
                    rule.delay.filter(|_| mode == Mode::Enforce),
                    bucket.fingerprint,
                    cx.queue,
                ),
                ..bucket
            };
            match mode {
                Mode::Enforce => enforced.push(Enforced {
                    rule,
                    rendered,
                    bucket: BucketRequest {
                        elastic_open: rule.elastic.as_ref().is_some_and(|pool| {
                            let counters = &mut decision.counters;
                            cx.table
                                .pool_open(cx.store, cx.now, pool, bucket.cost, counters)
                        }),
                        ..bucket
                    },
                    client,
                    global: None,
                }),
                Mode::Shadow | Mode::Warn => {
                    // A shadow rule's place is kept while the request is in flight (it
                    // is), unless another rule denies the request.
                    let place = take_place(
                        rule,
                        bucket.fingerprint,
                        &client,
                        in_flight,
                        cx.now,
                        decision,
                    );
                    let (outcome, over) = match place {
                        Place::Full { .. } => (RuleOutcome::ShadowDenied, Over::Rule),
                        Place::Failed => {
                            decision.failed_open += 1;
                            (RuleOutcome::FailedOpen, Over::Nothing)
                        }
                        Place::Unlimited | Place::Held => {
                            charge_shadow(rule, &bucket, request.path(), cx, decision)
                        }
                    };
                    let outcome = match outcome {
                        // Not evaluated (a failure its fail-closed mode turns into "would
                        // deny"): a warn rule cannot tell whether the client is over, so it
                        // warns no one and counts the failure.
                        RuleOutcome::ShadowDenied
                            if mode == Mode::Warn && over == Over::Nothing =>
                        {
                            decision.failed_open += 1;
                            RuleOutcome::FailedOpen
                        }
                        RuleOutcome::ShadowDenied if mode == Mode::Warn => RuleOutcome::Warned,
                        RuleOutcome::ShadowDenied => {
                            decision.shadow_denied.push(rule);
                            outcome
                        }
                        RuleOutcome::FailedOpen => {
                            decision.failed_open += 1;
                            outcome
                        }
                        // Within a soft limit's margin.
                        RuleOutcome::Allowed { .. } if over != Over::Nothing => RuleOutcome::Warned,
                        _ => outcome,
                    };
                    // Only a warn-mode rule tells its clients; a shadow-mode one counts.
                    if outcome == RuleOutcome::Warned && mode == Mode::Warn {
                        let limits = rendered.for_client(&client);
                        match over {
                            Over::Tiers(tiers) => decision.note_warned(limits, tiers),
                            Over::Rule | Over::Nothing => decision.warnings.push(&rule.name),
                        }
                    }
                    sink.record(rule, outcome, &client, bucket.tokens.total());
                }
            }
        }
    }
}

/// An enforce-mode rule that matched, its client's bucket set, and its tightest global
/// verdict (once its global limits are spent).
struct Enforced<'r, 'q> {
    rule: &'r Rule,
    rendered: &'r RenderedRule,
    bucket: BucketRequest<'r>,
    client: Cow<'q, str>,
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

    /// Whether the slot table has anything to charge for this rule.
    fn has_proxy_limits(&self) -> bool {
        has_proxy_limits(self.bucket.limits)
    }
}

/// An enforce-mode rule that decided the request before the slot table was charged.
struct Early<'r> {
    /// Its place among the request's enforce-mode rules.
    at: usize,
    outcome: Outcome<'r>,
    /// What it reports to the sink; the others report that they were not charged.
    reported: RuleOutcome,
}

impl<'r> Early<'r> {
    /// Ends the decision: this rule reports what it did, the others that they were not
    /// charged.
    fn finish(
        self,
        decision: &mut Decision<'r>,
        enforced: &[Enforced<'r, '_>],
        sink: &mut impl DecisionSink,
    ) {
        decision.outcome = self.outcome;
        for (i, e) in enforced.iter().enumerate() {
            let outcome = if i == self.at {
                self.reported
            } else {
                RuleOutcome::NotCharged
            };
            sink.record(e.rule, outcome, &e.client, e.bucket.tokens.total());
        }
    }
}

/// Step 1, with in-flight limits: a place under the in-flight limit of every enforce-mode rule that has one.
/// A full limit (or a fail-closed failure) decides the request before any token is
/// charged; the places already taken are let go with the decision.
fn take_enforced_places<'r>(
    enforced: &[Enforced<'r, '_>],
    in_flight: Option<&InFlightContext<'_>>,
    cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
    decision: &mut Decision<'r>,
) -> Result<(), Early<'r>> {
    if in_flight.is_none() {
        return Ok(());
    }
    for (at, e) in enforced.iter().enumerate() {
        let place = take_place(
            e.rule,
            e.bucket.fingerprint,
            &e.client,
            in_flight,
            cx.now,
            decision,
        );
        if let Some((outcome, reported)) =
            in_flight::enforced_outcome(place, e.rule, e.bucket.on_failure, decision)
        {
            return Err(Early {
                at,
                outcome,
                reported,
            });
        }
    }
    Ok(())
}

/// Step 3: the proxy limits of every enforce-mode rule, all-or-nothing, in the slot
/// table. Rules with only global limits have nothing to charge there.
fn acquire_local(
    enforced: &[Enforced<'_, '_>],
    cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
) -> Acquisition {
    let local: SmallVec<[BucketRequest<'_>; INLINE_BUCKETS]> = enforced
        .iter()
        .filter(|e| e.has_proxy_limits())
        .map(|e| e.bucket)
        .collect();
    cx.table.acquire(cx.store, cx.now, &local)
}

/// Step 5: what each enforce-mode rule did, told to `sink` in rule order, and what the
/// request gets: its outcome, and when allowed, its tightest limit.
fn record_outcomes<'r>(
    decision: &mut Decision<'r>,
    enforced: &[Enforced<'r, '_>],
    acquisition: &Acquisition,
    sink: &mut impl DecisionSink,
) {
    // One result per rule with proxy limits, in the order they were charged.
    let mut results = acquisition.buckets.iter();
    for e in enforced {
        let result = if e.has_proxy_limits() {
            results.next()
        } else {
            None
        };
        let outcome = decision.rule_outcome(e, result, acquisition.allowed);
        sink.record(e.rule, outcome, &e.client, e.bucket.tokens.total());
    }
}

impl<'r> Decision<'r> {
    /// The outcome of enforce-mode rule `e`, given its slot-table result (`None`: it has
    /// no proxy limits) and whether the slot table allowed the request; a denial, a
    /// failure or the tightest allowed limit is noted here.
    fn rule_outcome(
        &mut self,
        e: &Enforced<'r, '_>,
        result: Option<&BucketResult>,
        allowed: bool,
    ) -> RuleOutcome {
        match result {
            None if allowed => {
                if let Some(tightest) = e.global {
                    self.note_allowed(e, tightest);
                }
                RuleOutcome::Allowed {
                    near_limit: e.global.is_some_and(|t| is_near_limit(e.bucket.limits, &t)),
                }
            }
            None => RuleOutcome::NotCharged,
            Some(BucketResult::Allowed {
                tightest,
                warned,
                wait_ns,
            }) if allowed => {
                let tightest = tighter_of(*tightest, e.global);
                self.note_allowed(e, tightest);
                if *warned != 0 {
                    self.note_warned(e.rendered.for_client(&e.client), *warned);
                    return RuleOutcome::Warned;
                }
                if *wait_ns > 0 {
                    return RuleOutcome::Delayed { wait_ns: *wait_ns };
                }
                RuleOutcome::Allowed {
                    near_limit: is_near_limit(e.bucket.limits, &tightest),
                }
            }
            // Charged, then refunded because another rule denied the request.
            Some(BucketResult::Allowed { .. } | BucketResult::Skipped) => RuleOutcome::NotCharged,
            Some(BucketResult::Denied { binding }) => {
                self.outcome = Outcome::Denied(e.limited(*binding));
                RuleOutcome::Denied
            }
            Some(BucketResult::FailedOpen(_)) => {
                self.failed_open += 1;
                RuleOutcome::FailedOpen
            }
            Some(BucketResult::FailedClosed(_)) => {
                self.outcome = Outcome::FailedClosed(e.rule);
                RuleOutcome::FailedClosed
            }
        }
    }

    /// Notes an allowed limit of `e`: near its limit or not, and the request's tightest
    /// among rules that send rate-limit headers (its text looked up only then).
    fn note_allowed(&mut self, e: &Enforced<'r, '_>, tightest: TierVerdict) {
        self.near_limit |= is_near_limit(e.bucket.limits, &tightest);
        if !e.rule.rate_limit_headers {
            return;
        }
        let replace = self
            .tightest
            .is_none_or(|t| tightest.verdict.remaining < t.tier.verdict.remaining);
        if replace {
            self.tightest = Some(e.limited(tightest));
        }
    }

    /// Notes the limits of a set rendered as `limits` that the request was admitted
    /// over (`over`: a bit per tier), for the client's warning.
    fn note_warned(&mut self, limits: &'r RenderedLimits, over: u8) {
        let tiers = (0..crate::rule::MAX_LIMITS_PER_RULE).filter(|t| over & (1 << t) != 0);
        self.warnings.extend(tiers.map(|t| limits.limit_name(t)));
    }

    fn absorb_counters(&mut self, c: &LimiterCounters) {
        self.counters.cas_conflicts += c.cas_conflicts;
        self.counters.shared_slots += c.shared_slots;
        self.counters.evictions += c.evictions;
        self.counters.corrupt_slots += c.corrupt_slots;
        self.counters.refund_failures += c.refund_failures;
        self.counters.remembered_denials += c.remembered_denials;
        self.counters.pool_failures += c.pool_failures;
    }

    /// Counts a global limit that could not be evaluated.
    fn note_global_failure(&mut self, failure: &LeaseFailure) {
        self.global_failures += 1;
        if *failure == LeaseFailure::TableFull {
            self.global_table_full += 1;
        }
    }
}

/// Step 6, for an allowed request that must wait: what it counts against in the delay
/// queue (each delaying rule whose own tokens were due later) and what its rules' request
/// limits took, to give back if it gives up first.
fn delayed(enforced: &[Enforced<'_, '_>], acquisition: &Acquisition) -> Delayed {
    let mut keys = SmallVec::new();
    let mut refunds = SmallVec::new();
    let mut results = acquisition.buckets.iter();
    for e in enforced.iter().filter(|e| e.has_proxy_limits()) {
        let Some(BucketResult::Allowed { wait_ns, .. }) = results.next() else {
            continue;
        };
        if let (Some(policy), 1..) = (e.rule.delay, *wait_ns) {
            keys.push(QueueKey {
                rule: policy.rule,
                client: e.bucket.fingerprint,
            });
        }
        let changes: SmallVec<_> = e
            .bucket
            .limits
            .iter()
            // A soft limit's buckets are left charged (which of its two were taken is
            // not kept): giving up then errs toward limiting.
            .filter(|l| !l.global && !l.counts.is_tokens() && l.soft.is_none())
            .map(|l| TokenChange {
                limit: *l,
                reserved: e.bucket.cost_of(l),
                used: 0,
            })
            .collect();
        if !changes.is_empty() {
            refunds.push(Refund {
                fingerprint: e.bucket.fingerprint,
                changes,
            });
        }
    }
    Delayed {
        wait_ns: acquisition.wait_ns,
        keys,
        refunds,
    }
}

/// Step 6, for an allowed request: what each enforce-mode rule with token limits
/// reserved, to be settled when the response ends. A rule whose proxy limits failed open
/// reserved nothing there; its global limits reserved what they spent.
fn reserve_tokens(
    decision: &mut Decision<'_>,
    enforced: &[Enforced<'_, '_>],
    acquisition: &Acquisition,
    spends: &GlobalSpends,
    path: &str,
) {
    let mut results = acquisition.buckets.iter();
    for e in enforced {
        let result = if e.has_proxy_limits() {
            results.next()
        } else {
            None
        };
        let proxy_charged = matches!(result, Some(BucketResult::Allowed { .. }));
        if let Some(reservation) = reservation(e.rule, &e.bucket, path, proxy_charged, spends) {
            decision.reservations.push(reservation);
        }
    }
}

/// What `rule`'s token limits took for `bucket`: its proxy token limits when
/// `proxy_charged`, its global ones as `spends` recorded them. `None` when the rule has no
/// token limits, or none of them took anything.
fn reservation(
    rule: &Rule,
    bucket: &BucketRequest<'_>,
    path: &str,
    proxy_charged: bool,
    spends: &GlobalSpends,
) -> Option<Reservation> {
    let budget = rule.tokens.as_ref()?;
    let mut limits = SmallVec::new();
    for limit in bucket.limits {
        let Counts::Tokens(measure) = limit.counts else {
            continue;
        };
        let global = if limit.global {
            let id = global_bucket(limit.identity, bucket.fingerprint);
            match spends.spent.iter().find(|(spent, _, _)| *spent == id) {
                Some((_, _, spent)) => Some((id, spent.spend)),
                None => continue,
            }
        } else if proxy_charged {
            None
        } else {
            continue;
        };
        limits.push(Reserved {
            limit: *limit,
            measure,
            tokens: bucket.cost_of(limit),
            global,
        });
    }
    (!limits.is_empty()).then(|| Reservation {
        rule_id: rule.id.clone(),
        fingerprint: bucket.fingerprint,
        format: budget.format_for(path),
        limits,
        shadow: rule.mode != Mode::Enforce,
        estimate: bucket.tokens,
    })
}

/// What a rule that never denies (shadow or warn mode) was over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    Nothing,
    /// These limits (a bit per tier): the one that would have denied, or the soft limits
    /// admitted within their margin.
    Tiers(u8),
    /// Its in-flight limit.
    Rule,
}

impl Over {
    fn tier(verdict: &TierVerdict) -> Over {
        Over::Tiers(1u8.checked_shl(verdict.tier as u32).unwrap_or(0))
    }
}

/// Charges one shadow- or warn-mode rule on its own: global limits, then proxy limits.
/// It never denies; the outcome says what it would have done, and which limits it was
/// over. What its token limits took is reserved like an enforce-mode rule's.
fn charge_shadow(
    rule: &Rule,
    bucket: &BucketRequest<'_>,
    path: &str,
    cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
    decision: &mut Decision<'_>,
) -> (RuleOutcome, Over) {
    let mut spends = GlobalSpends::default();
    let global_tightest = match spends.charge(bucket, &cx.global, cx.now, decision) {
        Ok(tightest) => tightest,
        Err(GlobalDenial::Denied(binding)) => {
            return (RuleOutcome::ShadowDenied, Over::tier(&binding));
        }
        Err(GlobalDenial::Failed) => return (RuleOutcome::FailedOpen, Over::Nothing),
    };
    if !has_proxy_limits(bucket.limits) {
        decision
            .reservations
            .extend(reservation(rule, bucket, path, false, &spends));
        let outcome = RuleOutcome::Allowed {
            near_limit: global_tightest.is_some_and(|t| is_near_limit(bucket.limits, &t)),
        };
        return (outcome, Over::Nothing);
    }
    let acquisition = cx
        .table
        .acquire(cx.store, cx.now, std::slice::from_ref(bucket));
    decision.absorb_counters(&acquisition.counters);
    match acquisition.buckets.first() {
        Some(BucketResult::Denied { binding }) => {
            spends.undo_all(&cx.global, cx.now);
            (RuleOutcome::ShadowDenied, Over::tier(binding))
        }
        Some(BucketResult::FailedClosed(_)) => {
            spends.undo_all(&cx.global, cx.now);
            (RuleOutcome::ShadowDenied, Over::Nothing)
        }
        Some(BucketResult::FailedOpen(_)) => {
            decision
                .reservations
                .extend(reservation(rule, bucket, path, false, &spends));
            (RuleOutcome::FailedOpen, Over::Nothing)
        }
        Some(BucketResult::Allowed {
            tightest, warned, ..
        }) => {
            decision
                .reservations
                .extend(reservation(rule, bucket, path, true, &spends));
            let outcome = RuleOutcome::Allowed {
                near_limit: is_near_limit(bucket.limits, &tighter_of(*tightest, global_tightest)),
            };
            let over = if *warned == 0 {
                Over::Nothing
            } else {
                Over::Tiers(*warned)
            };
            (outcome, over)
        }
        Some(BucketResult::Skipped) | None => (RuleOutcome::NotCharged, Over::Nothing),
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
    /// Step 2: every enforce-mode rule's global limits, spent from the lease table in
    /// rule order; each rule keeps its tightest global verdict. A denial, or a failure of
    /// a fail-closed rule, undoes every spend of the request and decides it; a failure of
    /// a fail-open rule lets that rule's global limits pass.
    fn charge_enforced<'r>(
        &mut self,
        enforced: &mut [Enforced<'r, '_>],
        cx: &DecisionContext<'_, impl SharedStore, impl SharedStore>,
        decision: &mut Decision<'r>,
    ) -> Result<(), Early<'r>> {
        for (at, e) in enforced.iter_mut().enumerate() {
            let early = match self.charge(&e.bucket, &cx.global, cx.now, decision) {
                Ok(tightest) => {
                    e.global = tightest;
                    continue;
                }
                Err(GlobalDenial::Failed) if e.bucket.on_failure == FailureMode::Open => {
                    decision.failed_open += 1;
                    continue;
                }
                Err(GlobalDenial::Denied(binding)) => Early {
                    at,
                    outcome: Outcome::Denied(e.limited(binding)),
                    reported: RuleOutcome::Denied,
                },
                Err(GlobalDenial::Failed) => Early {
                    at,
                    outcome: Outcome::FailedClosed(e.rule),
                    reported: RuleOutcome::FailedClosed,
                },
            };
            self.undo_all(&cx.global, cx.now);
            return Err(early);
        }
        Ok(())
    }

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
        for tier in bucket.limits.iter().enumerate().filter(|(_, l)| l.global) {
            match self.spend(bucket, tier, global, now, decision) {
                Ok(verdict) => {
                    if tightest.is_none_or(|t| verdict.verdict.remaining < t.verdict.remaining) {
                        tightest = Some(verdict);
                    }
                }
                Err(denial) => {
                    self.undo_from(first_of_rule, global, now);
                    return Err(denial);
                }
            }
        }
        Ok(tightest)
    }

    /// Spends `bucket`'s cost from its global limit `tier` and keeps the spend.
    fn spend(
        &mut self,
        bucket: &BucketRequest<'_>,
        (tier, limit): (usize, &Limit),
        global: &GlobalBuckets<'_, impl SharedStore>,
        now: Nanos,
        decision: &mut Decision<'_>,
    ) -> Result<TierVerdict, GlobalDenial> {
        let id = global_bucket(limit.identity, bucket.fingerprint);
        let cost = bucket.cost_of(limit);
        let spent = global
            .table
            .spend(global.store, id, &limit.gcra, cost, now, &global.view)
            .map_err(|failure| {
                decision.note_global_failure(&failure);
                GlobalDenial::Failed
            })?;
        let remaining = match spent.spend {
            Spend::Denied { retry_after_ns } => {
                return Err(GlobalDenial::Denied(TierVerdict {
                    tier,
                    verdict: Verdict {
                        allowed: false,
                        new_tat: Nanos::ZERO,
                        remaining: 0,
                        reset_ns: retry_after_ns,
                        retry_after_ns,
                    },
                }));
            }
            Spend::Fallback => {
                decision.global_fallback += 1;
                spent.remaining
            }
            Spend::Lease | Spend::NewBucket => spent.remaining,
        };
        decision.global_created += u32::from(spent.created);
        self.spent.push((id, cost, spent));
        Ok(TierVerdict {
            tier,
            verdict: Verdict {
                allowed: true,
                new_tat: Nanos::ZERO,
                remaining,
                // As this proxy sees it: the time its share takes to refill.
                reset_ns: limit
                    .burst
                    .saturating_sub(remaining)
                    .saturating_mul(limit.gcra.interval_ns()),
                retry_after_ns: 0,
            },
        })
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

/// Whether an allowed request left its tightest limit at least [`super::NEAR_LIMIT_PERCENT`] used.
fn is_near_limit(limits: &[Limit], tightest: &TierVerdict) -> bool {
    limits
        .get(tightest.tier)
        .is_some_and(|limit| super::is_near(limit, tightest.verdict.remaining))
}
