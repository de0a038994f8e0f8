use arbitrary::{Arbitrary, Unstructured};
use sluice_core::global::coordinator::Grant;
use sluice_core::global::lease::{ENTRY_LEN, FleetView, LeaseEntry, Spend};
use sluice_core::time::Nanos;

/// `LeaseEntry::decode`: a global bucket's lease entry in shared data (`sluice.lease.N`),
/// read and rewritten by every worker and by the control service.
///
/// Asserts: decoding never panics; bytes that decode are exactly the encoding of what they
/// decode to; a decoded entry always yields a local limit (decode refuses the zero
/// interval or burst that would not); and after every operation the core performs on an
/// entry read from shared data (spend, undo, remaining, collect, apply a grant, at
/// arbitrary instants and with arbitrary fleet views and grants) the entry it writes back
/// still decodes to itself, a lease spend takes exactly its cost from the balance, and an
/// undo gives it back.
pub fn lease_entry(input: &[u8]) {
    // The entry's bytes come first, so the seed corpus is plain encoded entries; whatever
    // follows drives the operations.
    let (bytes, rest) = input.split_at(input.len().min(ENTRY_LEN));
    let Some(mut entry) = LeaseEntry::decode(bytes) else {
        return;
    };
    assert_eq!(entry.encode().as_slice(), bytes);

    let mut u = Unstructured::new(rest);
    let Ok(Session { view, mut now, ops }) = Session::arbitrary(&mut u) else {
        return;
    };
    assert!(
        entry.local_limit(&view).is_some(),
        "a decodable entry has a local limit"
    );
    for op in ops {
        now = now.saturating_add(op.elapsed_ns);
        match op.kind {
            OpKind::Spend { cost, undo } => {
                let before = entry;
                let spent = entry.spend(cost, Nanos::new(now), &view);
                if spent == Spend::Lease {
                    assert_eq!(entry.balance, before.balance - cost);
                }
                if undo {
                    entry.undo(cost, spent, Nanos::new(now), &view);
                    if spent == Spend::Lease {
                        assert_eq!(entry.balance, before.balance);
                    }
                }
            }
            OpKind::Remaining => {
                let _ = entry.remaining(Nanos::new(now), &view);
            }
            OpKind::Collect { covers_ns } => {
                let usage = entry.collect(Nanos::new(now), Nanos::new(covers_ns), &view);
                assert_eq!((entry.attempts, entry.unleased), (0, 0));
                let _ = usage;
            }
            OpKind::Apply(grant) => entry.apply(&grant, Nanos::new(now), &view),
        }
        assert_eq!(
            LeaseEntry::decode(&entry.encode()),
            Some(entry),
            "an entry written back must read back"
        );
        let _ = entry.forgettable(Nanos::new(now));
    }
}

#[derive(Debug, Arbitrary)]
struct Session {
    #[arbitrary(with = fleet_view)]
    view: FleetView,
    now: u64,
    ops: Vec<Op>,
}

/// A fleet view as any bytes in shared data may describe it, through its own decoder.
fn fleet_view(u: &mut Unstructured<'_>) -> arbitrary::Result<FleetView> {
    let bytes: [u8; 13] = u.arbitrary()?;
    FleetView::decode(&bytes).ok_or(arbitrary::Error::IncorrectFormat)
}

#[derive(Debug, Arbitrary)]
struct Op {
    elapsed_ns: u64,
    kind: OpKind,
}

#[derive(Debug, Arbitrary)]
enum OpKind {
    Spend { cost: u64, undo: bool },
    Remaining,
    Collect { covers_ns: u64 },
    Apply(#[arbitrary(with = grant)] Grant),
}

fn grant(u: &mut Unstructured<'_>) -> arbitrary::Result<Grant> {
    Ok(Grant {
        granted: u.arbitrary()?,
        share_ppm: u.arbitrary()?,
        full_in_ns: u.arbitrary()?,
        young: u.arbitrary()?,
    })
}
