//! A proxy's side of a sparse client (a request every second or so at each of a few of
//! many proxies): whole tokens, a lease kept over pauses, a local share that starts full
//! again. Beside `lease.rs`, which would otherwise pass 900 lines.

use std::num::NonZeroU64;

use super::coordinator::PPM;
use super::lease::{FleetView, IDLE_KEEP_ONE_INTERVALS, IDLE_RETURN_INTERVALS, LeaseEntry, Spend};
use super::test_support::{T, grant, leasing, limit};
use crate::gcra::Gcra;
use crate::time::{NANOS_PER_SECOND as S, Nanos};

#[test]
fn sparse_keys_get_whole_tokens_only_where_demand_is() {
    // 5 per minute across 20 proxies: an even share of the burst is a quarter token,
    // rounded up to one, refilled at 1/20 of the rate (one per 4 minutes).
    let l = Gcra::new(
        NonZeroU64::new(5).unwrap(),
        NonZeroU64::new(60 * S).unwrap(),
        NonZeroU64::new(5).unwrap(),
    )
    .unwrap();
    let view = leasing(20);
    let mut entry = LeaseEntry::new(1, &l, Nanos::new(0));
    assert_eq!(entry.spend(1, Nanos::new(0), &view), Spend::NewBucket);
    assert!(!entry.spend(1, Nanos::new(0), &view).admitted());
    let usage = entry.collect(Nanos::new(0), Nanos::new(T), &view);
    assert_eq!(usage.attempts, 2);
    assert!(usage.want >= 2, "the denied attempt still asks for a lease");
}

#[test]
fn an_idle_lease_is_kept_for_a_while_then_one_token_and_an_expired_one_is_dropped() {
    let view = leasing(2);
    let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
    entry.apply(&grant(50, PPM, S), Nanos::new(0), &view);
    // Idle intervals while the other proxy's leases keep the fleet's bucket from
    // refilling (each answer: full in 10 s): the lease stays for IDLE_RETURN_INTERVALS,
    // so a client back from a pause still finds it; then all but a token goes back, and
    // that token after IDLE_KEEP_ONE_INTERVALS.
    let mut held = vec![];
    let mut now = 0;
    while entry.balance > 0 {
        now += T;
        let usage = entry.collect(Nanos::new(now), Nanos::new(T), &view);
        // Its part of the burst (all of it: the only demand) while it keeps its lease,
        // then nothing more.
        assert_eq!(usage.want, if entry.balance > 1 { 50 } else { 0 });
        entry.apply(&grant(0, 0, 10 * S), Nanos::new(now), &view);
        held.push(entry.balance);
    }
    let returns = IDLE_RETURN_INTERVALS as usize;
    let keeps_one = IDLE_KEEP_ONE_INTERVALS as usize - returns;
    assert_eq!(
        held,
        [vec![50; returns], vec![1; keeps_one], vec![0]].concat()
    );
    // Forgettable once nothing is held and the fleet's bucket is full.
    assert!(!entry.forgettable(Nanos::new(now)));
    assert!(entry.forgettable(Nanos::new(now + 10 * S)));
    // One attempt, and it is kept again (the grant just taken, the bucket not full).
    entry.apply(&grant(50, PPM, 2 * S), Nanos::new(now), &view);
    entry.spend(1, Nanos::new(now), &view);
    entry.collect(Nanos::new(now + T), Nanos::new(T), &view);
    assert_eq!(entry.balance, 49);

    entry.apply(&grant(5, PPM, S), Nanos::new(T), &view);
    let usage = entry.collect(Nanos::new(T + view.lease_ttl_ns()), Nanos::new(T), &view);
    assert_eq!(
        usage.returned, 0,
        "an expired lease is dropped, not returned"
    );
    assert_eq!(entry.balance, 0);
}

/// An entry granted `granted` tokens at 0, then idle (each answer: the fleet's bucket full
/// in 10 s, the other proxy's leases keeping it from refilling) until it has given its
/// lease back but a token ([`IDLE_RETURN_INTERVALS`]); and the time then.
fn idle_past_the_return(granted: u64, view: &FleetView) -> (LeaseEntry, u64) {
    let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
    entry.apply(&grant(granted, PPM, 10 * S), Nanos::new(0), view);
    let mut now = 0;
    while now <= T * IDLE_RETURN_INTERVALS as u64 {
        now += T;
        entry.collect(Nanos::new(now), Nanos::new(T), view);
        entry.apply(&grant(0, 0, 10 * S), Nanos::new(now), view);
    }
    (entry, now)
}

