use std::num::NonZeroU32;
use std::sync::Arc;

use super::*;
use crate::store::MemoryStore;

const T0: Nanos = Nanos::from_secs(1_000);

fn max(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn table() -> InFlightTable {
    InFlightTable::new(max(16))
}

fn take(table: &InFlightTable, store: &MemoryStore, fp: u64, n: u32, holder: u64) -> Admission {
    table
        .acquire(
            store,
            fp,
            max(n),
            holder,
            T0,
            &mut InFlightCounters::default(),
        )
        .unwrap()
}

#[test]
fn a_client_gets_exactly_its_limit_and_a_released_place_is_reused() {
    let (table, store) = (table(), MemoryStore::new());
    let holds: Vec<Hold> = (0..3)
        .map(|h| match take(&table, &store, 5, 3, h) {
            Admission::Held(hold) => hold,
            Admission::Full => panic!("place {h} refused"),
        })
        .collect();
    assert_eq!(take(&table, &store, 5, 3, 99), Admission::Full);
    // Another client on the same key has its own count.
    assert!(matches!(
        take(&table, &store, 5 + 16, 3, 7),
        Admission::Held(_)
    ));
    let mut counters = InFlightCounters::default();
    assert_eq!(
        table.release(&store, &holds[1], T0, &mut counters),
        Ok(true)
    );
    // Letting go twice frees one place, not two.
    assert_eq!(
        table.release(&store, &holds[1], T0, &mut counters),
        Ok(false)
    );
    assert_eq!(table.in_flight(&store, 5, T0), Ok(2));
    assert!(matches!(
        take(&table, &store, 5, 3, 100),
        Admission::Held(_)
    ));
    assert_eq!(take(&table, &store, 5, 3, 101), Admission::Full);
}

#[test]
fn a_hold_nobody_refreshes_lapses_after_its_ttl_and_not_before() {
    let (table, store) = (table(), MemoryStore::new());
    let mut counters = InFlightCounters::default();
    let Admission::Held(kept) = take(&table, &store, 5, 2, 1) else {
        panic!("refused")
    };
    let Admission::Held(_leaked) = take(&table, &store, 5, 2, 2) else {
        panic!("refused")
    };
    let refreshed_at = T0.saturating_add(REFRESH_EVERY);
    assert_eq!(
        table.refresh(&store, &kept, refreshed_at, &mut counters),
        Ok(true)
    );
    let just_before = T0.saturating_add(HOLD_TTL).saturating_sub(Nanos::new(1));
    let at_expiry = T0.saturating_add(HOLD_TTL);
    let acquire = |now, holder, counters: &mut InFlightCounters| {
        table
            .acquire(&store, 5, max(2), holder, now, counters)
            .unwrap()
    };
    assert_eq!(acquire(just_before, 3, &mut counters), Admission::Full);
    assert_eq!(counters.lapsed, 0);
    assert!(matches!(
        acquire(at_expiry, 3, &mut counters),
        Admission::Held(_)
    ));
    assert_eq!(
        counters.lapsed, 1,
        "the leaked hold lapsed, the refreshed one not"
    );
    assert_eq!(table.in_flight(&store, 5, at_expiry), Ok(2));
}

#[test]
fn a_full_key_fails_and_corrupt_bytes_read_as_empty() {
    let (table, store) = (InFlightTable::new(max(1)), MemoryStore::new());
    for client in 1..=u64::try_from(MAX_HOLDS).unwrap() {
        assert!(matches!(
            take(&table, &store, client, 1, client),
            Admission::Held(_)
        ));
    }
    let mut counters = InFlightCounters::default();
    assert_eq!(
        table.acquire(&store, 0, max(1), 0, T0, &mut counters),
        Err(InFlightFailure::KeyFull)
    );
    let (_, cas) = store.read(0).unwrap().unwrap();
    store
        .write(0, b"junk", WriteCondition::Unchanged(cas))
        .unwrap();
    assert!(matches!(
        table.acquire(&store, 0, max(1), 0, T0, &mut counters),
        Ok(Admission::Held(_))
    ));
    assert_eq!(counters.corrupt, 1);
}

#[test]
fn contention_and_host_failures_are_reported_not_hidden() {
    let (table, store) = (table(), MemoryStore::new());
    let mut counters = InFlightCounters::default();
    store.inject_conflicts(MAX_WRITE_ATTEMPTS);
    assert_eq!(
        table.acquire(&store, 5, max(1), 1, T0, &mut counters),
        Err(InFlightFailure::Contention)
    );
    assert_eq!(counters.cas_conflicts, MAX_WRITE_ATTEMPTS);
    store.inject_failures(1);
    assert!(matches!(
        table.acquire(&store, 5, max(1), 1, T0, &mut counters),
        Err(InFlightFailure::Store(_))
    ));
    // One conflict fewer than the bound still gets through.
    store.inject_conflicts(MAX_WRITE_ATTEMPTS - 1);
    assert!(matches!(
        table.acquire(&store, 5, max(1), 1, T0, &mut counters),
        Ok(Admission::Held(_))
    ));
}

/// Several "workers" taking and letting go of places on one client at once: never more
/// than the limit held, and nothing held once they are done but the places whose release
/// met more conflicts than a write retries (threads on a busy machine can; the filter
/// counts it as a failure and the place lapses), until they lapse.
#[test]
fn racing_workers_never_exceed_the_limit_and_leave_nothing_held() {
    const LIMIT: u32 = 4;
    let table = table();
    let store = Arc::new(MemoryStore::new());
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut counters = InFlightCounters::default();
                let mut ids = HolderIds::new(w);
                let (mut peak, mut left_to_lapse) = (0, 0);
                for _ in 0..500 {
                    match table.acquire(&*store, 9, max(LIMIT), ids.next_id(), T0, &mut counters) {
                        Ok(Admission::Held(hold)) => {
                            peak = peak.max(table.in_flight(&*store, 9, T0).unwrap());
                            match table.release(&*store, &hold, T0, &mut counters) {
                                Ok(released) => assert!(released, "nothing lapses at T0"),
                                Err(InFlightFailure::Contention) => left_to_lapse += 1,
                                Err(e) => panic!("{e:?}"),
                            }
                        }
                        Ok(Admission::Full) | Err(InFlightFailure::Contention) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
                (peak, left_to_lapse)
            })
        })
        .collect();
    let mut left_to_lapse = 0;
    for worker in workers {
        let (peak, left) = worker.join().unwrap();
        assert!(peak <= LIMIT as usize);
        left_to_lapse += left;
    }
    assert_eq!(table.in_flight(&*store, 9, T0), Ok(left_to_lapse));
    let lapsed = T0.saturating_add(HOLD_TTL).saturating_add(Nanos::new(1));
    assert_eq!(table.in_flight(&*store, 9, lapsed), Ok(0));
}
