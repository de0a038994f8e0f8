//! A validated set of rules, and what deciding a request over it gives back.
//!
//! The decision itself, step by step, is in `decide.rs`: [`Ruleset::decide`] and
//! [`Ruleset::decide_observed`] over a [`DecisionContext`].

mod decide;
mod in_flight;

use std::collections::HashSet;

use crate::bucket::LimiterCounters;
use crate::in_flight::InFlightCounters;
use crate::in_flight::live::RequestHolds;
use crate::request::{RequestAttributes, RequestNeeds};
use crate::response::RenderedRule;
use crate::rule::Rule;
use crate::spec::{Mode, RuleSpec};
use crate::tokens::Reservation;
use crate::validation::{Problems, ValidationErrors};

pub use decide::{DecisionContext, GlobalBuckets};
pub use in_flight::InFlightContext;
// What a decision's limits are presented with; it kept this path when it moved there.
pub use crate::response::Limited;

/// Most rules in one ruleset.
pub const MAX_RULES: usize = 1_000;

/// A share of a limit used, in percent, from which an allowed request counts as
/// "near the limit".
pub const NEAR_LIMIT_PERCENT: u64 = 80;

/// Whether `remaining` tokens left in `limit`'s bucket leave it at least
/// [`NEAR_LIMIT_PERCENT`] used: the one definition of "near the limit", for the filter's
/// decisions and the rate limit service's alike.
pub fn is_near(limit: &crate::rule::Limit, remaining: u64) -> bool {
    let used = limit.burst.saturating_sub(remaining);
    used.saturating_mul(100) >= limit.burst.saturating_mul(NEAR_LIMIT_PERCENT)
}

/// Validated rules in evaluation order: higher `priority` first, then by name.
#[derive(Debug, Clone, Default)]
pub struct Ruleset {
    rules: Vec<Rule>,
    /// The fixed text of each rule's rate-limit fields and denial body, one per rule, in
    /// the same order.
    rendered: Vec<RenderedRule>,
    needs: RequestNeeds,
    /// Whether an enabled rule has token limits (then the host may read request bodies).
    has_token_rules: bool,
    /// Whether an enabled rule limits requests in flight (then requests take places).
    has_in_flight_rules: bool,
    /// Whether an enabled rule delays over-limit requests (`on_limit: delay`).
    has_delay_rules: bool,
}

/// What a request's body is needed for, before it is decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodyNeed {
    /// A matching rule reserves tokens from the body's `max_tokens` (or its size).
    pub read: bool,
    /// A matching rule adds `stream_options.include_usage` to streamed requests.
    pub include_usage: bool,
}

