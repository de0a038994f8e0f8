//! An elastic rule (`elastic: {requests, period, burst}`): a client over its own limit is
//! still admitted, warned, while the rule's protected upstream has room: while the
//! requests the rule admitted in this Envoy, all its clients together, stay under the
//! ceiling.
//!
//! The signal is a bucket of its own, the rule's *pool*: a GCRA at the ceiling's rate and
//! burst, in one slot of the slot table that no client owns. Every request the rule
//! admits is charged to it, into a debt of at most one burst when it is empty, so the pool
//! measures the rule's total admitted traffic. A request over its own limit passes only
//! when the pool has room for it at that instant; its own bucket is not charged (as a
//! soft limit's warned request: `crate::limiter`). So:
//!
//! - a client is never held below its own limit, whatever the others do;
//! - over its limit, it passes only while the rule's admitted traffic is under the
//!   ceiling's `burst + rate × elapsed`; once the pool is spent, the very next request is
//!   strict again (the pool is read on every such request: no delay);
//! - the pool is read before the decision and charged after it, so workers deciding at
//!   the same instant may each take its last room: it is overdrawn by at most one
//!   request per other worker, and that debt is paid back before anyone passes again.

use crate::hash::elastic_pool_fingerprint;
use crate::rule::Limit;
use crate::spec::{LimitSpec, Mode, OnLimit, RuleSpec};
use crate::validation::Problems;

/// A validated elastic ceiling: the pool's bucket and the slot-table key it lives under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElasticPool {
    /// The ceiling as a bucket: its rate, burst and identity inside the pool's slot.
    pub limit: Limit,
    /// The pool's key in the slot table, distinct from every client's.
    pub fingerprint: u64,
}

/// Why an elastic rule has only request limits kept in this Envoy, as operators read it.
pub const ELASTIC_LIMITS_ONLY_PROXY_REQUESTS: &str = "an elastic rule (`elastic`) has only \
     `requests` limits with `scope: proxy`: its ceiling is measured in this Envoy's \
     admitted requests, a global limit spends leased tokens and a token limit's usage is \
     known only after its response";

impl ElasticPool {
    /// The pool of a rule with an `elastic` section, or `None` (with the problems recorded
    /// when the spec is wrong). `limits` are every limit of the rule and its overrides.
    pub(super) fn build<'a>(
        spec: &RuleSpec,
        id: &str,
        limits: impl Iterator<Item = &'a Limit>,
        problems: &mut Problems,
    ) -> Option<ElasticPool> {
        let elastic = spec.elastic?;
        let mut ok = true;
        let mut has_bucket = false;
        let mut only_proxy_requests = true;
        let mut has_soft = false;
        for limit in limits {
            has_bucket = true;
            only_proxy_requests &= !limit.global && !limit.counts.is_tokens();
            has_soft |= limit.soft.is_some();
        }
        let mut refuse = |why: &str| {
            problems.add("elastic", why);
            ok = false;
        };
        if !only_proxy_requests {
            refuse(ELASTIC_LIMITS_ONLY_PROXY_REQUESTS);
        }
        if !has_bucket {
            refuse(
                "an elastic rule needs a `requests` limit to pass: an in-flight limit \
                 (`concurrent`) has no rate to exceed",
            );
        }
        if has_soft {
            refuse(
                "an elastic rule has no soft limits (`soft_percent`): over its limit a \
                 client passes while the ceiling has room, or is refused",
            );
        }
        if spec.on_limit == OnLimit::Delay {
            refuse(
                "an elastic rule cannot delay (`on_limit: delay`): over its limit a request \
                 passes while the ceiling has room, and is refused otherwise",
            );
        }
        if spec.descriptor.is_some() {
            refuse(
                "a rule with a `descriptor` cannot be elastic: Envoy's rate limit service \
                 decides without this Envoy's traffic",
            );
        }
        if spec.mode == Mode::Warn {
            refuse("a warn-mode rule never refuses: it has no limit to be elastic over");
        }
        let ceiling = LimitSpec {
            requests: Some(elastic.requests),
            period: Some(elastic.period),
            burst: elastic.burst,
            tokens: None,
            count: None,
            scope: Default::default(),
            concurrent: None,
            soft_percent: None,
        };
        // The pool's identity is the ceiling's own, under a name no rule's limit has.
        let limit = Limit::build(&pool_name(id), &ceiling, "elastic", problems)?;
        ok.then_some(ElasticPool {
            limit,
            fingerprint: elastic_pool_fingerprint(id),
        })
    }
}

/// The name the pool's bucket identity is derived from: a rule id cannot hold a NUL.
fn pool_name(rule_id: &str) -> String {
    format!("{rule_id}\0elastic")
}
