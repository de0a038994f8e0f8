//! The proxy's side of fleet-wide buckets between syncs.
//!
//! Once per sync interval (sooner while a bucket new to this proxy waits for its first
//! answer or a lease ran out, rarely while the ruleset has no global limit: [`Pace`]) the
//! control service collects the usage of every lease entry and sends it to
//! the coordinator in one request; the answer's grants go back into the entries, and the
//! [`FleetView`] the workers spend by is published after every attempt.
//!
//! Usage that could not be sent (the coordinator unreachable, an answer that does not
//! fit) is kept and merged into the next sync, so nothing a proxy admitted goes
//! unreported; while syncs fail the view says `fallback`, and the workers keep to their
//! last known shares.

use std::collections::BTreeMap;

use crate::global::coordinator::Usage;
use crate::global::lease::FleetView;
use crate::global::schedule::{IDLE_SYNC_INTERVALS, Pace, SyncSchedule};
use crate::global::sync::{BucketUsage, SyncRequest, SyncResponse};
use crate::global::table::{Collected, Collection, LeaseTable};
use crate::store::SharedStore;
use crate::time::Nanos;

use super::Answer;
use super::problem::problem_summary;

/// The lease entries in shared data: the table (sized by the workers' configuration, so
/// absent until one is configured) and the store it lives in.
#[derive(Debug, Clone, Copy)]
pub struct Leases<'a, S> {
    pub table: Option<LeaseTable>,
    pub store: &'a S,
}

#[derive(Debug)]
pub struct GlobalSyncer {
    schedule: SyncSchedule,
    /// Usage collected but not yet answered, per bucket, with where its entry is.
    pending: BTreeMap<u64, (Collected, Usage)>,
    in_flight: Option<InFlight>,
    view: FleetView,
    /// The workers' last note of new buckets, to notice the next one.
    new_mark: u64,
    /// A lease ran out before the last collection: the next sync goes sooner
    /// ([`SyncSchedule::due`]).
    spent_out: bool,
    /// Whether the ruleset in force has a global limit (assumed until a ruleset says).
    global_limits: bool,
    /// A ruleset with global limits replaced one without since the last sync.
    global_limits_arrived: bool,
    failing: bool,
    /// The last sync's `seq`, so the next one is larger even if the clock steps back.
    last_seq: u64,
    /// The lease keys holding entries, as far as this service knows.
    tracked: TrackedSlots,
    /// The last answered sync carried no bucket and left no lease entry in the table:
    /// nothing changes until a worker creates an entry (and notes it), so the proxy syncs
    /// only to stay in the fleet ([`Pace::Idle`]), like one without global limits.
    quiet: bool,
}

/// Every this many syncs, a collection visits the whole lease table even though no new
/// bucket was noted (a note is best effort, and the table may have been resized): a
/// bucket whose note was lost is reported within 16 intervals (4 s at the default).
pub const FULL_SCAN_SYNCS: u32 = 16;

/// Which lease keys a collection visits. Workers note every entry they create
/// (`sluice.global.new`); a collection after a note, the first one, or one every
/// [`FULL_SCAN_SYNCS`] visits every key, the others only the keys the last collection
/// left holding an entry. Collections empty the keys of forgettable entries
/// ([`LeaseTable::collect`]), so the keys visited follow the buckets in use, not the
/// table's size: a proxy with 100 live buckets in a table of 65,536 reads about 100 keys a
/// sync instead of 65,536.
#[derive(Debug, Default)]
struct TrackedSlots {
    /// The keys the last collection left holding an entry, ascending.
    occupied: Vec<u32>,
    /// The table size they belong to; `None` before the first whole visit.
    table_slots: Option<u32>,
    syncs_since_whole: u32,
}

impl TrackedSlots {
    /// Collects from `table`: every key if `anything_new` or one is due, else the keys
    /// known to hold entries.
    fn collect<S: SharedStore>(
        &mut self,
        table: LeaseTable,
        store: &S,
        anything_new: bool,
        now: Nanos,
        covers: Nanos,
        view: &FleetView,
    ) -> Collection {
        let whole = anything_new
            || self.table_slots != Some(table.slots())
            || self.syncs_since_whole + 1 >= FULL_SCAN_SYNCS;
        let collection = if whole {
            self.syncs_since_whole = 0;
            self.table_slots = Some(table.slots());
            table.collect(store, table.every_slot(), now, covers, view)
        } else {
            self.syncs_since_whole += 1;
            table.collect(store, self.occupied.iter().copied(), now, covers, view)
        };
        self.occupied.clone_from(&collection.occupied);
        collection
    }
}