#[test]
fn a_token_kept_over_a_pause_is_not_spent_once_the_fleet_refilled_but_asked_for_again() {
    let view = leasing(2);
    let (mut entry, now) = idle_past_the_return(50, &view);
    assert_eq!(entry.balance, 1, "one token kept over the pause");
    // Spendable while the bucket is not full.
    let later = Nanos::new(now + T / 2);
    assert_eq!(entry.spendable(later, &view), 1);

    // The next answer says the bucket is full: the token is one it no longer misses. Not
    // spent: the local share admits (to be debited from the full bucket).
    entry.apply(&grant(0, 0, 0), Nanos::new(now), &view);
    let spent = entry.spend(1, later, &view);
    assert!(spent.admitted());
    assert_eq!(
        spent,
        Spend::NewBucket,
        "the local share, not the kept token"
    );
    let usage = entry.collect(Nanos::new(now + T), Nanos::new(T), &view);
    assert_eq!(
        (entry.balance, usage.returned),
        (0, 0),
        "dropped, not returned"
    );
    assert_eq!(usage.unleased, 1);
    assert!(usage.want >= 1, "the client is back: a lease is asked for");

    // Idle again with a token kept and the bucket full: dropped and asked for anew.
    let (mut entry, now) = idle_past_the_return(1, &view);
    entry.apply(&grant(0, 0, 0), Nanos::new(now), &view);
    let usage = entry.collect(Nanos::new(now + T), Nanos::new(T), &view);
    assert_eq!((entry.balance, usage.want), (0, 1));
}

#[test]
fn a_whole_lease_held_idle_for_less_than_the_return_is_spent_as_before() {
    let view = leasing(2);
    let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
    entry.apply(&grant(50, PPM, 2 * T), Nanos::new(0), &view);
    entry.collect(Nanos::new(T), Nanos::new(T), &view);
    entry.apply(&grant(0, PPM, 0), Nanos::new(T), &view);
    assert_eq!(entry.spend(1, Nanos::new(T + T / 2), &view), Spend::Lease);
}

#[test]
fn a_proxy_never_told_its_share_asks_for_a_token() {
    // 100/s across 1,000 proxies: an even part of the burst is a tenth of a token.
    let view = leasing(1_000);
    let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
    entry.apply(&grant(0, 0, 0), Nanos::new(0), &view);
    let usage = entry.collect(Nanos::new(T), Nanos::new(T), &view);
    assert_eq!(usage.want, 1, "no share known: a token");
    // Told a share of a twentieth of an even split (the floor, a tenth, counts): its part
    // of the burst is 0.01 of a token, and it asks for none.
    entry.apply(&grant(0, 50, 0), Nanos::new(T), &view);
    let usage = entry.collect(Nanos::new(2 * T), Nanos::new(T), &view);
    assert_eq!(usage.want, 0, "a share known: its part of the burst");
}

#[test]
fn a_spent_local_share_starts_full_once_the_fleets_bucket_is_full() {
    // 100/s across 1,000 proxies: a local share of one token, refilled every 10 s.
    let view = leasing(1_000);
    let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
    assert_eq!(entry.spend(1, Nanos::new(0), &view), Spend::NewBucket);
    assert!(!entry.spend(1, Nanos::new(1), &view).admitted());
    let at = T;
    entry.collect(Nanos::new(at), Nanos::new(T), &view);
    // The answer: no lease, the fleet's bucket full 100 ms on.
    entry.apply(&grant(0, 0, S / 10), Nanos::new(at), &view);
    let full = at + S / 10;
    assert!(
        !entry.spend(1, Nanos::new(full - 1), &view).admitted(),
        "the fleet's bucket not full yet: a lease is needed"
    );
    assert_eq!(entry.spend(1, Nanos::new(full), &view), Spend::NewBucket);
    assert!(
        !entry.spend(1, Nanos::new(full + 1), &view).admitted(),
        "once: it spent since the last collection"
    );
    // On fallback shares the local share goes on from its level.
    let fallback = FleetView {
        fallback: true,
        ..view
    };
    entry.collect(Nanos::new(full + T), Nanos::new(T), &fallback);
    assert!(!entry.spend(1, Nanos::new(full + T), &fallback).admitted());
}

#[test]
fn a_level_reported_is_at_most_one_burst_of_debt() {
    // 100/s, burst 100: the deepest level a report may carry is 2 s (one burst of debt);
    // the fleet's bucket may be deeper, a token a proxy of 1,000 more.
    let view = leasing(1_000);
    let fallback = FleetView {
        fallback: true,
        ..view
    };
    for (full_in_ns, reported) in [(2 * S - 1, 2 * S - 1), (2 * S, 2 * S), (12 * S, 2 * S)] {
        let mut entry = LeaseEntry::new(1, &limit(100, 100), Nanos::new(0));
        entry.apply(&grant(0, PPM, full_in_ns), Nanos::new(0), &view);
        let usage = entry.collect(Nanos::new(0), Nanos::new(T), &fallback);
        assert_eq!(usage.known_full_in_ns, reported, "{full_in_ns}");
    }
}
