//! Who runs the control service in one Envoy: a lease in shared data.
//!
//! Control planes such as Istio (`WasmPlugin`) and Envoy Gateway (`EnvoyExtensionPolicy`)
//! load Sluice as an HTTP filter only, with no bootstrap extension, so there is no
//! singleton on the main thread to follow the admin API. Instead every worker's root
//! context is a candidate, and the one holding the lease runs the control service. Where
//! the singleton is configured it is a candidate too, with priority: it takes the lease
//! from a worker at once, and workers never take it from a fresh singleton.
//!
//! The lease is one shared-data value, [`Lease`]: who holds it (a worker or the
//! singleton), the holder's *term*, and when it expires. Every change goes through a
//! compare-and-swap over the bytes the candidate read, so two candidates can never both
//! think they won: each takeover writes the next term, and a candidate leads exactly while
//! the stored term is the one it wrote. The holder renews the lease on every tick
//! (100 ms for a worker, 50 ms for the singleton), pushing its expiry [`LEASE_DURATION`]
//! ahead; a holder that stops ticking (its VM failed or was replaced without a goodbye)
//! lets it expire, and the next candidate to tick after that takes over. A holder being
//! torn down releases the lease (expiry zero) so a successor takes over on its next tick.
//!
//! Bounds, with `T` = [`LEASE_DURATION`] (3 s) and a 100 ms worker tick: at most one
//! candidate leads at any instant (the CAS); after a holder stops, another leads within
//! `T` + 100 ms of its last renewal, or within 100 ms of a release.
//!
//! The first-write race: a key that was never set has no CAS, and CAS 0 means an
//! unconditional write. [`Decision::Take`] says when the key was absent
//! ([`Lease::written_over`] is `None`); the host then writes "create only if absent"
//! (see `filter/src/host_store.rs`), so of two candidates creating the key one fails.
//!
//! Time is an argument; nothing here reads a clock or the host.

use crate::time::Nanos;

/// The format byte of a lease's bytes.
pub const LEASE_FORMAT: u8 = 1;
/// Bytes of an encoded lease: format, holder kind, term (`u64`), expiry (`u64` ns),
/// little-endian.
pub const LEASE_LEN: usize = 18;
/// How long a lease lasts after its last renewal: the longest a stopped holder can leave
/// the proxy without a control service. Long enough that a worker busy for a moment
/// (its ticks are 100 ms) does not lose it, short enough that a rule saved meanwhile still
/// arrives within a few seconds.
pub const LEASE_DURATION: Nanos = Nanos::from_secs(3);

/// What kind of root context holds (or wants) the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A worker's HTTP filter root elected among its peers.
    Worker,
    /// The singleton control service (bootstrap extension): leads whenever it runs.
    Singleton,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Role::Worker => 0,
            Role::Singleton => 1,
        }
    }

    fn from_byte(byte: u8) -> Option<Role> {
        match byte {
            0 => Some(Role::Worker),
            1 => Some(Role::Singleton),
            _ => None,
        }
    }
}

/// The lease as stored in shared data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub holder: Role,
    /// Increased by every takeover: the holder's identity while it leads.
    pub term: u64,
    /// The lease is free from this time on (zero: released).
    pub expires: Nanos,
}

impl Lease {
    /// The lease's bytes: format, holder kind, term, expiry (ns), little-endian.
    pub fn encode(&self) -> [u8; LEASE_LEN] {
        let mut out = [0u8; LEASE_LEN];
        let (head, rest) = out.split_at_mut(2);
        head.copy_from_slice(&[LEASE_FORMAT, self.holder.byte()]);
        let (term, expires) = rest.split_at_mut(8);
        term.copy_from_slice(&self.term.to_le_bytes());
        expires.copy_from_slice(&self.expires.get().to_le_bytes());
        out
    }

    /// Decodes a lease; `None` for bytes of another format, length or holder kind.
    pub fn decode(bytes: &[u8]) -> Option<Lease> {
        let bytes: &[u8; LEASE_LEN] = bytes.try_into().ok()?;
        let (head, rest) = bytes.split_at(2);
        let (term, expires) = rest.split_at(8);
        let holder = match head {
            [LEASE_FORMAT, kind] => Role::from_byte(*kind)?,
            _ => return None,
        };
        Some(Lease {
            holder,
            term: u64::from_le_bytes(term.try_into().ok()?),
            expires: Nanos::new(u64::from_le_bytes(expires.try_into().ok()?)),
        })
    }

    /// Whether a control service holds this lease at `now`.
    pub fn is_fresh(&self, now: Nanos) -> bool {
        self.expires > now
    }
}

