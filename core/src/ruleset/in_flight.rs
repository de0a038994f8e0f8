//! The in-flight side of a decision: each matching rule with an in-flight limit takes a
//! place for the request (`crate::in_flight`); a request denied for any reason lets its
//! places go before the decision returns.

use super::{Decision, InFlightDenial, Outcome, RuleOutcome};
use crate::in_flight::{Admission, Hold, InFlightTable};
use crate::rule::Rule;
use crate::spec::FailureMode;
use crate::store::SharedStore;
use crate::time::Nanos;

/// What a decision needs to count requests in flight: the table, the shared data it
/// lives in, and the id of the request asking (`crate::in_flight::HolderIds`).
pub struct InFlightContext<'a> {
    pub table: &'a InFlightTable,
    pub store: &'a dyn SharedStore,
    pub holder: u64,
}

impl std::fmt::Debug for InFlightContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlightContext")
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// Whether a rule's in-flight limit let the request in.
pub(super) enum Place {
    /// The rule has no in-flight limit for this client (or none is counted).
    Unlimited,
    /// The request holds a place (kept in the decision).
    Held,
    /// The client has its limit in flight already.
    Full { max: u32 },
    /// The table could not be used; counted in the decision.
    Failed,
}

/// Takes a place for the request under `rule`'s in-flight limit for `client`, if any.
/// Rules without one cost nothing here (no lookup, no host call).
pub(super) fn take_place(
    rule: &Rule,
    fingerprint: u64,
    client: &str,
    in_flight: Option<&InFlightContext<'_>>,
    now: Nanos,
    decision: &mut Decision<'_>,
) -> Place {
    let Some(cx) = in_flight.filter(|_| rule.has_in_flight_limits()) else {
        return Place::Unlimited;
    };
    let Some(limit) = rule.in_flight_for(client) else {
        return Place::Unlimited;
    };
    match cx.table.acquire(
        cx.store,
        fingerprint,
        limit.max,
        cx.holder,
        now,
        &mut decision.in_flight,
    ) {
        Ok(Admission::Held(hold)) => {
            decision.holds.push(hold);
            Place::Held
        }
        Ok(Admission::Full) => Place::Full {
            max: limit.max.get(),
        },
        Err(_) => {
            decision.in_flight_failures += 1;
            Place::Failed
        }
    }
}

/// What an enforce-mode rule's in-flight limit decides: nothing (`None`), or the
/// request's outcome and what the rule reports.
pub(super) fn enforced_outcome<'r>(
    place: Place,
    rule: &'r Rule,
    on_failure: FailureMode,
    decision: &mut Decision<'r>,
) -> Option<(Outcome<'r>, RuleOutcome)> {
    match place {
        Place::Unlimited | Place::Held => None,
        Place::Full { max } => Some((
            Outcome::InFlightFull(InFlightDenial { rule, max }),
            RuleOutcome::InFlightRefused,
        )),
        Place::Failed if on_failure == FailureMode::Open => {
            decision.failed_open += 1;
            None
        }
        Place::Failed => Some((Outcome::FailedClosed(rule), RuleOutcome::FailedClosed)),
    }
}

/// Lets go of every place a denied request took. A place that cannot be let go now
/// (contention, a host error) lapses within `HOLD_TTL`: nobody refreshes it.
pub(super) fn let_go_if_denied(
    in_flight: Option<&InFlightContext<'_>>,
    now: Nanos,
    decision: &mut Decision<'_>,
) {
    let Some(cx) = in_flight else {
        return;
    };
    if decision.is_allowed() || decision.holds.is_empty() {
        return;
    }
    let holds: smallvec::SmallVec<[Hold; 2]> = std::mem::take(&mut decision.holds);
    for hold in &holds {
        if cx
            .table
            .release(cx.store, hold, now, &mut decision.in_flight)
            .is_err()
        {
            decision.in_flight_failures += 1;
        }
    }
}