#[derive(Debug)]
struct InFlight {
    sent_at: Nanos,
    /// The buckets sent, in the request's order.
    buckets: Vec<u64>,
    /// The sync had nothing to say (it announced an idle gap): once answered, the proxy is
    /// quiet.
    quiet: bool,
}

/// A sync that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncFailure {
    pub message: String,
    /// Whether syncs were succeeding until this one (worth a log line; the rest are not).
    pub started_failing: bool,
}

/// An answered sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    /// Grants written into their entries (an entry another bucket took meanwhile loses
    /// its grant, which errs toward limiting).
    pub applied: usize,
    /// Whether syncs had been failing until this one.
    pub recovered: bool,
}

impl GlobalSyncer {
    pub fn new(sync_interval: Nanos) -> Self {
        GlobalSyncer {
            schedule: SyncSchedule::new(sync_interval),
            pending: BTreeMap::new(),
            in_flight: None,
            view: FleetView {
                sync_interval_ns: sync_interval.get(),
                ..FleetView::ALONE
            },
            new_mark: 0,
            spent_out: false,
            global_limits: true,
            global_limits_arrived: false,
            failing: false,
            last_seq: 0,
            tracked: TrackedSlots::default(),
            quiet: false,
        }
    }

    /// What the workers spend by: publish it after every start, answer and failure.
    pub fn view(&self) -> FleetView {
        self.view
    }

    /// Whether a sync is on its way.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Tells whether the ruleset now in force has a global limit: without one, and with
    /// nothing left to report, the proxy syncs only every
    /// [`crate::global::schedule::IDLE_SYNC_INTERVALS`] intervals; when one arrives, at
    /// once.
    pub fn set_global_limits(&mut self, global_limits: bool) {
        self.global_limits_arrived |= global_limits && !self.global_limits;
        self.global_limits = global_limits;
    }

    /// How soon the next sync may go: in a hurry when the workers' new-bucket mark moved,
    /// global limits arrived, or a lease ran out before the last collection (only while
    /// coordinated: on fallback shares nothing sooner would come of it but load on a
    /// coordinator that is struggling); idle when the ruleset has no global limit and no
    /// usage waits to be sent, or when the last answered sync found nothing to say
    /// (`quiet`).
    fn pace(&self, new_buckets_mark: u64) -> Pace {
        let spent_out = self.spent_out && !self.view.fallback;
        if new_buckets_mark != self.new_mark || self.global_limits_arrived || spent_out {
            Pace::Hurry
        } else if (!self.global_limits || self.quiet) && self.pending.is_empty() {
            Pace::Idle
        } else {
            Pace::Interval
        }
    }