/// Whether some control service holds a fresh lease in `stored` (the lease key's bytes):
/// workers hand it their statistics only then, since the report queue is unbounded and
/// only a running control service drains it.
pub fn control_running(stored: Option<&[u8]>, now: Nanos) -> bool {
    stored
        .and_then(Lease::decode)
        .is_some_and(|lease| lease.is_fresh(now))
}

/// What a candidate does on this tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take the lease: write `lease` by compare-and-swap over what was read (create it only
    /// if absent when nothing was read), then report with [`Election::wrote`].
    Take(Lease),
    /// Keep leading: write `lease` (a later expiry) the same way.
    Renew(Lease),
    /// Another candidate holds a fresh lease; this one does not lead.
    StandBy,
    /// This candidate led, but the stored term is another's (it took over after this
    /// one's lease expired, or the singleton claimed it): stop the control service now.
    StepDown,
}

/// What a write of [`Decision::Take`] or [`Decision::Renew`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// This candidate leads from now on: start the control service.
    Took,
    /// Still leading.
    Kept,
    /// A renewal lost its compare-and-swap: another candidate wrote first, so this one
    /// leads no more.
    Lost,
    /// A takeover lost its compare-and-swap to another candidate's.
    Beaten,
}

/// One root context's part in the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Election {
    role: Role,
    /// The term this candidate wrote when it took the lease, while it leads.
    term: Option<u64>,
}

