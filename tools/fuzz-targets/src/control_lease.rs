use sluice_core::control::election::{Decision, Election, LEASE_LEN, Lease, Role};
use sluice_core::time::Nanos;

/// `Lease::decode`: the control service's lease in shared data, read by every candidate
/// root (the singleton and each worker with a `control` section) on every tick.
///
/// Input: the stored bytes, then 8 bytes of the time (little-endian).
///
/// Asserts: decoding never panics; only 18-byte values decode, and what decodes re-encodes
/// to the same bytes; a candidate of either kind deciding from any bytes at any time never
/// panics, takes over only with a later term than the stored one (so a takeover can never
/// be mistaken for the old holder's renewal), and never leads after releasing.
pub fn control_lease(input: &[u8]) {
    // The lease's bytes, then 8 bytes of the time (little-endian) when there are enough.
    let (bytes, now) = match input.len().checked_sub(8).map(|at| input.split_at(at)) {
        Some((bytes, time)) => (bytes, u64::from_le_bytes(time.try_into().unwrap_or([0; 8]))),
        None => (input, 0),
    };
    let now = Nanos::new(now);
    let stored = Lease::decode(bytes);
    if let Some(lease) = stored {
        assert_eq!(bytes.len(), LEASE_LEN, "only the fixed layout decodes");
        assert_eq!(&lease.encode()[..], bytes, "byte for byte");
    }
    for role in [Role::Worker, Role::Singleton] {
        let mut candidate = Election::new(role);
        match candidate.decide(Some(bytes), now) {
            Decision::Take(taken) => {
                if let Some(lease) = stored {
                    assert!(taken.term > lease.term || lease.term == u64::MAX);
                }
                assert_eq!(taken.holder, role);
                candidate.wrote(taken, true);
                assert!(candidate.leads());
                let written = taken.encode();
                assert!(candidate.still_leads(Some(&written), now) || !taken.is_fresh(now));
                let released = candidate.release(Some(&written));
                assert_eq!(released.map(|l| l.expires), Some(Nanos::ZERO));
                assert!(!candidate.leads());
            }
            Decision::Renew(_) => panic!("a new candidate has nothing to renew"),
            Decision::StandBy => assert!(stored.is_some_and(|l| l.is_fresh(now))),
            Decision::StepDown => panic!("a new candidate never led"),
        }
    }
}
