//! A bucket set to charge and what charging it gives back: the words the slot table
//! (`limiter`), the denials a worker remembers (`denials`) and the per-request decision
//! (`ruleset`) share, so that none of them needs another for its types.

use crate::gcra::Verdict;
use crate::rule::Limit;
use crate::spec::FailureMode;
use crate::store::StoreError;
use crate::tokens::{TokenEstimate, cost_of};

/// One bucket set to charge: the limits of one rule for one client.
#[derive(Debug, Clone, Copy)]
pub struct BucketRequest<'a> {
    pub fingerprint: u64,
    pub limits: &'a [Limit],
    /// What each request limit charges.
    pub cost: u64,
    pub on_failure: FailureMode,
    /// What the token limits reserve (all zero for a rule without token limits).
    pub tokens: TokenEstimate,
    /// `None`: an over-limit request is refused. `Some(d)` (a rule with `on_limit:
    /// delay`): one whose tokens are due within `d` is admitted ahead and waits
    /// (`d` is zero while the delay queue is full: refused, but not remembered).
    pub max_delay_ns: Option<u64>,
    /// The rule is elastic and its pool had room when the request arrived: a request
    /// limit it is over passes, warned, instead of denying (`crate::rule::ElasticPool`).
    pub elastic_open: bool,
}

impl BucketRequest<'_> {
    /// What `limit` (one of [`Self::limits`]) charges this request.
    pub fn cost_of(&self, limit: &Limit) -> u64 {
        cost_of(limit, self.cost, &self.tokens)
    }

    /// The one cost every limit charges, when there is one: a set with token limits has
    /// several, so its denials are not remembered (a smaller estimate may fit).
    /// A set that may delay has none either: its next request may fit the queue; nor
    /// does one whose elastic pool is open: its next request may pass over the limit.
    pub fn uniform_cost(&self) -> Option<u64> {
        let fixed = self.max_delay_ns.is_none() && !self.elastic_open;
        (fixed && !self.limits.iter().any(|l| l.counts.is_tokens())).then_some(self.cost)
    }
}

/// A verdict together with the limit (tier) it is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierVerdict {
    pub tier: usize,
    pub verdict: Verdict,
}

/// Why a bucket could not be evaluated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimiterFailure {
    /// Other workers kept winning the compare-and-swap.
    Contention,
    /// The host refused a shared-data call.
    Store(StoreError),
}

/// What happened to one bucket set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketResult {
    /// Charged; `tightest` is the limit with the fewest tokens left. `wait_ns` is
    /// non-zero when the tokens were reserved ahead: the request must wait that long.
    /// `warned` has bit `1 << tier` set for each limit the request was admitted over: a
    /// soft limit, within its margin (`crate::rule::SoftMargin`), or a limit of an elastic
    /// rule whose pool had room (`crate::rule::ElasticPool`).
    Allowed {
        tightest: TierVerdict,
        wait_ns: u64,
        warned: u8,
    },
    /// Over the limit; `binding` is the limit that must refill longest.
    Denied { binding: TierVerdict },
    /// Could not be evaluated and the failure mode let the request through.
    FailedOpen(LimiterFailure),
    /// Could not be evaluated and the failure mode denies the request.
    FailedClosed(LimiterFailure),
    /// Not looked at because an earlier bucket already decided the request.
    Skipped,
}

/// Events worth a metric, counted while charging.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterCounters {
    pub cas_conflicts: u32,
    pub shared_slots: u32,
    pub evictions: u32,
    pub corrupt_slots: u32,
    pub refund_failures: u32,
    /// Denials repeated from memory, without reading the bucket.
    pub remembered_denials: u32,
    /// Elastic pools that could not be read (taken as closed) or charged.
    pub pool_failures: u32,
}

/// Bucket sets per request held without a heap allocation; more spill to the heap.
pub const INLINE_BUCKETS: usize = 4;
