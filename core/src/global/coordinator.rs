//! The coordinator's side of one global bucket.
//!
//! A bucket is a GCRA theoretical arrival time (`tat`, on the coordinator's clock) plus a
//! decayed sum of the tokens the fleet attempted (`demand`). Each proxy's sync settles its
//! usage of the bucket in one step ([`settle`]): what it admitted without a lease is
//! debited, what it gave back is refunded, its attempts feed the demand, and a grant is
//! taken from the bucket at once. Taking grants up front (*pre-debit*) is what makes the
//! fleet-wide bound hold: a token can sit in one proxy's lease or in the bucket, never in
//! both, so leases can never add up to more than `burst + rate × elapsed`.

use serde::{Deserialize, Serialize};

use super::MIN_SHARE_OF_EVEN;
pub use super::state::{BucketState, STATE_FORMAT, STATE_LEN};
use crate::gcra::Gcra;
use crate::time::{NANOS_PER_MILLI, Nanos};

/// One proxy's usage of one bucket since its previous successful sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens requested, admitted or not: the demand signal.
    pub attempts: u64,
    /// Tokens admitted without a lease (new-bucket allowance or fallback share): spending
    /// the coordinator has not seen yet.
    pub unleased: u64,
    /// Lease tokens the proxy zeroed and gives back.
    pub returned: u64,
    /// Tokens the proxy would like to hold after this sync.
    pub want: u64,
    /// How far into the time the usage covers this proxy first used the bucket (a bucket
    /// new to it), in ns; `0` when it used it from the start. The coordinator dates a new
    /// bucket from its first use: dated from the first sync that reported it instead, the
    /// refill between the client's first request and that sync (up to 150 ms, 750 tokens
    /// at 5,000/s) was lost to the fleet.
    pub first_use_ns: u64,
    /// How long until the fleet's bucket is full, as this proxy last heard it from the
    /// coordinator and counted down to the sync (ns); `0` when it knows nothing or did
    /// not send it. Sent only while the proxy is on fallback shares (its last sync failed,
    /// or the coordinator warms up): a coordinator that lost its state rebuilds the
    /// bucket's level from it ([`settle`], step 0) instead of starting the bucket full.
    pub known_full_in_ns: u64,
}

impl Usage {
    /// Folds a later usage into one that could not be sent (or into an empty one): counts
    /// add up, the wish is the latest one, and the first use is the earliest. Both cover
    /// time from the same last answered sync, so their first uses compare directly; a
    /// usage without attempts says nothing of its first use.
    pub fn merge(&mut self, later: &Usage) {
        self.first_use_ns = if self.attempts == 0 {
            later.first_use_ns
        } else if later.attempts == 0 {
            self.first_use_ns
        } else {
            self.first_use_ns.min(later.first_use_ns)
        };
        self.attempts = self.attempts.saturating_add(later.attempts);
        self.unleased = self.unleased.saturating_add(later.unleased);
        self.returned = self.returned.saturating_add(later.returned);
        self.want = later.want;
        // Counted down to the later collection: the earlier figure is older.
        self.known_full_in_ns = later.known_full_in_ns;
    }

    /// When, at `now`, the spending this usage reports began: its window's start, or the
    /// proxy's first use of the bucket within it, leaving the window at least a
    /// millisecond (a first use reported later than the window's end is read as its
    /// end).
    fn used_since(&self, covers_ns: u64, now: u64) -> u64 {
        let active_ns = covers_ns
            .saturating_sub(self.first_use_ns)
            .max(covers_ns.min(NANOS_PER_MILLI));
        now.saturating_sub(active_ns)
    }
}

/// What one proxy gets back for one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Grant {
    /// Tokens added to the proxy's lease, already taken from the bucket.
    pub granted: u64,
    /// The proxy's share of the fleet's recent demand for this bucket, in parts per
    /// million: what it may admit on its own while the coordinator is out of reach.
    pub share_ppm: u32,
    /// How long until the bucket is full again if nobody takes more. A proxy may forget
    /// the bucket (and later spend a new-bucket allowance on it) only after this.
    pub full_in_ns: u64,
    /// The bucket is new to the fleet: the proxy keeps spending its even share of it
    /// until an answer says otherwise (absent from coordinators that predate it: false).
    #[serde(default)]
    pub young: bool,
}

/// Parts per million: the unit of shares on the wire and in shared data.
pub const PPM: u32 = 1_000_000;