/// What the enabled rules of `rules` read from a request.
fn needs_of(rules: &[Rule]) -> RequestNeeds {
    let mut needs = RequestNeeds::default();
    for rule in rules.iter().filter(|r| r.enabled && r.descriptor.is_none()) {
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
            let has_token_rules = rules.iter().any(|r| r.enabled && r.tokens.is_some());
            let has_in_flight_rules = rules
                .iter()
                .any(|r| r.enabled && r.descriptor.is_none() && r.has_in_flight_limits());
            let has_delay_rules = rules
                .iter()
                .any(|r| r.enabled && r.descriptor.is_none() && r.delay.is_some());
            Ruleset {
                rules,
                rendered,
                needs,
                has_token_rules,
                has_in_flight_rules,
                has_delay_rules,
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

    /// Whether any enabled rule has token limits.
    pub fn has_token_rules(&self) -> bool {
        self.has_token_rules
    }

    /// Whether any enabled rule limits requests in flight: only then does a request need
    /// an [`InFlightContext`] ([`Ruleset::decide_in_flight`]).
    pub fn has_in_flight_rules(&self) -> bool {
        self.has_in_flight_rules
    }

    /// Whether any enabled rule delays over-limit requests: only then does a decision
    /// look at the worker's delay queue, and the worker tick fast enough to resume them
    /// on time.
    pub fn has_delay_rules(&self) -> bool {
        self.has_delay_rules
    }

    /// Whether `request` should be decided after its body: some enabled rule with token
    /// limits matches it. Only the matchers run (no bucket is read).
    pub fn body_need(&self, request: &impl RequestAttributes) -> BodyNeed {
        let mut need = BodyNeed::default();
        if !self.has_token_rules {
            return need;
        }
        for rule in &self.rules {
            let Some(budget) = rule.tokens.as_ref().filter(|_| rule.enabled) else {
                continue;
            };
            if rule.matcher.matches(request) {
                need.read = true;
                need.include_usage |= budget.include_usage;
            }
        }
        need
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

    /// Whether any enabled rule has a fleet-wide limit, its own or an override's: without
    /// one, nothing is synced with the coordinator but the proxy's presence.
    pub fn has_global_limits(&self) -> bool {
        self.rules.iter().filter(|r| r.enabled).any(|r| {
            r.limits
                .iter()
                .chain(r.overrides.values().flatten())
                .any(|l| l.global)
        })
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
    /// An enforce-mode in-flight limit is reached: the client has that many requests in
    /// flight already.
    InFlightFull(InFlightDenial<'r>),
}

/// An in-flight limit that denied a request: the rule, and how many requests of the
/// client it lets be in flight.
#[derive(Debug, Clone, Copy)]
pub struct InFlightDenial<'r> {
    pub rule: &'r Rule,
    pub max: u32,
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
    /// The limits (by their names in the rate-limit fields: `api`, `api/2`) an admitted
    /// request is over, and its client is told so (`x-sluice-warning`): enforce-mode soft
    /// limits within their margin, and warn-mode rules' limits.
    pub warnings: Vec<&'r str>,
    /// Enabled rules whose match held.
    pub matched_rules: u32,
    /// Matching rules skipped because the request carried no client key.
    pub keys_missing: u32,
    /// Matching rules whose client key was missing and whose fallback key was used.
    pub keys_fallback: u32,
    /// Enforce-mode rules run in shadow mode for this client by a percentage rollout.
    pub rollout_shadowed: u32,
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
    /// The tokens reserved by rules with token limits, to settle when the response ends
    /// (`crate::tokens`); empty for a denied request.
    pub reservations: Vec<Reservation>,
    /// The places an allowed request holds under in-flight limits, to let go when its
    /// stream ends; empty for a denied request (its places were let go at once).
    pub holds: RequestHolds,
    /// What the in-flight table's writes found (lapsed holds, conflicts).
    pub in_flight: InFlightCounters,
    /// In-flight limits that could not be evaluated (the rule's failure mode decided).
    pub in_flight_failures: u32,
    /// Set for an allowed request whose tokens were reserved ahead (`on_limit: delay`):
    /// it must wait before it passes.
    pub delayed: Option<crate::delay::Delayed>,
}

impl<'r> Decision<'r> {
    pub fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed)
    }
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
    /// Admitted to wait this long for its tokens (`on_limit: delay`) before it passes.
    Delayed { wait_ns: u64 },
    /// Refused: the client had its in-flight limit's number of requests open already.
    InFlightRefused,
    /// Admitted over a limit: within a soft limit's margin (`soft_percent`), or over a
    /// warn-mode rule's limit. Counted apart from allowed and throttled requests.
    Warned,
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
    /// `client` is the rule's client key for this request ("" when missing); `tokens`
    /// what the request asked the rule's token limits for (its total estimate; 0 for a
    /// rule without token limits).
    fn record(&mut self, rule: &Rule, outcome: RuleOutcome, client: &str, tokens: u64);
}

/// Ignores everything.
impl DecisionSink for () {
    fn record(&mut self, _: &Rule, _: RuleOutcome, _: &str, _: u64) {}
}