    /// At `now`, when a sync is due at its [`Pace`] and none is on its way: collects the
    /// leases' usage and returns the request to send, which then counts as on its way.
    pub fn start<S: SharedStore>(
        &mut self,
        now: Nanos,
        new_buckets_mark: u64,
        leases: Leases<'_, S>,
        proxy_id: &str,
    ) -> Option<SyncRequest> {
        if self.in_flight.is_some() || !self.schedule.due(now, self.pace(new_buckets_mark)) {
            return None;
        }
        let anything_new = new_buckets_mark != self.new_mark;
        self.new_mark = new_buckets_mark;
        self.spent_out = false;
        self.global_limits_arrived = false;
        let covers = self.schedule.covers(now);
        // No worker configured yet: nothing to collect, but the sync still tells the
        // coordinator this proxy is part of the fleet.
        // A quiet proxy's sync (every `IDLE_SYNC_INTERVALS`) visits the whole table: a
        // bucket whose note was lost is reported within that gap, as between whole visits.
        let whole = anything_new || self.quiet;
        if let Some(table) = leases.table {
            let collection =
                self.tracked
                    .collect(table, leases.store, whole, now, covers, &self.view);
            for collected in collection.collected {
                self.spent_out |= collected.spent_out;
                let (latest, usage) = self
                    .pending
                    .entry(collected.bucket)
                    .or_insert((collected, Usage::default()));
                *latest = collected;
                usage.merge(&collected.usage);
            }
        }
        let buckets: Vec<u64> = self.pending.keys().copied().collect();
        // Nothing to report and no entry left: until a worker notes a new one, the next
        // sync is only a keep-alive. (No table yet counts as no entry.)
        let quiet = buckets.is_empty() && self.tracked.occupied.is_empty();
        // The wall clock in milliseconds, so that a restarted proxy (whose count starts
        // again) still goes on from where its id left off; never less than one more than
        // the last, so that a clock stepping back does not get this proxy's syncs refused.
        self.last_seq = (now.get() / 1_000_000).max(self.last_seq.saturating_add(1));
        let (in_force_ms, configured_ms) = (
            self.schedule.interval().as_millis(),
            self.schedule.configured().as_millis(),
        );
        let request = SyncRequest {
            seq: self.last_seq,
            proxy: proxy_id.to_string(),
            interval_ms: in_force_ms,
            covers_ms: covers.as_millis(),
            buckets: self
                .pending
                .iter()
                .map(|(bucket, (c, usage))| {
                    BucketUsage::new(*bucket, c.interval_ns, c.burst, usage)
                        .stretched_from(configured_ms, in_force_ms)
                })
                .collect(),
            // Without a global limit, or with nothing to say, the next sync may be an idle
            // one: the coordinator must not take the silence until then for a failure.
            next_sync_ms: if self.global_limits && !quiet {
                0
            } else {
                self.schedule.configured().as_millis() * IDLE_SYNC_INTERVALS
            },
        };
        self.in_flight = Some(InFlight {
            sent_at: now,
            buckets,
            quiet,
        });
        Some(request)
    }

    /// How long to wait for an answer: one later than two intervals is no use, the next
    /// sync carries the usage.
    pub fn timeout(&self) -> Nanos {
        Nanos::new(2 * self.schedule.interval().get())
            .clamp(Nanos::from_millis(500), Nanos::from_secs(5))
    }

    /// The host would not send the sync started at `now`.
    pub fn not_sent(&mut self, why: &str) -> SyncFailure {
        match self.in_flight.take() {
            Some(call) => self.failed(call.sent_at, format!("cannot send a sync: {why}")),
            None => self.failed(Nanos::ZERO, format!("cannot send a sync: {why}")),
        }
    }

    /// Takes the answer to the sync on its way, received at `now`, and applies its grants.
    pub fn answered<S: SharedStore>(
        &mut self,
        now: Nanos,
        answer: Answer<'_>,
        leases: Leases<'_, S>,
    ) -> Result<Synced, SyncFailure> {
        let Some(call) = self.in_flight.take() else {
            return Ok(Synced {
                applied: 0,
                recovered: false,
            });
        };
        // Answered or not, a slow round trip stretches the interval (a sync given up on
        // waited the whole timeout); the next request and the view carry the new one.
        self.schedule.adapt(now.saturating_sub(call.sent_at));
        let response = match (answer.status, answer.body) {
            (Some(200), Some(body)) => SyncResponse::from_json(body)
                .map_err(|e| format!("the admin API sent an unreadable sync answer: {e}")),
            (Some(200), None) => Err("the admin API sent an empty sync answer".to_string()),
            (Some(status), body) => Err(format!(
                "the admin API answered a sync with HTTP {status}{}",
                body.map(problem_summary).unwrap_or_default()
            )),
            (None, _) => Err("the admin API did not answer a sync".to_string()),
        }
        .and_then(|response| {
            if response.grants.len() == call.buckets.len() {
                Ok(response)
            } else {
                Err("the admin API answered a sync with the wrong number of grants".to_string())
            }
        });
        let response = match response {
            Ok(response) => response,
            Err(message) => return Err(self.failed(call.sent_at, message)),
        };
        self.schedule.record(call.sent_at, true);
        self.view = FleetView {
            fleet_size: response.fleet_size.max(1),
            fallback: response.warming_up,
            sync_interval_ns: self.schedule.interval().get(),
        };
        let mut applied = 0;
        if let Some(table) = leases.table {
            for (bucket, grant) in call.buckets.iter().zip(&response.grants) {
                if let Some((collected, _)) = self.pending.get(bucket)
                    && table.apply(leases.store, collected, grant, now, &self.view)
                {
                    applied += 1;
                }
            }
        }
        self.pending.clear();
        self.quiet = call.quiet;
        let recovered = std::mem::replace(&mut self.failing, false);
        Ok(Synced { applied, recovered })
    }