/// The coordinator's settings that every settlement uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// The syncing proxy's interval in force: its own gap between syncs.
    pub sync_interval_ns: u64,
    /// The interval the proxies' configuration asks for, before any stretch: every
    /// proxy's demand is read against it, whatever its own stretch, so that all the
    /// settlements of a bucket decay and weigh its demand alike.
    pub demand_interval_ns: u64,
    /// Time constant of the decayed demand ([`super::DEMAND_TAU_INTERVALS`] demand
    /// intervals).
    pub demand_tau_ns: u64,
    /// While true no tokens are granted: leases granted before a restart that lost the
    /// coordinator's state may still be spent, so the buckets are not known to be full.
    pub warming_up: bool,
    /// Proxies in the fleet now (at least 1).
    pub fleet_size: u32,
}

/// The fixed part of how long a bucket counts as young after the coordinator first saw it
/// ([`Settings::young_ns`] adds one sync interval): long enough for every proxy that saw
/// the bucket at about the same time to report it (a new bucket makes a proxy sync within
/// one or two 100 ms ticks). While young, the other proxies may still be spending their
/// even shares without having reported them, so nothing is granted and every proxy keeps
/// to its even share. Reports later than this are still debited (into a debt of at most
/// one burst and one token per proxy).
pub const YOUNG_NS: u64 = 300_000_000;

impl Settings {
    /// How long a bucket counts as young: [`YOUNG_NS`] plus one sync interval, so that a
    /// proxy whose sync was already on its way (or late: a busy main thread) when its first
    /// request for the bucket came still reports it in time. The proxies' even shares
    /// admit `burst + rate × elapsed` together, so a young bucket loses only the part of
    /// the refill a skewed demand leaves in the shares of quieter proxies.
    pub fn young_ns(&self) -> u64 {
        YOUNG_NS.saturating_add(self.sync_interval_ns)
    }

    /// The defaults for a sync interval not stretched (see the constants in [`super`]).
    pub fn for_interval(sync_interval: Nanos) -> Self {
        Self::for_intervals(sync_interval, sync_interval)
    }

    /// The defaults for a proxy whose interval in force is `in_force`, stretched from the
    /// `configured` one. Demand is read against the configured interval: read against
    /// its own stretched one (a time constant four times as long, and half of its
    /// interval as the traffic the others have not reported yet), a proxy stretched to
    /// 1 s among proxies at 250 ms was told 0.56 and 0.16 of the demand for 0.3 and 0.1
    /// (the fleet simulation's remote region), and its fallback admitted that much.
    pub fn for_intervals(in_force: Nanos, configured: Nanos) -> Self {
        let demand_interval_ns = configured.get().min(in_force.get());
        Self {
            sync_interval_ns: in_force.get(),
            demand_interval_ns,
            demand_tau_ns: (demand_interval_ns as f64 * super::DEMAND_TAU_INTERVALS) as u64,
            warming_up: false,
            fleet_size: 1,
        }
    }
}