impl Election {
    pub fn new(role: Role) -> Self {
        Election { role, term: None }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether this candidate leads (as of its last decision).
    pub fn leads(&self) -> bool {
        self.term.is_some()
    }

    /// The term this candidate leads in.
    pub fn term(&self) -> Option<u64> {
        self.term
    }

    /// Decides from the lease key's bytes as read (`None`: never written) at `now`.
    /// Bytes that do not decode (another format: a module of another release) count as a
    /// free lease.
    pub fn decide(&self, stored: Option<&[u8]>, now: Nanos) -> Decision {
        let current = stored.and_then(Lease::decode);
        let expires = now.saturating_add(LEASE_DURATION);
        match current {
            Some(lease) if self.term == Some(lease.term) && lease.holder == self.role => {
                Decision::Renew(Lease { expires, ..lease })
            }
            Some(lease)
                if !lease.is_fresh(now)
                    || (self.role == Role::Singleton && lease.holder == Role::Worker) =>
            {
                Decision::Take(Lease {
                    holder: self.role,
                    term: lease.term.saturating_add(1),
                    expires,
                })
            }
            Some(_) if self.leads() => Decision::StepDown,
            Some(_) => Decision::StandBy,
            None => Decision::Take(Lease {
                holder: self.role,
                term: 1,
                expires,
            }),
        }
    }

    /// Records whether the write of a [`Decision::Take`] or [`Decision::Renew`] of `lease`
    /// went through.
    pub fn wrote(&mut self, lease: Lease, written: bool) -> Transition {
        let led = self.term == Some(lease.term);
        self.term = written.then_some(lease.term);
        match (led, written) {
            (true, true) => Transition::Kept,
            (false, true) => Transition::Took,
            (true, false) => Transition::Lost,
            (false, false) => Transition::Beaten,
        }
    }

    /// Records a [`Decision::StandBy`] or [`Decision::StepDown`].
    pub fn stood_by(&mut self) {
        self.term = None;
    }

    /// Whether this candidate still leads according to the lease key's bytes at `now`:
    /// checked before acting on an answer that arrived between two ticks.
    pub fn still_leads(&self, stored: Option<&[u8]>, now: Nanos) -> bool {
        let current = stored.and_then(Lease::decode);
        matches!((self.term, current), (Some(term), Some(lease))
            if lease.term == term && lease.holder == self.role && lease.is_fresh(now))
    }

    /// The lease to write (by compare-and-swap over `stored`) to hand over at once when
    /// this candidate is torn down: its own, expired. `None` when it does not lead, or the
    /// stored lease is no longer its own. This candidate leads no more either way.
    pub fn release(&mut self, stored: Option<&[u8]>) -> Option<Lease> {
        let term = self.term.take()?;
        stored
            .and_then(Lease::decode)
            .filter(|lease| lease.term == term && lease.holder == self.role)
            .map(|lease| Lease {
                expires: Nanos::ZERO,
                ..lease
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake clock: seconds and milliseconds from an arbitrary epoch.
    fn at(ms: u64) -> Nanos {
        Nanos::from_millis(1_700_000_000_000 + ms)
    }

    /// Runs one tick of `candidate` against `stored` the way the host glue does: read,
    /// decide, compare-and-swap (here: the bytes read must be the bytes stored), report.
    fn tick(candidate: &mut Election, stored: &mut Option<Vec<u8>>, now: Nanos) -> Decision {
        let read = stored.clone();
        let decision = candidate.decide(read.as_deref(), now);
        match decision {
            Decision::Take(lease) | Decision::Renew(lease) => {
                let written = *stored == read;
                if written {
                    *stored = Some(lease.encode().to_vec());
                }
                candidate.wrote(lease, written);
            }
            Decision::StandBy | Decision::StepDown => candidate.stood_by(),
        }
        decision
    }

    #[test]
    fn the_lease_bytes_are_pinned() {
        let lease = Lease {
            holder: Role::Singleton,
            term: 0x0102,
            expires: Nanos::new(0x0A0B_0C0D),
        };
        assert_eq!(
            lease.encode(),
            [
                1, 1, // format, singleton
                0x02, 0x01, 0, 0, 0, 0, 0, 0, // term
                0x0D, 0x0C, 0x0B, 0x0A, 0, 0, 0, 0, // expiry
            ]
        );
        assert_eq!(Lease::decode(&lease.encode()), Some(lease));
        let worker = Lease {
            holder: Role::Worker,
            ..lease
        };
        assert_eq!(worker.encode()[1], 0);
        assert_eq!(Lease::decode(&worker.encode()), Some(worker));
    }

    #[test]
    fn foreign_truncated_and_empty_bytes_are_refused() {
        let good = Lease {
            holder: Role::Worker,
            term: 3,
            expires: at(0),
        }
        .encode();
        let mut other_format = good;
        other_format[0] = LEASE_FORMAT + 1;
        let mut other_kind = good;
        other_kind[1] = 7;
        for bad in [
            &other_format[..],
            &other_kind[..],
            &good[..LEASE_LEN - 1],
            &[],
            // The heartbeat the singleton wrote before leases: 8 bytes of time.
            &at(0).as_millis().to_le_bytes()[..],
        ] {
            assert_eq!(Lease::decode(bad), None, "{bad:?}");
            assert!(!control_running(Some(bad), at(0)));
        }
    }

    #[test]
    fn the_first_candidate_creates_the_lease_and_renews_it_every_tick() {
        let mut stored = None;
        let mut worker = Election::new(Role::Worker);
        let decision = tick(&mut worker, &mut stored, at(0));
        assert_eq!(
            decision,
            Decision::Take(Lease {
                holder: Role::Worker,
                term: 1,
                expires: at(3_000)
            })
        );
        assert!(worker.leads());
        assert!(control_running(stored.as_deref(), at(2_999)));
        assert!(!control_running(stored.as_deref(), at(3_000)));
        assert!(matches!(
            tick(&mut worker, &mut stored, at(100)),
            Decision::Renew(Lease { term: 1, expires, .. }) if expires == at(3_100)
        ));
        assert!(worker.still_leads(stored.as_deref(), at(200)));
    }

    #[test]
    fn only_one_of_two_racing_candidates_wins_and_the_other_stands_by() {
        let mut stored = None;
        let (mut a, mut b) = (Election::new(Role::Worker), Election::new(Role::Worker));
        // Both read the absent key before either writes.
        let (da, db) = (a.decide(None, at(0)), b.decide(None, at(0)));
        let (Decision::Take(la), Decision::Take(lb)) = (da, db) else {
            panic!("{da:?} {db:?}")
        };
        stored = stored.or(Some(la.encode().to_vec()));
        assert_eq!(a.wrote(la, true), Transition::Took);
        // b's create-if-absent fails: the key exists now.
        assert_eq!(b.wrote(lb, false), Transition::Beaten);
        assert!(a.leads() && !b.leads());
        assert_eq!(tick(&mut b, &mut stored, at(100)), Decision::StandBy);
        assert!(matches!(
            tick(&mut a, &mut stored, at(100)),
            Decision::Renew(_)
        ));
    }

    #[test]
    fn a_holder_that_stops_ticking_is_replaced_once_its_lease_expires() {
        let mut stored = None;
        let (mut a, mut b) = (Election::new(Role::Worker), Election::new(Role::Worker));
        tick(&mut a, &mut stored, at(0));
        // a stops ticking after its renewal at 500 ms.
        tick(&mut a, &mut stored, at(500));
        let mut now = 500;
        while tick(&mut b, &mut stored, at(now)) == Decision::StandBy {
            now += 100;
        }
        // The first tick at or after the expiry (500 ms + 3 s) takes over.
        assert_eq!(now, 3_500);
        assert!(b.leads());
        assert_eq!(Lease::decode(stored.as_deref().unwrap()).unwrap().term, 2);
        // a wakes up: the stored term is b's, so it steps down without writing.
        let before = stored.clone();
        assert_eq!(tick(&mut a, &mut stored, at(3_600)), Decision::StepDown);
        assert!(!a.leads());
        assert_eq!(stored, before);
    }

    #[test]
    fn a_late_renewal_loses_its_compare_and_swap() {
        let mut stored = None;
        let (mut a, mut b) = (Election::new(Role::Worker), Election::new(Role::Worker));
        tick(&mut a, &mut stored, at(0));
        // a reads its own lease just before it expires, and is slow to write...
        let read = stored.clone();
        let Decision::Renew(renewal) = a.decide(read.as_deref(), at(2_999)) else {
            panic!()
        };
        // ...while b takes the expired lease.
        tick(&mut b, &mut stored, at(3_000));
        assert!(b.leads());
        assert_eq!(a.wrote(renewal, stored == read), Transition::Lost);
        assert!(!a.leads());
    }

    #[test]
    fn a_released_lease_is_taken_on_the_next_tick() {
        let mut stored = None;
        let (mut a, mut b) = (Election::new(Role::Worker), Election::new(Role::Worker));
        tick(&mut a, &mut stored, at(0));
        assert_eq!(tick(&mut b, &mut stored, at(100)), Decision::StandBy);
        let released = a.release(stored.as_deref()).unwrap();
        assert_eq!(released.expires, Nanos::ZERO);
        assert!(!a.leads());
        stored = Some(released.encode().to_vec());
        assert!(!control_running(stored.as_deref(), at(150)));
        assert!(matches!(
            tick(&mut b, &mut stored, at(200)),
            Decision::Take(Lease { term: 2, .. })
        ));
        // Releasing what is not one's own writes nothing.
        assert_eq!(a.release(stored.as_deref()), None);
        let mut c = Election::new(Role::Worker);
        assert_eq!(c.release(stored.as_deref()), None);
    }

    #[test]
    fn the_singleton_takes_the_lease_from_a_worker_and_keeps_it() {
        let mut stored = None;
        let mut worker = Election::new(Role::Worker);
        let mut singleton = Election::new(Role::Singleton);
        tick(&mut worker, &mut stored, at(0));
        assert!(matches!(
            tick(&mut singleton, &mut stored, at(50)),
            Decision::Take(Lease {
                holder: Role::Singleton,
                term: 2,
                ..
            })
        ));
        assert!(singleton.leads());
        assert_eq!(tick(&mut worker, &mut stored, at(100)), Decision::StepDown);
        assert!(!worker.leads());
        // A worker never takes a fresh lease from the singleton...
        let mut other = Election::new(Role::Worker);
        assert_eq!(tick(&mut other, &mut stored, at(3_000)), Decision::StandBy);
        // ...only an expired one.
        assert!(matches!(
            tick(&mut other, &mut stored, at(3_050)),
            Decision::Take(Lease {
                holder: Role::Worker,
                term: 3,
                ..
            })
        ));
        // A singleton that comes back claims it again.
        assert!(matches!(
            tick(&mut singleton, &mut stored, at(3_100)),
            Decision::Take(Lease { term: 4, .. })
        ));
    }

    #[test]
    fn a_singleton_waits_for_another_singletons_lease_to_expire() {
        let mut stored = None;
        let (mut old, mut new) = (
            Election::new(Role::Singleton),
            Election::new(Role::Singleton),
        );
        tick(&mut old, &mut stored, at(0));
        assert_eq!(tick(&mut new, &mut stored, at(50)), Decision::StandBy);
        assert!(matches!(
            tick(&mut new, &mut stored, at(3_000)),
            Decision::Take(_)
        ));
    }

    #[test]
    fn foreign_bytes_count_as_a_free_lease() {
        let mut stored = Some(vec![9, 9, 9]);
        let mut worker = Election::new(Role::Worker);
        assert!(matches!(
            tick(&mut worker, &mut stored, at(0)),
            Decision::Take(Lease { term: 1, .. })
        ));
        assert!(worker.leads());
    }

    #[test]
    fn still_leads_only_with_its_own_fresh_lease() {
        let mut stored = None;
        let mut worker = Election::new(Role::Worker);
        assert!(!worker.still_leads(None, at(0)));
        tick(&mut worker, &mut stored, at(0));
        assert!(worker.still_leads(stored.as_deref(), at(2_999)));
        assert!(!worker.still_leads(stored.as_deref(), at(3_000)));
        let other = Lease {
            holder: Role::Worker,
            term: 2,
            expires: at(5_000),
        }
        .encode();
        assert!(!worker.still_leads(Some(&other), at(100)));
    }
}