    fn failed(&mut self, sent_at: Nanos, message: String) -> SyncFailure {
        self.schedule.record(sent_at, false);
        self.view.fallback = true;
        self.view.sync_interval_ns = self.schedule.interval().get();
        // Retried every interval until answered: a coordinator that lost the proxy must
        // count it again soon.
        self.quiet = false;
        SyncFailure {
            message,
            started_failing: !std::mem::replace(&mut self.failing, true),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::gcra::Gcra;
    use crate::global::coordinator::{Grant, PPM};
    use crate::store::MemoryStore;

    const T: u64 = 500_000_000;
    const START: u64 = 1_700_000_000_000_000_000;

    struct Proxy {
        store: MemoryStore,
        table: LeaseTable,
        syncer: GlobalSyncer,
        limit: Gcra,
    }

    impl Proxy {
        fn new() -> Self {
            Proxy {
                store: MemoryStore::new(),
                table: LeaseTable::new(NonZeroU32::new(64).unwrap()),
                syncer: GlobalSyncer::new(Nanos::new(T)),
                limit: Gcra::per_second(10, 10).unwrap(),
            }
        }

        fn spend(&self, bucket: u64, now: u64) {
            let view = self.syncer.view();
            self.table
                .spend(&self.store, bucket, &self.limit, 1, Nanos::new(now), &view)
                .unwrap();
        }

        fn start(&mut self, now: u64, mark: u64) -> Option<SyncRequest> {
            let leases = Leases {
                table: Some(self.table),
                store: &self.store,
            };
            self.syncer.start(Nanos::new(now), mark, leases, "edge-1")
        }

        fn reply(&mut self, now: u64, answer: Answer<'_>) -> Result<Synced, SyncFailure> {
            let leases = Leases {
                table: Some(self.table),
                store: &self.store,
            };
            self.syncer.answered(Nanos::new(now), answer, leases)
        }

        fn answer(&mut self, now: u64, body: &str) -> Result<Synced, SyncFailure> {
            self.reply(now, Answer::new(Some(200), Some(body.as_bytes())))
        }
    }

    fn grants(fleet_size: u32, granted: &[u64]) -> String {
        let grants: Vec<Grant> = granted
            .iter()
            .map(|&granted| Grant {
                granted,
                share_ppm: PPM / 2,
                full_in_ns: 0,
                young: false,
            })
            .collect();
        serde_json::json!({"fleet_size": fleet_size, "warming_up": false, "grants": grants})
            .to_string()
    }

    #[test]
    fn syncs_every_interval_and_sooner_for_a_new_bucket() {
        let mut proxy = Proxy::new();
        let first = proxy.start(START, 0).expect("the first sync is at once");
        assert!(
            first.buckets.is_empty(),
            "nothing spent yet, but the proxy joins the fleet"
        );
        assert!(
            proxy.start(START, 0).is_none(),
            "one sync on its way at a time"
        );
        proxy.answer(START + 1, &grants(2, &[])).unwrap();
        assert_eq!(proxy.syncer.view().fleet_size, 2);
        assert!(!proxy.syncer.view().fallback);
        assert!(proxy.start(START + T / 2, 0).is_none(), "not due");
        proxy.spend(7, START + T / 2);
        let early = proxy
            .start(START + T / 2, 1)
            .expect("a new bucket syncs early");
        assert_eq!(early.buckets.len(), 1);
        assert_eq!((early.buckets[0].bucket, early.buckets[0].attempts), (7, 1));
        assert_eq!(
            early.covers_ms,
            T / 2 / 1_000_000,
            "the time since the last answer"
        );
        assert_eq!(first.seq, START / 1_000_000, "the clock in milliseconds");
        assert_eq!(early.seq, (START + T / 2) / 1_000_000);
    }

    /// A lease spent out before a collection makes the next sync go after
    /// [`crate::global::schedule::EARLY_SYNC`] rather than a whole interval, while the
    /// coordinator answers; a lease that lasts, or a proxy on fallback shares, keeps the
    /// interval.
    #[test]
    fn a_lease_that_ran_out_brings_the_next_sync_forward_while_coordinated() {
        use crate::global::schedule::EARLY_SYNC;
        let early = EARLY_SYNC.get();
        let mut proxy = Proxy::new();
        proxy.start(START, 0).unwrap();
        proxy.answer(START + 1, &grants(2, &[])).unwrap();
        // Bucket 7 settles with a lease of 2 tokens.
        proxy.spend(7, START + 10);
        proxy.start(START + early, 1).expect("new bucket: early");
        proxy.answer(START + early + 1, &grants(2, &[2])).unwrap();

        // One token of two spent: the lease lasted, the interval holds.
        proxy.spend(7, START + early + 2);
        let at = START + early + T;
        assert!(
            proxy.start(at - 1, 1).is_none(),
            "not due before the interval"
        );
        proxy.start(at, 1).expect("due at the interval");
        proxy.answer(at + 1, &grants(2, &[2])).unwrap();
        assert!(
            proxy.start(at + early, 1).is_none(),
            "a lease that lasted does not hurry the sync after it"
        );

        // Three attempts against a lease of 3 (1 left + 2): spent out, so the sync after
        // the next goes early.
        for k in 0..4 {
            proxy.spend(7, at + 2 + k);
        }
        let spent = at + T;
        proxy.start(spent, 1).expect("due at the interval");
        proxy.answer(spent + 1, &grants(2, &[1])).unwrap();
        assert!(proxy.start(spent + early - 1, 1).is_none());
        proxy
            .start(spent + early, 1)
            .expect("spent out: the next sync is early");

        // On fallback (the coordinator did not answer), spending out does not hurry.
        for k in 0..4 {
            proxy.spend(7, spent + early + 2 + k);
        }
        proxy
            .reply(spent + early + 10, Answer::new(None, None))
            .unwrap_err();
        assert!(proxy.syncer.view().fallback);
        let failed = spent + early + T;
        assert!(
            proxy.start(failed - 1, 1).is_none(),
            "no hurry on fallback shares"
        );
        proxy.start(failed, 1).expect("retried at the interval");
        proxy
            .reply(failed + 1, Answer::new(None, None))
            .unwrap_err();
        assert!(
            proxy.start(failed + early, 1).is_none(),
            "no hurry on fallback shares"
        );
    }

    /// Without a global limit in the ruleset, a proxy syncs only to stay in the fleet:
    /// every `IDLE_SYNC_INTERVALS` intervals, and not before usage it still holds is sent.
    /// A ruleset with global limits brings the next sync forward, and the first use of a
    /// global bucket the interval.
    #[test]
    fn without_global_limits_a_proxy_syncs_rarely_until_they_arrive() {
        use crate::global::schedule::{EARLY_SYNC, IDLE_SYNC_INTERVALS};
        let early = EARLY_SYNC.get();
        let idle = T * IDLE_SYNC_INTERVALS;
        let mut proxy = Proxy::new();
        proxy.spend(7, START);
        proxy.syncer.set_global_limits(false);
        let sent = proxy.start(START, 1).expect("the first sync is at once");
        assert_eq!(sent.buckets.len(), 1, "what was spent is still reported");
        proxy.reply(START + 1, Answer::new(None, None)).unwrap_err();
        assert!(
            proxy.start(START + T, 1).is_some(),
            "usage not yet answered keeps the interval"
        );
        proxy.answer(START + T + 1, &grants(2, &[0])).unwrap();

        let last = START + T;
        assert!(
            proxy.start(last + T, 1).is_none(),
            "idle: not every interval"
        );
        assert!(proxy.start(last + idle - 1, 1).is_none());
        let idle_sync = proxy
            .start(last + idle, 1)
            .expect("idle: to stay in the fleet");
        assert!(idle_sync.buckets.is_empty());
        assert_eq!(
            idle_sync.next_sync_ms,
            idle / 1_000_000,
            "says when it syncs next"
        );
        proxy.answer(last + idle + 1, &grants(2, &[])).unwrap();

        proxy.syncer.set_global_limits(true);
        proxy.syncer.set_global_limits(true);
        assert!(proxy.start(last + idle + early - 1, 1).is_none());
        let woken = proxy
            .start(last + idle + early, 1)
            .expect("global limits arrived: at once");
        assert_eq!(
            woken.next_sync_ms,
            idle / 1_000_000,
            "nothing spent yet: quiet until a worker uses a global bucket"
        );
        proxy
            .answer(last + idle + early + 1, &grants(2, &[]))
            .unwrap();
        assert!(proxy.start(last + idle + early + T, 1).is_none());
        proxy.spend(8, last + idle + early + T);
        let used = proxy
            .start(last + idle + early + T, 2)
            .expect("a new bucket: at once");
        assert_eq!((used.buckets.len(), used.next_sync_ms), (1, 0));
        proxy
            .answer(last + idle + early + T + 1, &grants(2, &[2]))
            .unwrap();
        assert!(
            proxy.start(last + idle + early + T + early, 2).is_none(),
            "then at the interval"
        );
        assert!(proxy.start(last + idle + early + 2 * T, 2).is_some());
    }

    /// A proxy whose syncs have nothing to say (no bucket to report, no entry left in the
    /// table) syncs only every `IDLE_SYNC_INTERVALS` intervals, and says so; a worker's new
    /// entry brings the next sync at once, and the interval back until the entries are
    /// forgotten again. The keep-alive visits the whole table (a bucket whose note was
    /// lost is reported by it), and one that fails is retried at the interval.
    #[test]
    fn a_proxy_with_nothing_to_say_sends_only_keep_alives() {
        use crate::global::schedule::{EARLY_SYNC, IDLE_SYNC_INTERVALS};
        let early = EARLY_SYNC.get();
        let idle = T * IDLE_SYNC_INTERVALS;
        let mut proxy = Proxy::new();
        let first = proxy.start(START, 0).expect("the first sync is at once");
        assert_eq!(first.next_sync_ms, idle / 1_000_000, "announces the gap");
        proxy.answer(START + 1, &grants(2, &[])).unwrap();
        assert!(
            proxy.start(START + T, 0).is_none(),
            "quiet: not every interval"
        );
        assert!(proxy.start(START + idle - 1, 0).is_none());

        // A bucket spent without a note (a note is best effort): found by the keep-alive's
        // visit of the whole table.
        proxy.spend(9, START + T);
        let before = proxy.store.reads();
        let keep_alive = proxy.start(START + idle, 0).expect("the keep-alive");
        assert!(proxy.store.reads() - before >= 64, "a whole visit");
        assert_eq!(keep_alive.buckets.len(), 1);
        assert_eq!(keep_alive.next_sync_ms, 0, "something to say: the interval");
        proxy.answer(START + idle + 1, &grants(2, &[0])).unwrap();

        // Entries in use keep the interval; once forgotten, the proxy is quiet again.
        let mut now = START + idle;
        let mut syncs = 0;
        loop {
            now += T;
            let request = proxy
                .start(now, 0)
                .expect("an entry in the table: the interval");
            syncs += 1;
            let granted = vec![0; request.buckets.len()];
            proxy.answer(now + 1, &grants(2, &granted)).unwrap();
            if request.next_sync_ms > 0 {
                break;
            }
            assert!(syncs < 20, "the idle entry is never forgotten");
        }
        assert!(proxy.start(now + T, 0).is_none(), "quiet again");

        // A noted new bucket: at once, whatever the keep-alive's gap.
        proxy.spend(7, now + T);
        let woken = proxy.start(now + early, 1).expect("a new bucket: at once");
        assert_eq!((woken.buckets.len(), woken.next_sync_ms), (1, 0));
        proxy.answer(now + early + 1, &grants(2, &[2])).unwrap();
        assert!(
            proxy.start(now + early + T, 1).is_some(),
            "then every interval"
        );

        // A keep-alive that fails is retried at the interval.
        let mut quiet = Proxy::new();
        quiet.start(START, 0).unwrap();
        quiet.answer(START + 1, &grants(2, &[])).unwrap();
        quiet.start(START + idle, 0).unwrap();
        quiet
            .reply(START + idle + 1, Answer::new(None, None))
            .unwrap_err();
        assert!(
            quiet.start(START + idle + T, 0).is_some(),
            "retried at the interval"
        );
    }

    /// Between whole visits of the lease table (the first sync, a new bucket's note, every
    /// `FULL_SCAN_SYNCS`), a collection reads only the keys that held entries: one live
    /// bucket in a table of 64 keys costs a couple of reads a sync, not 64. A bucket
    /// created without a note (a note is best effort) is still reported by the next whole
    /// visit.
    #[test]
    fn collections_read_the_keys_in_use_and_the_whole_table_now_and_then() {
        let mut proxy = Proxy::new();
        proxy.spend(7, START);
        let reads = |proxy: &Proxy| proxy.store.reads();
        let before = reads(&proxy);
        proxy.start(START, 1).expect("the first sync");
        assert!(
            reads(&proxy) - before >= 64,
            "the first collection reads every key"
        );
        proxy.answer(START + 1, &grants(2, &[5])).unwrap();

        let mut now = START;
        let mut syncs = 1;
        // Bucket 9 appears without a note (the mark stays 1).
        proxy.spend(9, START + 2);
        let reported_9 = loop {
            proxy.spend(7, now + 2);
            now += T;
            let before = reads(&proxy);
            let request = proxy.start(now, 1).expect("due every interval");
            syncs += 1;
            let read = reads(&proxy) - before;
            let buckets: Vec<u64> = request.buckets.iter().map(|b| b.bucket).collect();
            if buckets.contains(&9) {
                assert!(read >= 64, "found by a whole visit");
                break syncs;
            }
            assert!(read <= 3, "sync {syncs} read {read} keys for one bucket");
            let granted = vec![1; buckets.len()];
            proxy.answer(now + 1, &grants(2, &granted)).unwrap();
            assert!(syncs < 100, "bucket 9 never reported");
        };
        assert_eq!(reported_9, FULL_SCAN_SYNCS as usize + 1);

        // A new bucket's note brings a whole visit at once.
        proxy.answer(now + 1, &grants(2, &[1, 1])).unwrap();
        proxy.spend(11, now + 2);
        now += T;
        let before = reads(&proxy);
        let request = proxy.start(now, 2).expect("due");
        assert!(reads(&proxy) - before >= 64);
        assert!(request.buckets.iter().any(|b| b.bucket == 11));
    }

    /// The coordinator refuses a sync whose `seq` is not larger than the last: a clock that
    /// steps back must not get a proxy's syncs refused.
    #[test]
    fn every_sync_has_a_larger_seq_even_when_the_clock_steps_back() {
        let mut proxy = Proxy::new();
        let first = proxy.start(START, 0).unwrap();
        proxy.answer(START, &grants(1, &[])).unwrap();
        let stepped_back = START - 60_000_000_000;
        // The schedule sees time going back too; a full interval later by its reckoning.
        proxy.syncer.schedule = SyncSchedule::new(Nanos::new(T));
        let second = proxy.start(stepped_back, 0).unwrap();
        assert_eq!(second.seq, first.seq + 1);
    }

    #[test]
    fn grants_reach_the_entries_they_were_asked_for() {
        let mut proxy = Proxy::new();
        proxy.spend(7, START);
        proxy.spend(9, START);
        let request = proxy.start(START, 1).unwrap();
        let asked: Vec<u64> = request.buckets.iter().map(|b| b.bucket).collect();
        assert_eq!(asked, [7, 9]);
        let synced = proxy.answer(START + 1, &grants(2, &[4, 6])).unwrap();
        assert_eq!(
            synced,
            Synced {
                applied: 2,
                recovered: false
            }
        );
        // Bucket 9's lease holds its 6 (beside what its entry reports): collect shows a
        // balance, not new attempts.
        let next = proxy.start(START + T, 1).unwrap();
        assert!(next.buckets.iter().all(|b| b.attempts == 0), "{next:?}");
        // What its part of the burst (a half of 10) does not cover goes back.
        assert!(
            next.buckets
                .iter()
                .any(|b| b.bucket == 9 && b.returned == 1),
            "a lease beyond this proxy's part goes back: {next:?}"
        );
    }

    #[test]
    fn usage_that_could_not_be_sent_goes_with_the_next_sync() {
        let mut proxy = Proxy::new();
        proxy.spend(7, START);
        proxy.spend(7, START);
        proxy.start(START, 1).unwrap();
        let failure = proxy.reply(START + 1, Answer::NONE).unwrap_err();
        assert!(failure.started_failing);
        assert!(failure.message.contains("did not answer"));
        assert!(
            proxy.syncer.view().fallback,
            "workers keep to their fallback shares"
        );

        proxy.spend(7, START + T);
        let retry = proxy.start(START + T, 1).unwrap();
        assert_eq!(retry.buckets.len(), 1);
        assert_eq!(retry.buckets[0].attempts, 3, "two unsent and one new");
        assert_eq!(
            retry.covers_ms,
            T / 1_000_000,
            "covers the time since the last answer"
        );
        let again = proxy
            .reply(START + T, Answer::new(Some(503), None))
            .unwrap_err();
        assert!(!again.started_failing, "logged once");
        assert!(again.message.contains("HTTP 503"));
        assert_eq!(again.message, "the admin API answered a sync with HTTP 503");

        proxy.start(START + 2 * T, 1).unwrap();
        let synced = proxy.answer(START + 2 * T, &grants(1, &[5])).unwrap();
        assert!(synced.recovered);
        assert!(!proxy.syncer.view().fallback);
    }

    #[test]
    fn an_answer_that_does_not_fit_the_request_is_a_failure() {
        let mut proxy = Proxy::new();
        proxy.spend(7, START);
        proxy.start(START, 1).unwrap();
        let failure = proxy.answer(START, &grants(2, &[1, 2])).unwrap_err();
        assert!(failure.message.contains("wrong number of grants"));
        proxy.start(START + T, 1).unwrap();
        let failure = proxy.answer(START + T, "{\"fleet_size\":").unwrap_err();
        assert!(failure.message.contains("unreadable"));
        assert_eq!(
            proxy.start(START + 2 * T, 1).unwrap().buckets[0].attempts,
            1,
            "the usage is still there"
        );
    }

    #[test]
    fn a_warming_coordinator_keeps_the_workers_on_their_fallback_shares() {
        let mut proxy = Proxy::new();
        proxy.start(START, 0).unwrap();
        let body = serde_json::json!({"fleet_size": 3, "warming_up": true, "grants": []});
        proxy.answer(START, &body.to_string()).unwrap();
        assert!(proxy.syncer.view().fallback);
        assert_eq!(proxy.syncer.view().fleet_size, 3);
    }

    /// A slow answer (or none, given up on after the timeout) stretches the interval the
    /// next sync is due at, tells the coordinator and the workers, and fast answers bring
    /// it back to the configured one.
    #[test]
    fn slow_answers_stretch_the_interval_and_fast_ones_bring_it_back() {
        let mut proxy = Proxy::new();
        // A bucket in use, so that the proxy syncs every interval (not quiet).
        proxy.spend(7, START);
        let sync_at = |proxy: &mut Proxy, sent: u64, took: u64| {
            let request = proxy.start(sent, 1).expect("due");
            let body = grants(1, &[5].repeat(request.buckets.len()));
            proxy.answer(sent + took, &body).unwrap();
            request
        };
        sync_at(&mut proxy, START, T / 2);
        assert_eq!(proxy.syncer.view().sync_interval_ns, T, "half: not slow");
        let sent = START + T;
        let request = sync_at(&mut proxy, sent, T / 2 + 1);
        assert_eq!(request.interval_ms, T / 1_000_000);
        assert_eq!(request.buckets[0].demand_interval_ms, 0, "not stretched");
        assert_eq!(proxy.syncer.view().sync_interval_ns, 2 * T);
        assert!(
            proxy.start(sent + 2 * T - 1, 1).is_none(),
            "the stretched interval"
        );
        let sent = sent + 2 * T;
        let request = proxy.start(sent, 1).unwrap();
        assert_eq!(
            request.interval_ms,
            2 * T / 1_000_000,
            "the coordinator is told"
        );
        assert_eq!(
            request.buckets[0].demand_interval_ms,
            T / 1_000_000,
            "and the configured interval, which it reads demand against"
        );
        let timeout = proxy.syncer.timeout().get();
        proxy
            .reply(sent + timeout, Answer::new(None, None))
            .unwrap_err();
        assert_eq!(
            proxy.syncer.view().sync_interval_ns,
            4 * T,
            "given up on: slow"
        );

        let sent = sent + 4 * T;
        sync_at(&mut proxy, sent, 1);
        assert_eq!(proxy.syncer.view().sync_interval_ns, 4 * T - T / 4);
        assert!(proxy.start(sent + 4 * T - T / 4 - 1, 1).is_none());
        assert!(proxy.start(sent + 4 * T - T / 4, 1).is_some());
    }

    #[test]
    fn a_sync_the_host_would_not_send_is_retried_next_interval() {
        let mut proxy = Proxy::new();
        proxy.spend(7, START);
        proxy.start(START, 1).unwrap();
        let failure = proxy.syncer.not_sent("BadArgument");
        assert_eq!(failure.message, "cannot send a sync: BadArgument");
        assert!(!proxy.syncer.in_flight());
        assert!(
            proxy.start(START + T / 2, 1).is_none(),
            "not before the interval"
        );
        assert_eq!(proxy.start(START + T, 1).unwrap().buckets[0].attempts, 1);
    }
}