/// Settles one proxy's usage of one bucket at `now` and returns its grant.
///
/// `limit` is the limit the proxy enforces for this bucket (it sends it with the usage, so
/// the coordinator needs no copy of the rules or overrides); `covers` is how long the
/// usage covers (the time since the proxy's last successful sync).
pub fn settle(
    state: &mut BucketState,
    limit: &Gcra,
    usage: &Usage,
    covers: Nanos,
    now: Nanos,
    settings: &Settings,
) -> Grant {
    // 0. Rebuilt: while warming up (the coordinator lost its state), the bucket is at
    //    least as empty as any proxy last heard. Every grant before the loss was taken
    //    from the bucket at once, so the level the latest answer carried counts every
    //    lease still out; what proxies spent on fallback since is debited in step 2.
    //    (Started full instead, the fleet admitted one burst more over the two seconds
    //    after the warm-up.)
    let rebuilt = settings.warming_up && usage.known_full_in_ns > 0;
    if rebuilt {
        let known_ns = usage
            .known_full_in_ns
            .min(limit.capacity_ns().saturating_mul(2));
        state.tat = state.tat.max(now.get().saturating_add(known_ns));
    }
    // 1. Gave back: never beyond full.
    state.tat = limit
        .refund(Nanos::new(state.tat), now, usage.returned)
        .get();
    // The rest is arithmetic on the state's stored words (the Redis layout), in ns.
    let now = now.get();
    let used_since = usage.used_since(covers.get(), now);
    if state.demand_at == 0 {
        // First seen: the bucket's life, and its recorded demand, begin with the first use
        // this usage reports.
        state.born_at = used_since;
        state.demand_at = now;
        state.first_seen = now;
    }
    if rebuilt {
        // A proxy knew its level before the loss: the bucket is not new to the fleet, and
        // its proxies spend fallback shares, not even ones, so it is never young.
        state.first_seen = 0;
    }
    // A bucket new to the fleet is *young* for a while: the other proxies that saw it may
    // still be spending their even shares without having reported them.
    let young = now < state.first_seen.saturating_add(settings.young_ns());
    if young && usage.attempts > 0 {
        // Another proxy may have used it before the first one that reported it.
        state.born_at = state.born_at.min(used_since);
    }
    // 2. Spent without a lease: debited, into a debt of at most one burst and one token
    //    per proxy ([`deepest_tat`]). A debt is paid back by the refill before anything
    //    more is granted, so spending the coordinator had not seen (a new bucket's even
    //    shares, fallback during an outage) is made up for; capping it keeps a long
    //    outage from starving the fleet afterwards.
    //    The spending happened over the time the sync reports on, while the bucket
    //    refilled: it is booked from when that spending began (the window's start, or the
    //    proxy's first use of the bucket within it), not all at once now, or a proxy back
    //    from a long outage would put the fleet into debt for spending that its fallback
    //    share already kept to the rate. A young bucket did not exist before its first use
    //    anywhere (unless the coordinator lost its state): its spending is its proxies'
    //    even shares, booked from the earliest first use reported (a new bucket is full
    //    then, and the refill since is the fleet's).
    let window_start = if young && !settings.warming_up {
        state.born_at
    } else {
        used_since
    };
    let start = state.tat.max(window_start);
    let debit = usage.unleased.saturating_mul(limit.interval_ns());
    state.tat = start
        .saturating_add(debit)
        .min(deepest_tat(limit, now, settings));

    // 3. Demand: decay to now, add this proxy's attempts.
    let active_ns = now - used_since;
    let (share_ppm, fleet_rate) = record_demand(state, usage.attempts, active_ns, now, settings);

    // 4. Grant what the bucket holds now, up to the wish, and take it at once. Nothing
    //    while warming up, nor while the bucket is young: the proxies keep to their even
    //    shares until every one of them has reported its spending, so no grant can hand
    //    out a token an even share already spent. (Young grants were once limited to the
    //    proxy's even part of the bucket less the whole backlog; the backlog held the
    //    other proxies' grants too, so the second and third of three proxies at half the
    //    limit got nothing, and were refused.) Each even share holds at least one whole
    //    token, so a hot client's young bucket does not sit full losing its refill even
    //    where the fleet is larger than its burst: its proxies' first tokens are debited (step 2, into the
    //    deeper debt [`deepest_tat`] allows). (Started with `burst / N` of a token
    //    instead, the bench's sparse tail, 2.4 requests a second over three of 1,000
    //    proxies under 100/s, was refused 15,236 of 38,000 requests.)
    let granted = if settings.warming_up || young {
        0
    } else {
        let capacity = limit.capacity_ns();
        let backlog = state.tat.max(now) - now;
        let available_ns = capacity - backlog.min(capacity);
        // Shares follow demand: a proxy may take its share of one interval's refill, and
        //    whatever the bucket holds beyond that (a burst nobody needs yet). Without
        //    this cap each proxy takes all that refilled since the previous sync of any
        //    proxy, so what it gets depends on the phase of its syncs, not on its traffic
        //    (in the fleet simulation at ten times the limit, a 70/20/10 demand split
        //    admitted 20/80/0). "One interval's refill" is at most the whole bucket: a
        //    bucket smaller than that fills between one proxy's syncs, and what lies
        //    beyond is then a burst for whoever syncs first. (Capped at half the bucket,
        //    a 5,000/s limit with a half-second burst went mostly to whoever synced
        //    first: 38/57/5 admitted for a 70/20/10 demand split; at the whole bucket
        //    66/24/10, with the same accuracy.) A proxy that syncs sooner than the interval
        //    (its lease ran out, so it hurries: `schedule.rs`) is entitled to its share of
        //    the refill over its own gap only, or syncing often would be a way to take
        //    more than its share (a 70/20/10 demand split admitted 44/32/24 at 500/s).
        //    Below the limit (the fleet's demand under its rate), its share is taken as at
        //    least a tenth of an even split, as the fallback takes it
        //    (`MIN_SHARE_OF_EVEN`): a proxy whose window held no attempt (a quiet one of
        //    1,000, syncing every 100 ms) is still entitled to a token of the refill,
        //    rather than refused far below the limit while the busier proxies' leases
        //    hold the rest of the bucket. Where the limit binds the floor would spread the
        //    refill over proxies that do not spend it (at 1,000 proxies, 0.987 of the
        //    bound instead of 0.994), so it is not applied there.
        let entitled = if settings.fleet_size <= 1 {
            u64::MAX
        } else {
            let reserve_ns = settings.sync_interval_ns.min(covers.get()).min(capacity);
            let binding = fleet_rate * limit.interval_ns() as f64 >= 1.0;
            let least = if binding { 0.0 } else { MIN_SHARE_OF_EVEN };
            let least_ppm = f64::from(PPM) * least / f64::from(settings.fleet_size);
            let entitled_ppm = share_ppm.max(least_ppm as u32);
            let own_part_ns =
                (u128::from(reserve_ns) * u128::from(entitled_ppm) / u128::from(PPM)) as u64;
            own_part_ns
                .saturating_add(available_ns.saturating_sub(reserve_ns))
                .div_ceil(limit.interval_ns())
        };
        usage
            .want
            .min(available_ns / limit.interval_ns())
            .min(entitled)
    };
    // A TAT in the past (the bucket full) is kept as it is, not moved up to now: the next
    //    proxy's unleased spending is booked from the start of its own window (step 2),
    //    and the refill in that window belongs to it.
    if granted > 0 {
        state.tat = state.tat.max(now) + granted * limit.interval_ns();
    }

    // 5. Answer. Shares are withheld (0, unknown) while warming up, when the coordinator
    //    has heard from only some proxies since it started, and while the bucket is young,
    //    when the other proxies may not have reported yet: computed now they would favour
    //    whoever synced first (the first of three even proxies was told it had all the
    //    demand). A proxy keeps to an even split, or to the share it knew.
    let withheld = settings.warming_up || young;
    Grant {
        granted,
        share_ppm: if withheld { 0 } else { share_ppm },
        full_in_ns: state.tat.max(now) - now,
        young: young && !settings.warming_up,
    }
}

/// The deepest the bucket may be in debt at `now` (its `tat` at most this): one burst,
/// plus one token per proxy of the fleet. Each proxy new to a bucket admits at least one
/// whole token of its even share before the coordinator has heard of the bucket, even
/// where that share is a fraction of a token (a burst smaller than the fleet): together up
/// to `N` tokens beyond `burst + rate × elapsed` (1,000 proxies new to a hot client under a
/// limit of 100/s admitted 1,000 tokens at once). Debited whole, that is paid back from
/// the refill within `N / rate` (capped at one burst, the fleet admitted 1.70 of the
/// bound over 10 s); the burst beyond it keeps an outage's fallback spending from starving
/// the fleet for long after.
fn deepest_tat(limit: &Gcra, now: u64, settings: &Settings) -> u64 {
    let whole_tokens_ns = u64::from(settings.fleet_size.max(1)).saturating_mul(limit.interval_ns());
    now.saturating_add(limit.capacity_ns().saturating_mul(2))
        .saturating_add(whole_tokens_ns)
}

/// Decays the bucket's demand to `now`, adds `attempts`, and returns this proxy's share of
/// the fleet's demand rate in parts per million, and that rate (tokens a nanosecond).
fn record_demand(
    state: &mut BucketState,
    attempts: u64,
    covers_ns: u64,
    now: u64,
    settings: &Settings,
) -> (u32, f64) {
    let tau = settings.demand_tau_ns.max(1) as f64;
    let interval = settings.demand_interval_ns.max(1) as f64;
    // Not capped: attempts spread over a long window (after an outage) weigh `τ/c` each,
    // so they add the window's rate once, not a burst of it.
    let covers = covers_ns.max(1) as f64;
    let elapsed = now.saturating_sub(state.demand_at) as f64;
    // The attempts arrived spread over the time they cover, not all at once: decayed as
    // such, they weigh `τ/c × (1 − e^(−c/τ))` each. Adding them whole would make the sum
    // peak right after each proxy's own sync and bias every share low.
    let spread = tau / covers * (1.0 - (-covers / tau).exp());
    state.demand = state.demand * (-elapsed / tau).exp() + attempts as f64 * spread;
    state.demand_at = now.max(state.demand_at);
    // A steady fleet rate R makes the sum `w × R` with `w = τ × (1 − e^(−age/τ))` (just
    // `τ` once the bucket is a few τ old), except that the other proxies have not reported
    // their traffic since their own last syncs: on average half an interval of it (the
    // configured one: most proxies are not stretched), with sync phases spread over it. So `sum ≈ w × R − (R − own) × T/2`, solved
    // for R. (Without the correction a proxy syncing just after the busiest one would see
    // its share over-estimated by a tenth or more.)
    let age = now.saturating_sub(state.born_at) as f64;
    let weight = (tau * (1.0 - (-age / tau).exp())).max(interval);
    let own_rate = attempts as f64 / covers;
    let fleet_rate =
        ((state.demand - own_rate * interval / 2.0) / (weight - interval / 2.0)).max(own_rate);
    if fleet_rate <= 0.0 {
        return (0, 0.0);
    }
    let share = (own_rate / fleet_rate).clamp(0.0, 1.0);
    ((share * f64::from(PPM)).round() as u32, fleet_rate)
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::global::test_support::{T, limit};
    use crate::time::NANOS_PER_SECOND as S;

    fn want(want: u64) -> Usage {
        Usage {
            want,
            ..Usage::default()
        }
    }

    /// A full bucket the coordinator has known for long: no longer young.
    fn known() -> BucketState {
        BucketState {
            demand_at: 1,
            born_at: 1,
            first_seen: 1,
            ..BucketState::default()
        }
    }

    /// Settles `usage` of `l` at `now` (ns), covering one interval, with the default
    /// settings for one proxy.
    fn settle_at(state: &mut BucketState, l: &Gcra, usage: &Usage, now: u64) -> Grant {
        let settings = Settings::for_interval(Nanos::new(T));
        settle(state, l, usage, Nanos::new(T), Nanos::new(now), &settings)
    }

    #[test]
    fn a_bucket_grants_up_to_its_burst_and_takes_the_grant_at_once() {
        let l = limit(10, 20);
        let mut state = known();
        let now = 100 * S;
        assert_eq!(settle_at(&mut state, &l, &want(15), now).granted, 15);
        assert_eq!(
            settle_at(&mut state, &l, &want(15), now).granted,
            5,
            "only the burst's rest is left"
        );
        let third = settle_at(&mut state, &l, &want(15), now);
        assert_eq!(third.granted, 0);
        assert_eq!(third.full_in_ns, 2 * S, "20 tokens at 10/s refill in 2 s");
        let later = settle_at(&mut state, &l, &want(15), now + S / 2);
        assert_eq!(
            later.granted, 5,
            "half a second later five tokens have refilled"
        );
    }

    #[test]
    fn spending_without_a_lease_is_debited_into_at_most_one_burst_of_debt() {
        let l = limit(10, 20);
        let now = 100 * S;
        let unleased = |unleased| Usage {
            unleased,
            want: 100,
            ..Usage::default()
        };
        let mut state = BucketState::default();
        let first_use = Usage {
            attempts: 8,
            first_use_ns: T - 100_000_000,
            ..unleased(8)
        };
        let g = settle_at(&mut state, &l, &first_use, now);
        assert_eq!(
            (g.granted, g.young, g.full_in_ns),
            (0, true, 700_000_000),
            "a new bucket: its proxies keep to their even shares, and the 8 spent are \
             booked from its first use, 100 ms before the sync (one token refilled since)"
        );
        let young_ns = Settings::for_interval(Nanos::new(T)).young_ns();
        let g = settle_at(&mut state, &l, &want(100), now + young_ns);
        assert_eq!(
            (g.granted, g.young),
            (20, false),
            "no longer young: the bucket refilled meanwhile"
        );

        // A fallback period that spent far more than the bucket holds leaves one burst of
        // debt and a token per proxy (one here), not more: it is paid back in 2.1 s (21
        // tokens at 10/s), then the fleet gets the refill again.
        let mut state = known();
        let g = settle_at(&mut state, &l, &unleased(1_000), now);
        assert_eq!(g.full_in_ns, 4 * S + l.interval_ns());
        let paying = settle_at(&mut state, &l, &want(100), now + S);
        assert_eq!(paying.granted, 0, "still paying back");
        let paid = settle_at(&mut state, &l, &want(100), now + 2 * S + S / 2);
        assert_eq!(paid.granted, 4);
    }

    #[test]
    fn a_young_bucket_grants_nothing_until_every_even_share_is_reported() {
        // Three proxies each spent their even share (20 / 3 = 6) of a new bucket before
        // syncing. None is granted anything while the bucket is young: the others' even
        // shares may be spent and not yet reported.
        let l = limit(10, 20);
        let now = 100 * S;
        let mut settings = Settings::for_interval(Nanos::new(T));
        settings.fleet_size = 3;
        let mut state = BucketState::default();
        let spent = Usage {
            attempts: 20,
            unleased: 6,
            want: 100,
            returned: 0,
            // First used 100 ms before they synced.
            first_use_ns: T - 100_000_000,
            known_full_in_ns: 0,
        };
        for _ in 0..3 {
            let g = settle(
                &mut state,
                &l,
                &spent,
                Nanos::new(T),
                Nanos::new(now),
                &settings,
            );
            assert_eq!((g.granted, g.share_ppm, g.young), (0, 0, true));
        }
        // 18 of 20 spent unleased. A second after the first use the 2 left and the refill
        // (10) are there: 30 in all, exactly `burst + rate × elapsed`.
        let later = now - 100_000_000 + S;
        let asking = Usage {
            attempts: 20,
            want: 100,
            ..Usage::default()
        };
        let grants: Vec<Grant> = (0..3)
            .map(|_| {
                let g = settle(
                    &mut state,
                    &l,
                    &asking,
                    Nanos::new(S),
                    Nanos::new(later),
                    &settings,
                );
                assert!(!g.young && g.share_ppm > 0, "{g:?}");
                g
            })
            .collect();
        let granted: u64 = grants.iter().map(|g| g.granted).sum();
        let left_in_bucket = grants
            .last()
            .map_or(0, |g| 20 - g.full_in_ns / l.interval_ns());
        assert_eq!(
            (granted + left_in_bucket, left_in_bucket <= 1),
            (12, true),
            "{grants:?}"
        );
    }

    /// Settles `usage` of `l` at `now`, covering one interval, in a fleet of `fleet_size`.
    fn settle_in_fleet(
        state: &mut BucketState,
        l: &Gcra,
        usage: &Usage,
        now: u64,
        fleet_size: u32,
    ) -> Grant {
        let settings = Settings {
            fleet_size,
            ..Settings::for_interval(Nanos::new(T))
        };
        settle(state, l, usage, Nanos::new(T), Nanos::new(now), &settings)
    }

    #[test]
    fn a_fleet_larger_than_the_burst_pays_back_its_first_whole_tokens() {
        // 1,000 proxies new to a client (100/s, burst 100) each admitted one whole token
        // of their even share (a tenth of a token) in the interval (half a second) before
        // their first sync: 1,000 tokens where `burst + rate × elapsed` is 150. All are
        // debited (850 tokens beyond empty, within one burst and a token per proxy), so
        // the bucket grants nothing until the refill has paid them back, 8.5 s on.
        let l = limit(100, 100);
        let now = 100 * S;
        let fresh = Usage {
            attempts: 1,
            unleased: 1,
            want: 10,
            ..Usage::default()
        };
        let mut state = BucketState::default();
        for _ in 0..1_000 {
            let g = settle_in_fleet(&mut state, &l, &fresh, now, 1_000);
            assert_eq!((g.granted, g.young), (0, true));
        }
        let paid_back = now + 8 * S + S / 2;
        assert_eq!(state.tat, paid_back + l.capacity_ns());
        let g = settle_in_fleet(
            &mut state,
            &l,
            &want(10),
            paid_back - l.interval_ns(),
            1_000,
        );
        assert_eq!((g.granted, g.young), (0, false), "still paying back");
        let g = settle_in_fleet(
            &mut state,
            &l,
            &want(10),
            paid_back + l.capacity_ns(),
            1_000,
        );
        assert_eq!(g.granted, 10, "paid back, and full again");

        // The bound, both sides: 1,100 tokens beyond empty at most for 1,000 proxies:
        // below and at it taken whole, beyond it forgiven.
        let deepest = now + 2 * l.capacity_ns() + 1_000 * l.interval_ns();
        for (spent, tat) in [
            (1_249, deepest - l.interval_ns()),
            (1_250, deepest),
            (1_251, deepest),
        ] {
            let mut state = BucketState::default();
            let g = settle_in_fleet(
                &mut state,
                &l,
                &Usage {
                    unleased: spent,
                    ..fresh
                },
                now,
                1_000,
            );
            assert_eq!((state.tat, g.full_in_ns), (tat, tat - now), "{spent}");
        }
    }

    #[test]
    fn below_the_limit_a_quiet_proxy_is_entitled_to_a_token_of_the_refill() {
        // 1,000 proxies; the bucket (100/s, burst 100) holds 10 tokens, less than one
        // interval's refill (50), the rest leased to the busier proxies. A proxy whose
        // window held no attempt (share 0) asks for 5.
        let l = limit(100, 100);
        let now = 100 * S;
        let quiet = Usage {
            want: 5,
            ..Usage::default()
        };
        let drained = |demand: f64| BucketState {
            tat: now + 90 * l.interval_ns(),
            demand,
            demand_at: now,
            ..known()
        };
        // The fleet asks 10/s of its 100/s: a tenth of an even split of the refill,
        // rounded up to a whole token.
        let g = settle_in_fleet(&mut drained(20.0), &l, &quiet, now, 1_000);
        assert_eq!(g.granted, 1, "below the limit");
        // The fleet asks 500/s: the refill goes by demand, and this proxy had none.
        let g = settle_in_fleet(&mut drained(1_000.0), &l, &quiet, now, 1_000);
        assert_eq!(g.granted, 0, "where the limit binds");
    }

    #[test]
    fn a_stretched_proxys_demand_is_read_against_the_configured_interval() {
        let second = Nanos::new(S);
        let stretched = Settings::for_intervals(second, Nanos::new(S / 4));
        assert_eq!(
            (
                stretched.sync_interval_ns,
                stretched.demand_interval_ns,
                stretched.demand_tau_ns
            ),
            (S, S / 4, S),
            "its own gap stays its interval in force"
        );
        assert_eq!(
            Settings::for_intervals(second, Nanos::new(4 * S)),
            Settings::for_interval(second),
            "a configured interval never longer than the one in force"
        );
    }

    #[test]
    fn returned_tokens_go_back_but_never_beyond_full() {
        let l = limit(10, 20);
        let now = 100 * S;
        let settings = Settings::for_interval(Nanos::new(T));
        let settle_now = |state: &mut BucketState, usage: &Usage| {
            settle(state, &l, usage, Nanos::new(T), Nanos::new(now), &settings).granted
        };
        let returning = |returned| Usage {
            returned,
            ..Usage::default()
        };
        let mut state = known();
        assert_eq!(settle_now(&mut state, &want(20)), 20);
        settle_now(&mut state, &returning(15));
        assert_eq!(settle_now(&mut state, &want(100)), 15);

        let mut full = known();
        settle_now(&mut full, &returning(50));
        assert_eq!(settle_now(&mut full, &want(100)), 20, "never beyond full");
    }

    #[test]
    fn warming_up_grants_nothing_but_still_learns_demand_and_debits() {
        let l = limit(10, 20);
        let now = 100 * S;
        let mut settings = Settings::for_interval(Nanos::new(T));
        settings.warming_up = true;
        let mut state = BucketState::default();
        let g = settle(
            &mut state,
            &l,
            &Usage {
                attempts: 5,
                unleased: 5,
                want: 10,
                returned: 0,
                first_use_ns: 0,
                known_full_in_ns: 0,
            },
            Nanos::new(T),
            Nanos::new(now),
            &settings,
        );
        assert_eq!(g.granted, 0);
        assert_eq!(
            g.share_ppm, 0,
            "no share yet: only some proxies have been heard from since the start"
        );
        settings.warming_up = false;
        let more = Usage {
            attempts: 5,
            want: 100,
            ..Usage::default()
        };
        let g = settle(
            &mut state,
            &l,
            &more,
            Nanos::new(T),
            Nanos::new(now + settings.young_ns()),
            &settings,
        );
        assert!(g.share_ppm > 0, "shares again once warmed up");
        assert_eq!(
            g.granted, 20,
            "the 5 spent over the half second refilled meanwhile"
        );
    }

    #[test]
    fn a_warming_coordinator_rebuilds_a_bucket_from_the_emptiest_level_reported() {
        // The coordinator lost its state. The fleet's bucket (10/s, burst 20) was 1.5 s
        // from full at one proxy's last answer, 0.5 s at another's (an older answer).
        let l = limit(10, 20);
        let now = 100 * S;
        let mut settings = Settings::for_interval(Nanos::new(T));
        settings.warming_up = true;
        let knowing = |known_full_in_ns| Usage {
            attempts: 5,
            want: 10,
            known_full_in_ns,
            ..Usage::default()
        };
        let settle_now = |state: &mut BucketState, usage: &Usage, settings: &Settings| {
            settle(state, &l, usage, Nanos::new(T), Nanos::new(now), settings)
        };
        let mut state = BucketState::default();
        let g = settle_now(&mut state, &knowing(S / 2), &settings);
        assert_eq!((g.granted, g.full_in_ns, g.young), (0, S / 2, false));
        let g = settle_now(&mut state, &knowing(3 * S / 2), &settings);
        assert_eq!(g.full_in_ns, 3 * S / 2, "the emptier level wins");
        let g = settle_now(&mut state, &knowing(S / 2), &settings);
        assert_eq!(g.full_in_ns, 3 * S / 2, "never fuller again");

        // Once warmed up, the bucket is not young (it was known before the loss): it
        // grants the 5 tokens it held and the 10 that refilled in the second since.
        settings.warming_up = false;
        let later = Usage {
            want: 100,
            ..Usage::default()
        };
        let g = settle(
            &mut state,
            &l,
            &later,
            Nanos::new(T),
            Nanos::new(now + S),
            &settings,
        );
        assert_eq!((g.granted, g.young), (15, false));

        // A level is bounded by the deepest debt, twice the capacity (4 s here): at it,
        // taken as it is; beyond it, capped.
        settings.warming_up = true;
        for (reported, rebuilt) in [(4 * S, 4 * S), (4 * S + 1, 4 * S), (u64::MAX, 4 * S)] {
            let mut state = BucketState::default();
            let g = settle_now(&mut state, &knowing(reported), &settings);
            assert_eq!(g.full_in_ns, rebuilt, "reported {reported}");
        }

        // Outside a warm-up the coordinator's own state is the truth: a level is ignored.
        settings.warming_up = false;
        let mut state = known();
        let g = settle_now(&mut state, &knowing(3 * S / 2), &settings);
        assert_eq!(
            (g.granted, g.full_in_ns),
            (10, S),
            "a full bucket grants the wish"
        );
    }

    #[test]
    fn shares_follow_each_proxys_part_of_the_demand() {
        // Three proxies with a 70/20/10 split of 200 attempts per second, syncing every
        // interval, staggered: after a few seconds each share is near its part.
        let l = limit(100, 100);
        let settings = Settings::for_interval(Nanos::new(T));
        let mut state = BucketState::default();
        let parts = [0.7, 0.2, 0.1];
        let mut last = [0u32; 3];
        for round in 0..40u64 {
            for (p, part) in parts.iter().enumerate() {
                let now = 100 * S + round * T + p as u64 * T / 3;
                let attempts = (200.0 * part * 0.5) as u64;
                let usage = Usage {
                    attempts,
                    want: attempts,
                    ..Usage::default()
                };
                last[p] = settle(
                    &mut state,
                    &l,
                    &usage,
                    Nanos::new(T),
                    Nanos::new(now),
                    &settings,
                )
                .share_ppm;
            }
        }
        for (p, part) in parts.iter().enumerate() {
            let share = f64::from(last[p]) / f64::from(PPM);
            assert!(
                (share - part).abs() < 0.05,
                "proxy {p}: share {share}, part {part}"
            );
        }
    }

    #[test]
    fn a_later_usage_folds_into_one_that_could_not_be_sent() {
        let mut pending = Usage::default();
        let first = Usage {
            attempts: 3,
            unleased: 2,
            returned: 1,
            want: 9,
            first_use_ns: 40,
            known_full_in_ns: 700,
        };
        pending.merge(&first);
        assert_eq!(pending, first, "into an empty usage: the usage itself");
        pending.merge(&Usage {
            attempts: 4,
            unleased: 1,
            returned: 0,
            want: 5,
            first_use_ns: 90,
            known_full_in_ns: 500,
        });
        assert_eq!(
            pending,
            Usage {
                attempts: 7,
                unleased: 3,
                returned: 1,
                want: 5,
                first_use_ns: 40,
                known_full_in_ns: 500,
            },
            "counts add up, the latest wish and level, the earliest first use"
        );
        pending.merge(&want(2));
        assert_eq!(
            pending.first_use_ns, 40,
            "a usage without attempts says nothing of the first use"
        );
    }

    #[test]
    fn a_new_buckets_refill_counts_from_its_first_use_not_from_its_first_sync() {
        // One proxy's client sent its first request 150 ms into the 250 ms its first sync
        // covers, and spent 20 of a burst of 20 at once. Dated from the first use, the
        // bucket refilled 1 token (100 ms at 10/s) by the sync; dated from the sync, none.
        let l = limit(10, 20);
        let now = 100 * S;
        let covers = Nanos::from_millis(250);
        let settings = Settings::for_interval(covers);
        let spent = Usage {
            attempts: 20,
            unleased: 20,
            want: 0,
            returned: 0,
            first_use_ns: 150_000_000,
            known_full_in_ns: 0,
        };
        let mut state = BucketState::default();
        let g = settle(&mut state, &l, &spent, covers, Nanos::new(now), &settings);
        assert_eq!(state.born_at, now - 100_000_000, "born at the first use");
        assert_eq!(
            g.full_in_ns, 1_900_000_000,
            "19 tokens short of full: 20 spent, 1 refilled since the first use"
        );
        // A first use later than the window's end reads as its end (the sync's time, less
        // a millisecond): the bucket is never dated after the sync.
        let late = Usage {
            first_use_ns: 10 * S,
            ..spent
        };
        let mut state = BucketState::default();
        settle(&mut state, &l, &late, covers, Nanos::new(now), &settings);
        assert_eq!(state.born_at, now - 1_000_000);
    }
}
