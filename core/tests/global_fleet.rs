//! A fleet of simulated proxies and one coordinator, run on a simulated clock: the lease
//! arithmetic of `sluice_core::global` checked against the bounds `docs/global-limits.md`
//! states. Real Envoys are exercised by `tests/`; this covers the arithmetic exhaustively
//! and deterministically, including outages, in milliseconds.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use proptest::prelude::*;
use sluice_core::gcra::Gcra;
use sluice_core::global::DEFAULT_SYNC_INTERVAL_NS;
use sluice_core::global::coordinator::{BucketState, Grant, Settings, Usage, settle};
use sluice_core::global::lease::{FleetView, LeaseEntry};
use sluice_core::global::schedule::{CONTROL_TICK, Pace, SyncSchedule};
use sluice_core::time::{NANOS_PER_SECOND as S, Nanos};

const MS: u64 = 1_000_000;

/// One proxy: its lease entries (shared data in Envoy), the usage it could not send yet,
/// and what its workers know of the fleet.
struct Proxy {
    entries: HashMap<u64, LeaseEntry>,
    pending: HashMap<u64, Usage>,
    view: FleetView,
    schedule: SyncSchedule,
    /// The answer on its way. A control service sends no sync while one is.
    in_flight: Option<Answer>,
    /// A lease ran out before the last collection, as the control service notes it.
    spent_out: bool,
}

/// An answer on its way to a proxy: when it arrives, the view it brings, and each bucket's
/// grant.
struct Answer {
    at: u64,
    view: FleetView,
    grants: Vec<(u64, Grant)>,
    /// The coordinator settled the sync, but its answer never reaches the proxy (it timed
    /// out on the way): the usages it reported, which the proxy still holds as unsent.
    lost: Option<Vec<(u64, Usage)>>,
    /// A remote region's sync ([`Remote`]): settled at the shared state later than sent,
    /// and answered (or timed out) later still.
    remote: Option<RemoteCall>,
}

/// A remote region's sync on its way through its replica to the shared state.
struct RemoteCall {
    sent_at: u64,
    /// When the replica's write lands at the shared state (`None`: it never does, the
    /// link being cut or slower than the replica's Redis timeout).
    settle_at: Option<u64>,
    covers: Nanos,
    /// The interval in force when sent: the coordinator sizes leases and shares by it.
    interval: u64,
    /// The answer reaches the proxy within its sync timeout.
    answered: bool,
}

/// A second region: its proxies sync with their own `sluice serve` replica, which reads
/// and writes the shared state (Redis, in the home region) over a slow link. The home
/// region's proxies and replica are as everywhere else in this file.
#[derive(Debug, Clone, Copy)]
struct Remote {
    /// Proxies from this index on are the remote region's.
    first: usize,
    /// The link's round trip.
    rtt: u64,
    /// When the link is cut: every Redis call of the remote replica times out.
    cut: LinkCut,
}

/// When a link is cut, by the time.
type LinkCut = fn(u64) -> bool;

/// Sequential Redis round trips of one replica's batch (`coordinator/src/redis/batcher.rs`:
/// the clock, fleet and reads' pipeline; the compare-and-set and sorted sets' pipeline),
/// and the one in which its write lands at the shared state (half way through the
/// second). A sync joins the replica's next batch: the remote replica is taken to be
/// always busy (its batches back to back from the run's start), so a sync first waits
/// for the batch in flight, up to one batch.
const BATCH_ROUND_TRIPS: u64 = 2;
const WRITE_ROUND_TRIPS: f64 = 1.5;
/// A replica's Redis command timeout (`coordinator/src/redis/link.rs`).
const REDIS_TIMEOUT: u64 = 1_000 * MS;

struct Coordinator {
    buckets: HashMap<u64, BucketState>,
    settings: Settings,
    up: bool,
}

struct Fleet {
    proxies: Vec<Proxy>,
    coordinator: Coordinator,
    /// The limit every bucket enforces, unless `bands` names another.
    limit: Gcra,
    /// Buckets from an id on enforce another limit: `(first bucket, limit)`, ascending;
    /// the last band that starts at or below a bucket applies. Empty unless a test says.
    bands: Vec<(u64, Gcra)>,
    /// How long an answer takes to come back (5 ms unless a test says otherwise, as on
    /// loopback under load). Workers keep spending meanwhile, as in Envoy.
    answer_delay: u64,
    /// Which syncs the coordinator settles but whose answers are lost, by their number
    /// (counted from 0 over the whole fleet): none unless a test says so.
    lose_answer: SyncPattern,
    /// Which proxies cannot reach the coordinator when (a partial partition): their syncs
    /// fail before the coordinator sees them. None unless a test says so.
    cut_off: CutOff,
    syncs: u64,
    /// Requests admitted so far, all proxies and buckets.
    admitted: u64,
    /// Requests refused at a proxy that had had a lease for the bucket: what a limit the
    /// traffic stays under must never do (`docs/global-limits.md`, "Below the limit").
    refused_leased: u64,
    /// Which proxies have had a lease for which buckets: `(proxy, bucket)`.
    leased: HashSet<(usize, u64)>,
    /// When each bucket saw its first request, fleet-wide: its `burst + rate × elapsed`
    /// counts from then.
    first_request: HashMap<u64, u64>,
    /// A second region behind a slow link (none unless a test says so).
    remote: Option<Remote>,
}

/// Which syncs, by their number over the whole fleet (from 0).
type SyncPattern = fn(u64) -> bool;
/// Which proxy, by its index, cannot reach the coordinator at a time.
type CutOff = fn(usize, u64) -> bool;

/// How long a control service waits for an answer: two intervals, at least 500 ms
/// (`GlobalSyncer::timeout`).
const SYNC_TIMEOUT: u64 = 500 * MS;

impl Fleet {
    /// `proxies` proxies syncing every `interval`, staggered across it, each having synced
    /// once (empty) before the traffic starts, as Envoys do when they start.
    fn new(proxies: usize, limit: Gcra, interval: u64) -> Self {
        let view = FleetView {
            fleet_size: proxies as u32,
            fallback: false,
            sync_interval_ns: interval,
        };
        Self {
            proxies: (0..proxies)
                .map(|p| {
                    let mut schedule = SyncSchedule::new(Nanos::new(interval));
                    schedule.record(
                        Nanos::new(S - interval + interval * p as u64 / proxies as u64),
                        true,
                    );
                    Proxy {
                        entries: HashMap::new(),
                        pending: HashMap::new(),
                        view,
                        schedule,
                        in_flight: None,
                        spent_out: false,
                    }
                })
                .collect(),
            coordinator: Coordinator {
                buckets: HashMap::new(),
                settings: Settings {
                    fleet_size: proxies as u32,
                    ..Settings::for_interval(Nanos::new(interval))
                },
                up: true,
            },
            limit,
            bands: Vec::new(),
            answer_delay: 5 * MS,
            lose_answer: |_| false,
            cut_off: |_, _| false,
            syncs: 0,
            admitted: 0,
            refused_leased: 0,
            leased: HashSet::new(),
            first_request: HashMap::new(),
            remote: None,
        }
    }

    /// One request of one token for `bucket` at proxy `p`; true when admitted.
    fn request(&mut self, p: usize, bucket: u64, now: u64) -> bool {
        let limit = limit_of(self.limit, &self.bands, bucket);
        let proxy = &mut self.proxies[p];
        let view = proxy.view;
        let first_request = &mut self.first_request;
        let entry = proxy.entries.entry(bucket).or_insert_with(|| {
            first_request.entry(bucket).or_insert(now);
            LeaseEntry::new(bucket, &limit, Nanos::new(now))
        });
        let admitted = entry.spend(1, Nanos::new(now), &view).admitted();
        self.admitted += u64::from(admitted);
        if !admitted && self.leased.contains(&(p, bucket)) {
            self.refused_leased += 1;
        }
        admitted
    }

    /// Runs every sync that is due at `now`. A control service looks on its tick only, and
    /// each proxy's ticks have their own phase.
    fn sync_due(&mut self, now: u64) {
        for p in 0..self.proxies.len() {
            self.settle_remote(p, now);
            if self.proxies[p]
                .in_flight
                .as_ref()
                .is_some_and(|answer| answer.at <= now)
            {
                self.answer(p, now);
            }
            let on_tick = (now + p as u64 * 17 * MS) % CONTROL_TICK.get() == 0;
            if !on_tick || self.proxies[p].in_flight.is_some() {
                continue;
            }
            let proxy = &self.proxies[p];
            let new_buckets = proxy.entries.values().any(|e| !e.settled);
            let pace = if new_buckets || (proxy.spent_out && !proxy.view.fallback) {
                Pace::Hurry
            } else {
                Pace::Interval
            };
            if proxy.schedule.due(Nanos::new(now), pace) {
                self.sync(p, now);
            }
        }
    }

    fn sync(&mut self, p: usize, now: u64) {
        let fleet_size = self.proxies.len() as u32;
        let proxy = &mut self.proxies[p];
        let covers = proxy.schedule.covers(Nanos::new(now));
        proxy.spent_out = false;
        for (bucket, entry) in &mut proxy.entries {
            proxy.spent_out |= entry.spent_out(Nanos::new(now));
            let usage = entry.collect(Nanos::new(now), covers, &proxy.view);
            proxy.pending.entry(*bucket).or_default().merge(&usage);
        }
        if let Some(remote) = self.remote.filter(|r| p >= r.first) {
            self.send_remote(p, now, covers, remote);
            return;
        }
        let proxy = &mut self.proxies[p];
        let lost = (self.lose_answer)(self.syncs);
        let failed = (self.cut_off)(p, now);
        self.syncs += 1;
        proxy
            .schedule
            .record(Nanos::new(now), self.coordinator.up && !lost && !failed);
        if !self.coordinator.up || failed {
            proxy.view.fallback = true;
            return;
        }
        let reported: Vec<(u64, Usage)> = if lost {
            proxy.pending.iter().map(|(b, u)| (*b, *u)).collect()
        } else {
            Vec::new()
        };
        let view = FleetView {
            fallback: self.coordinator.settings.warming_up,
            fleet_size,
            ..proxy.view
        };
        let grants = proxy
            .pending
            .drain()
            .map(|(bucket, usage)| {
                let limit = limit_of(self.limit, &self.bands, bucket);
                let state = self.coordinator.buckets.entry(bucket).or_default();
                let grant = settle(
                    state,
                    &limit,
                    &usage,
                    covers,
                    Nanos::new(now),
                    &self.coordinator.settings,
                );
                (bucket, grant)
            })
            .collect();
        proxy.in_flight = Some(if lost {
            Answer {
                at: now + SYNC_TIMEOUT,
                view,
                grants: Vec::new(),
                lost: Some(reported),
                remote: None,
            }
        } else {
            Answer {
                at: now + self.answer_delay,
                view,
                grants,
                lost: None,
                remote: None,
            }
        });
        if self.answer_delay == 0 && !lost {
            self.answer(p, now);
        }
    }

    /// Applies proxy `p`'s answer now (an answer without delay arrives with its sync).
    fn answer(&mut self, p: usize, now: u64) {
        let proxy = &mut self.proxies[p];
        if let Some(mut answer) = proxy.in_flight.take() {
            if let Some(call) = answer.remote.take() {
                // As the control service does: the interval adapts to the wait, and a
                // sync given up on leaves the usage for the next one (its replica may have
                // settled it all the same: then it is reported twice, which only ever
                // makes the fleet admit less).
                proxy.schedule.adapt(Nanos::new(now - call.sent_at));
                proxy
                    .schedule
                    .record(Nanos::new(call.sent_at), call.answered);
                proxy.view.sync_interval_ns = proxy.schedule.interval().get();
                if !call.answered {
                    proxy.view.fallback = true;
                    return;
                }
                proxy.pending.clear();
                answer.view.sync_interval_ns = proxy.schedule.interval().get();
            }
            if let Some(reported) = answer.lost {
                // As the control service does when a sync fails: fallback shares, and the
                // usage kept for the next sync.
                proxy.view.fallback = true;
                for (bucket, usage) in reported {
                    let mut unsent = usage;
                    if let Some(later) = proxy.pending.get(&bucket) {
                        unsent.merge(later);
                    }
                    proxy.pending.insert(bucket, unsent);
                }
                return;
            }
            proxy.view = answer.view;
            for (bucket, grant) in answer.grants {
                if let Some(entry) = proxy.entries.get_mut(&bucket) {
                    entry.apply(&grant, Nanos::new(now), &proxy.view);
                    if grant.granted > 0 {
                        self.leased.insert((p, bucket));
                    }
                }
            }
        }
    }
}

impl Fleet {
    /// Sends remote proxy `p`'s sync through its replica: its usage stays pending until
    /// answered, as in the control service.
    fn send_remote(&mut self, p: usize, now: u64, covers: Nanos, remote: Remote) {
        let answer_delay = self.answer_delay;
        let proxy = &mut self.proxies[p];
        let interval = proxy.schedule.interval().get();
        // `GlobalSyncer::timeout`: two intervals in force, 500 ms to 5 s.
        let timeout = (2 * interval).clamp(500 * MS, 5 * S);
        let reaches_redis = !(remote.cut)(now) && remote.rtt < REDIS_TIMEOUT;
        let (settle_at, answer_after) = if reaches_redis {
            let batch = BATCH_ROUND_TRIPS * remote.rtt;
            let starts = now.div_ceil(batch) * batch;
            let write = (WRITE_ROUND_TRIPS * remote.rtt as f64) as u64;
            (Some(starts + write), starts - now + batch + answer_delay)
        } else {
            // The replica's first Redis call times out, and it answers 503.
            (None, REDIS_TIMEOUT)
        };
        proxy.in_flight = Some(Answer {
            at: now + answer_after.min(timeout),
            view: proxy.view,
            grants: Vec::new(),
            lost: None,
            remote: Some(RemoteCall {
                sent_at: now,
                settle_at,
                covers,
                interval,
                answered: reaches_redis && answer_after <= timeout,
            }),
        });
    }

    /// Settles remote proxy `p`'s sync at the shared state when its replica's write lands.
    fn settle_remote(&mut self, p: usize, now: u64) {
        let fleet_size = self.proxies.len() as u32;
        let proxy = &mut self.proxies[p];
        let configured = proxy.schedule.configured();
        let Some(answer) = proxy.in_flight.as_mut() else {
            return;
        };
        let Some((covers, interval)) = answer
            .remote
            .as_ref()
            .filter(|call| call.settle_at == Some(now))
            .map(|call| (call.covers, call.interval))
        else {
            return;
        };
        // As the coordinator does: demand read against the configured interval, which
        // a stretched proxy names (`BucketUsage::stretched_from`).
        let settings = Settings {
            fleet_size,
            warming_up: self.coordinator.settings.warming_up,
            ..Settings::for_intervals(Nanos::new(interval), configured)
        };
        answer.view = FleetView {
            fleet_size,
            fallback: settings.warming_up,
            sync_interval_ns: interval,
        };
        answer.grants = proxy
            .pending
            .iter()
            .map(|(bucket, usage)| {
                let limit = limit_of(self.limit, &self.bands, *bucket);
                let state = self.coordinator.buckets.entry(*bucket).or_default();
                let grant = settle(state, &limit, usage, covers, Nanos::new(now), &settings);
                (*bucket, grant)
            })
            .collect();
    }
}

fn limit(per_second: u64, burst: u64) -> Gcra {
    Gcra::per_second(per_second, burst).unwrap()
}

/// The limit `bucket` enforces in a fleet whose buckets enforce `limit` but where
/// `bands` says otherwise ([`Fleet::bands`]).
fn limit_of(limit: Gcra, bands: &[(u64, Gcra)], bucket: u64) -> Gcra {
    bands
        .iter()
        .rev()
        .find(|(first, _)| *first <= bucket)
        .map_or(limit, |(_, band)| *band)
}

/// Deterministic arrivals: each proxy sends `demand × split[p]` requests per second, spread
/// evenly and shaped over time by `shape`, to the buckets `first_client..first_client +
/// clients` it sees (`audience`) in turn.
struct Traffic<'a> {
    demand_per_second: f64,
    split: &'a [f64],
    clients: u64,
    shape: Shape,
    first_client: u64,
    audience: Audience,
}

impl<'a> Traffic<'a> {
    fn steady(demand_per_second: f64, split: &'a [f64], clients: u64) -> Self {
        Traffic {
            demand_per_second,
            split,
            clients,
            shape: Shape::Steady,
            first_client: 0,
            audience: Audience::Everyone,
        }
    }

    /// The `n`th request of proxy `p` goes to this client.
    fn client(&self, p: usize, n: u64) -> u64 {
        let relative = match self.audience {
            Audience::Everyone => n % self.clients,
            Audience::Few { seen_by } => {
                // Client `c` is seen by proxies `c mod N` to `c mod N + seen_by − 1`
                // (mod N), so proxy `p` sees, for each `j < seen_by`, the clients
                // `≡ p − j (mod N)`.
                let proxies = self.split.len() as u64;
                let (j, round) = (n % seen_by, n / seen_by % (self.clients / proxies));
                (p as u64 + proxies - j) % proxies + round * proxies
            }
        };
        self.first_client + relative
    }
}

/// Which clients each proxy sends to.
#[derive(Debug, Clone, Copy)]
enum Audience {
    /// Every proxy sends to every client.
    Everyone,
    /// Each client reaches `seen_by` proxies only, as the fleet-scale bench's tail
    /// (`tools/bench/src/fleet_scale.rs`): client `c` the proxies from `c mod N` on, for
    /// a fleet of `N` (`clients` is a multiple of `N`).
    Few { seen_by: u64 },
}

/// How the offered rate moves over a run (times from the run's start).
#[derive(Debug, Clone, Copy)]
enum Shape {
    Steady,
    /// Nothing for `pause` at the end of every `every`: the reproduction was a
    /// pause of 200 ms every 2 s.
    Pausing {
        every: u64,
        pause: u64,
    },
    /// From nothing to the full rate over `over`, then steady.
    Ramp {
        over: u64,
    },
    /// Steady, plus `extra` requests at each proxy at once at the start of every second.
    Bursts {
        extra: f64,
    },
}

impl Shape {
    /// In the step at `since` a proxy sends `factor × its steady part + extra` requests:
    /// `(factor, extra)`, the same for every proxy (so worked out once a step).
    fn at(self, since: u64) -> (f64, f64) {
        match self {
            Shape::Pausing { every, pause } if since % every >= every - pause => (0.0, 0.0),
            Shape::Ramp { over } => ((since as f64 / over as f64).min(1.0), 0.0),
            Shape::Bursts { extra } if since % S == 0 => (1.0, extra),
            Shape::Steady | Shape::Pausing { .. } | Shape::Bursts { .. } => (1.0, 0.0),
        }
    }
}

/// What a run offered and admitted.
#[derive(Debug, Clone, Copy)]
struct Ran {
    offered: u64,
    admitted: u64,
    /// Refused at a proxy that had had a lease for it ([`Fleet::refused_leased`]).
    refused_leased: u64,
}

/// Runs the fleet from `from` to `until` in 1 ms steps.
fn run(
    fleet: &mut Fleet,
    from: u64,
    until: u64,
    traffic: &Traffic,
    each_step: impl FnMut(&mut Fleet, u64),
    admitted_per_client: &mut HashMap<u64, u64>,
) -> Ran {
    run_all(
        fleet,
        from,
        until,
        std::slice::from_ref(traffic),
        each_step,
        admitted_per_client,
    )[0]
}

/// Runs the fleet from `from` to `until` in 1 ms steps under several traffics at once
/// (each its own clients); what each offered and admitted.
fn run_all(
    fleet: &mut Fleet,
    from: u64,
    until: u64,
    traffics: &[Traffic],
    mut each_step: impl FnMut(&mut Fleet, u64),
    admitted_per_client: &mut HashMap<u64, u64>,
) -> Vec<Ran> {
    let step = MS;
    // Each proxy's steady requests a step, for each traffic.
    let per_step: Vec<Vec<f64>> = traffics
        .iter()
        .map(|t| {
            t.split
                .iter()
                .map(|part| t.demand_per_second * part * (step as f64 / S as f64))
                .collect()
        })
        .collect();
    let mut carry: Vec<Vec<f64>> = traffics.iter().map(|t| vec![0.0; t.split.len()]).collect();
    let mut next_client: Vec<Vec<u64>> = traffics.iter().map(|t| vec![0; t.split.len()]).collect();
    let mut ran = vec![
        Ran {
            offered: 0,
            admitted: 0,
            refused_leased: 0,
        };
        traffics.len()
    ];
    let mut now = from;
    while now < until {
        each_step(fleet, now);
        fleet.sync_due(now);
        for (t, traffic) in traffics.iter().enumerate() {
            let (carry, next_client, ran) = (&mut carry[t], &mut next_client[t], &mut ran[t]);
            let (factor, extra) = traffic.shape.at(now - from);
            for p in 0..carry.len() {
                carry[p] += per_step[t][p] * factor + extra;
                while carry[p] >= 1.0 {
                    carry[p] -= 1.0;
                    let client = traffic.client(p, next_client[p]);
                    next_client[p] += 1;
                    ran.offered += 1;
                    let refused_leased = fleet.refused_leased;
                    if fleet.request(p, client, now) {
                        ran.admitted += 1;
                        *admitted_per_client.entry(client).or_default() += 1;
                    }
                    ran.refused_leased += fleet.refused_leased - refused_leased;
                }
            }
        }
        now += step;
    }
    ran
}

/// The default sync interval: what the bounds are stated for.
const T: u64 = DEFAULT_SYNC_INTERVAL_NS;
const SKEW: [f64; 3] = [0.7, 0.2, 0.1];

/// The limits of the benchmark (`cargo xtask bench --only global`): `(rate, burst, demand
/// in requests per second)`, at twice the limit and at the benchmark's ~20,000/s offered.
const BENCH_LIMITS: [(u64, u64, f64); 7] = [
    (300, 100, 3_000.0),
    (50, 50, 100.0),
    (500, 500, 1_000.0),
    (5_000, 5_000, 10_000.0),
    (50, 100, 20_000.0),
    (500, 500, 20_000.0),
    (5_000, 2_500, 20_000.0),
];

/// One bucket under a 70/20/10 demand split from `S` for `elapsed`: what each proxy admitted.
fn admitted_per_proxy(rate: u64, burst: u64, demand: f64, elapsed: u64) -> [u64; 3] {
    let mut fleet = Fleet::new(3, limit(rate, burst), T);
    let mut admitted = [0u64; 3];
    let mut carry = [0.0_f64; 3];
    let mut now = S;
    while now < S + elapsed {
        fleet.sync_due(now);
        for (p, part) in SKEW.iter().enumerate() {
            carry[p] += demand * part * (MS as f64 / S as f64);
            while carry[p] >= 1.0 {
                carry[p] -= 1.0;
                admitted[p] += u64::from(fleet.request(p, 0, now));
            }
        }
        now += MS;
    }
    admitted
}

/// Issue #26 asks for 0.99 to 1.0 of `burst + rate × elapsed` over 20 s, never above 1.
/// What the fleet lacks at any moment is what is on its way to being spent: the refill
/// that waits at the coordinator for each proxy's next sync, and the leases granted but
/// not yet spent. A proxy whose lease ran out syncs after 100 ms rather than 250 ms, so
/// that lag stays under half an interval's refill, the bound asserted in tokens, and the
/// ratio at 0.99 or more for every limit. (Syncing every interval, it was under one
/// interval's refill: 50/s at twice its rate reached 0.9895, 5,000/s 0.9926.)
#[test]
fn a_skewed_fleet_admits_the_global_limit_for_one_bucket() {
    for (rate, burst, demand) in BENCH_LIMITS {
        let elapsed = 20 * S;
        let admitted: u64 = admitted_per_proxy(rate, burst, demand, elapsed)
            .iter()
            .sum();
        let bound = burst + rate * elapsed / S;
        let ratio = admitted as f64 / bound as f64;
        let one_interval = rate * T / S;
        let what = format!(
            "{rate}/s, burst {burst}, offered {demand}/s: admitted {admitted} of {bound} ({ratio:.4})"
        );
        assert!(admitted <= bound, "{what}");
        assert!(2 * (bound - admitted) <= one_interval, "{what}");
        assert!(ratio >= 0.99, "{what}");
    }
}

/// Limits far above the traffic (issue #26): the issue's own (a 100,000,000/s limit at
/// 22,000 requests a second; 200,000/s and 20,000,000/s at 17,000) and one at exactly
/// twice the load. `(rate, burst, offered per second)`; the burst is the rules' default,
/// one second of the rate.
const UNBOUND: [(u64, u64, f64); 4] = [
    (100_000_000, 100_000_000, 22_000.0),
    (200_000, 200_000, 17_000.0),
    (20_000_000, 20_000_000, 17_000.0),
    (2_000, 2_000, 1_000.0),
];

/// The load shapes a limit that does not bind must never refuse: steady, pausing 200 ms
/// every 2 s (the reproduction), ramping up from nothing over 2 s, and steady
/// with a burst at every proxy each second (a twentieth of the limit's burst, at most a
/// thousand requests).
fn load_shapes(burst: u64) -> [Shape; 5] {
    [
        Shape::Steady,
        Shape::Pausing {
            every: 2 * S,
            pause: 200 * MS,
        },
        // Quiet for 3 s in every 6 (longer than an idle entry keeps its lease): the
        // benchmark's interleaved rounds found a client back after a pause refused while
        // its first sync's answer was on its way.
        Shape::Pausing {
            every: 6 * S,
            pause: 3 * S,
        },
        Shape::Ramp { over: 2 * S },
        Shape::Bursts {
            extra: (burst as f64 / 20.0).min(1_000.0),
        },
    ]
}

/// Far below its limit, nobody is refused: one proxy and three (an even and a 70/20/10
/// split), every shape, for 8 s from the client's first request (a bucket new to the
/// fleet, its first grants sized while the client ramps up). Before leases were sized
/// from the limit, one proxy at 22,000/s under a 100,000,000/s limit was refused 3.3 to
/// 4.0% of its requests on real Envoys.
#[test]
fn a_limit_the_traffic_stays_under_never_refuses_anyone() {
    let splits: [&[f64]; 3] = [&[1.0], &[1.0 / 3.0; 3], &SKEW];
    for (rate, burst, offered) in UNBOUND {
        for split in splits {
            for shape in load_shapes(burst) {
                let mut fleet = Fleet::new(split.len(), limit(rate, burst), T);
                let traffic = Traffic {
                    shape,
                    ..Traffic::steady(offered, split, 1)
                };
                let ran = run(
                    &mut fleet,
                    S,
                    9 * S,
                    &traffic,
                    |_, _| {},
                    &mut HashMap::new(),
                );
                assert_eq!(
                    ran.admitted,
                    ran.offered,
                    "{rate}/s, burst {burst}, {offered}/s split {split:?}, {shape:?}: {} of {} refused",
                    ran.offered - ran.admitted,
                    ran.offered
                );
            }
        }
    }
}

/// A client new to the fleet sending at half its limit to three proxies at once, evenly
/// or skewed, is never refused: not by the even shares before the first answers, nor
/// while the bucket is young, nor after.
#[test]
fn a_new_client_at_half_its_limit_at_three_proxies_is_never_refused() {
    for (rate, burst) in [(20, 20), (200, 200), (2_000, 2_000), (200, 400)] {
        for split in [[1.0 / 3.0; 3], SKEW] {
            for start_ms in [0, 30, 130] {
                let mut fleet = Fleet::new(3, limit(rate, burst), T);
                let start = S + start_ms * MS;
                let traffic = Traffic::steady(rate as f64 / 2.0, &split, 1);
                let ran = run(
                    &mut fleet,
                    start,
                    start + 8 * S,
                    &traffic,
                    |_, _| {},
                    &mut HashMap::new(),
                );
                assert_eq!(
                    ran.admitted, ran.offered,
                    "{rate}/s, burst {burst}, split {split:?}, from {start_ms} ms"
                );
            }
        }
    }
}

/// Shares follow demand: whatever the overload, each proxy admits about its share of the
/// fleet's traffic, not what the phase of its syncs happens to leave it. (Taking all that
/// refilled since anyone's last sync, a 70/20/10 split admitted 20/80/0 at ten times the
/// limit; with a share of only half the bucket's refill, a 5,000/s limit with a half-second
/// burst admitted 38/57/5 at four times.)
#[test]
fn each_proxy_admits_about_its_share_of_the_demand() {
    let overloads = [
        (500, 500, 1_000.0),
        (500, 500, 5_000.0),
        (500, 500, 20_000.0),
    ];
    for (rate, burst, demand) in overloads.into_iter().chain(BENCH_LIMITS) {
        let admitted = admitted_per_proxy(rate, burst, demand, 20 * S);
        let total = admitted.iter().sum::<u64>() as f64;
        let split: Vec<f64> = admitted.iter().map(|a| *a as f64 / total).collect();
        // Grants are whole tokens, rounded up: where one interval's refill is a dozen
        // tokens (50/s), a proxy with a tenth of the demand gets two where its share is
        // one and a quarter, and a burst of twice the rate goes out in even shares first.
        let tokens_per_interval = rate * T / S;
        let tolerance = if tokens_per_interval < 20 { 0.15 } else { 0.08 };
        for (got, wanted) in split.iter().zip(SKEW) {
            assert!(
                (got - wanted).abs() <= tolerance,
                "{rate}/s, burst {burst}, offered {demand}/s: admitted split {split:.2?} for a demand split {SKEW:?}"
            );
        }
    }
}

/// The same for 1,000 clients each sending over twice its limit: 20/s at twice, and the
/// benchmark's 8/s at 2.5 times. (Sparser keys, where one interval's refill is a couple
/// of whole tokens for the whole fleet, keep a few tokens in flight per bucket: at 5/s per
/// client the fleet admits about 0.97.)
#[test]
fn a_thousand_clients_each_get_their_own_global_limit() {
    let clients = 1_000;
    // The fleet's lag behind the bound is a few whole tokens a client, so it is a larger
    // part of a smaller bucket: 0.990 at 20/s, 0.983 at 8/s, 0.967 at 4/s with a burst of
    // 4 (the limit the global bench picked on 2026-11-27 from the load the machine gave,
    // and measured 0.961 with three real Envoys).
    for (rate, overload, floor) in [(20, 2.0, 0.975), (8, 2.5, 0.975), (4, 2.3, 0.96)] {
        let mut fleet = Fleet::new(3, limit(rate, rate), T);
        let elapsed = 20 * S;
        let mut per_client = HashMap::new();
        let admitted = run(
            &mut fleet,
            S,
            S + elapsed,
            &Traffic::steady(overload * (rate * clients) as f64, &SKEW, clients),
            |_, _| {},
            &mut per_client,
        )
        .admitted;
        let bound = rate + rate * elapsed / S;
        let ratio = admitted as f64 / (bound * clients) as f64;
        assert!(
            (floor..=1.01).contains(&ratio),
            "{rate}/s: fleet {ratio:.4}"
        );
        let worst = per_client.values().max().copied().unwrap_or(0);
        assert!(
            worst as f64 <= 1.05 * bound as f64,
            "{rate}/s: a client got {worst} of {bound}"
        );
    }
}

/// Issue #33's mesh: a fleet of this many proxies.
const MESH: usize = 1_000;

/// Each hot client's requests a second, fleet-wide: 20 a second at each proxy on average,
/// skewed ([`mesh_split`]): 7 to 59. The fleet-scale bench's hot clients send 20 to 29 an
/// interval at every proxy; fewer here, to keep the run short.
const MESH_HOT_OFFERED: f64 = 20_000.0;

/// The mesh's tail: this many clients (buckets from [`MESH_TAIL_FIRST`] on), each reaching
/// [`MESH_TAIL_SEEN_BY`] proxies, as the bench's tail.
const MESH_TAIL: u64 = 2_000;
const MESH_TAIL_FIRST: u64 = 1_000;
const MESH_TAIL_SEEN_BY: u64 = 3;

/// A skewed split of the hot clients' traffic over `proxies`: proxy `p` sees in
/// proportion to `1 / (1 + p mod 8)`, so the busiest proxies see eight times what the
/// quietest see (and three times the average).
fn mesh_split(proxies: usize) -> Vec<f64> {
    let weights: Vec<f64> = (0..proxies).map(|p| 1.0 / (1 + p % 8) as f64).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// The mesh's limits and load: each hot client `(rate, burst)` offered
/// [`MESH_HOT_OFFERED`], and the tail's clients' `(rate, burst)` each offered
/// `tail_offered` a second, spread evenly over its proxies.
struct Mesh<'a> {
    hot: &'a [(u64, u64)],
    tail: (u64, u64),
    tail_offered: f64,
    shape: Shape,
}

/// What one mesh run admitted, against `burst + rate × elapsed` from each client's first
/// request.
struct MeshRun {
    /// Each hot client: admitted over its bound.
    hot: Vec<f64>,
    /// The hot clients' refused requests, all and at a proxy that had had a lease.
    hot_refused: (u64, u64),
    /// The tail: admitted over the sum of its clients' bounds, how far below its bound a
    /// client ended on average, how far the one furthest below it ended, and how far
    /// above it the one furthest above ended (tokens; negative: below).
    tail: f64,
    tail_mean_lag: f64,
    tail_most_under: i64,
    tail_most_over: i64,
    /// Tail requests offered and refused.
    tail_offered: u64,
    tail_refused: u64,
    /// Tail requests refused at a proxy that had had a lease for the client.
    refused_leased: u64,
}

/// [`MESH`] proxies under `mesh`, from `S` for `elapsed`.
fn run_mesh(mesh: &Mesh, elapsed: u64) -> MeshRun {
    let (tail_rate, tail_burst) = mesh.tail;
    let mut fleet = Fleet::new(MESH, limit(tail_rate, tail_burst), T);
    fleet.bands = (0..)
        .zip(mesh.hot)
        .map(|(h, (rate, burst))| (h, limit(*rate, *burst)))
        .chain([(MESH_TAIL_FIRST, limit(tail_rate, tail_burst))])
        .collect();
    let hot_clients = mesh.hot.len() as u64;
    let skewed = mesh_split(MESH);
    let even = vec![1.0 / MESH as f64; MESH];
    let traffics = [
        Traffic {
            shape: mesh.shape,
            ..Traffic::steady(MESH_HOT_OFFERED * hot_clients as f64, &skewed, hot_clients)
        },
        Traffic {
            shape: mesh.shape,
            first_client: MESH_TAIL_FIRST,
            audience: Audience::Few {
                seen_by: MESH_TAIL_SEEN_BY,
            },
            ..Traffic::steady(mesh.tail_offered * MESH_TAIL as f64, &even, MESH_TAIL)
        },
    ];
    let until = S + elapsed;
    let mut admitted = HashMap::new();
    let ran = run_all(&mut fleet, S, until, &traffics, |_, _| {}, &mut admitted);
    let bound = |bucket: u64| {
        let limit = limit_of(fleet.limit, &fleet.bands, bucket);
        let first = fleet.first_request[&bucket];
        limit.burst() + (until - first) / limit.interval_ns()
    };
    let got = |bucket: u64| admitted.get(&bucket).copied().unwrap_or(0);
    let tail_buckets = MESH_TAIL_FIRST..MESH_TAIL_FIRST + MESH_TAIL;
    let tail_bound: u64 = tail_buckets.clone().map(bound).sum();
    let tail_got: u64 = tail_buckets.clone().map(got).sum();
    let over: Vec<i64> = tail_buckets
        .map(|b| got(b) as i64 - bound(b) as i64)
        .collect();
    let (hot_ran, tail_ran) = (ran[0], ran[1]);
    MeshRun {
        hot: (0..hot_clients)
            .map(|h| got(h) as f64 / bound(h) as f64)
            .collect(),
        hot_refused: (hot_ran.offered - hot_ran.admitted, hot_ran.refused_leased),
        tail: tail_got as f64 / tail_bound as f64,
        tail_mean_lag: (tail_bound as f64 - tail_got as f64) / MESH_TAIL as f64,
        tail_most_under: -over.iter().copied().min().unwrap_or(0),
        tail_most_over: over.iter().copied().max().unwrap_or(0),
        tail_offered: tail_ran.offered,
        tail_refused: tail_ran.offered - tail_ran.admitted,
        refused_leased: tail_ran.refused_leased,
    }
}

/// Issue #33: the simulation at 1,000 proxies with the fleet-scale bench's skew, under
/// steady, bursty (a request more at every proxy each second, for the hot clients and for
/// the tail) and pausing load (200 ms every 2 s), on both sides of the limits.
///
/// Over the limits, 10 s: three hot clients at 20,000 requests a second each, skewed over
/// every proxy ([`mesh_split`]), limited to 100/s (the bench's limit: its burst is a tenth
/// of a token per proxy), 1,000/s and 5,000/s; and 2,000 tail clients, each reaching three
/// proxies, at twice their 8/s (burst 8). Each hot client within [0.97, 1.01] of `burst +
/// rate × elapsed` (the bar); the tail never above it, and behind it by at most
/// the sparse-key lag `docs/global-limits.md` states (`k + 2 r T` tokens a client on
/// average for `k` proxies, plus the refill of a pause the run ends in).
///
/// Under them, 8 s: the same hot traffic under 40,000/s each (twice it), never refused;
/// and the bench's own tail (100/s, each client 2.4 requests a second over its three
/// proxies), never refused and never above its bound.
#[test]
fn a_mesh_of_a_thousand_proxies_holds_hot_and_tail_limits() {
    let shapes = [
        ("steady", Shape::Steady, 0),
        ("bursty", Shape::Bursts { extra: 1.0 }, 0),
        (
            "pausing",
            Shape::Pausing {
                every: 2 * S,
                pause: 200 * MS,
            },
            // The runs end in a pause: its refill is not asked for.
            200 * MS,
        ),
    ];
    let elapsed = 10 * S;
    for (name, shape, ends_paused) in shapes {
        let over = Mesh {
            hot: &[(100, 100), (1_000, 1_000), (5_000, 5_000)],
            tail: (8, 8),
            tail_offered: 16.0,
            shape,
        };
        let ran = run_mesh(&over, elapsed);
        let (rate, _) = over.tail;
        let lag = ran.tail_mean_lag;
        let most_lag = MESH_TAIL_SEEN_BY as f64
            + 2.0 * (rate * T) as f64 / S as f64
            + (rate * ends_paused) as f64 / S as f64;
        let what = format!(
            "{MESH} proxies over the limits, {name}: hot clients {:.4?} of their bounds; tail \
             {:.4} ({lag:.1} tokens behind a client on average, at most {most_lag:.1}; the \
             furthest behind {}, the furthest ahead {})",
            ran.hot, ran.tail, ran.tail_most_under, ran.tail_most_over,
        );
        println!("{what}");
        assert!(ran.hot.iter().all(|r| (0.97..=1.01).contains(r)), "{what}");
        assert!(ran.tail_most_over <= 0, "{what}");
        assert!(lag <= most_lag, "{what}");

        let under = Mesh {
            hot: &[(40_000, 40_000); 3],
            tail: (100, 100),
            tail_offered: 2.4,
            shape,
        };
        let ran = run_mesh(&under, 8 * S);
        let what = format!(
            "{MESH} proxies under the limits, {name}: the hot clients refused {:?} (all, after \
             a lease); the bench's tail refused {} of {}, {} after a lease",
            ran.hot_refused, ran.tail_refused, ran.tail_offered, ran.refused_leased,
        );
        println!("{what}");
        assert_eq!(ran.hot_refused, (0, 0), "{what}");
        assert_eq!(ran.tail_refused, 0, "{what}");
        assert!(ran.tail_most_over <= 0, "{what}");
    }
}

#[test]
fn a_client_new_to_the_fleet_bursting_at_every_proxy_gets_at_most_its_burst() {
    let burst = 30;
    let mut fleet = Fleet::new(3, limit(10, burst), T);
    let now = S + T / 7;
    let admitted = (0..3)
        .map(|p| (0..burst).filter(|_| fleet.request(p, 0, now)).count() as u64)
        .sum::<u64>();
    assert!(
        admitted <= burst,
        "admitted {admitted} of a burst of {burst}"
    );
    assert_eq!(admitted, burst, "30 splits evenly over 3 proxies");

    // And it keeps sending to all three, far over its limit, while they sync: the early
    // syncs' grants must not add the proxies' even shares a second time.
    let mut per_client = HashMap::new();
    let later = run(
        &mut fleet,
        now,
        now + 400 * MS,
        &Traffic::steady(3_000.0, &[1.0 / 3.0; 3], 1),
        |_, _| {},
        &mut per_client,
    )
    .admitted;
    let allowed = burst as f64 + 10.0 * 0.4;
    let total = (admitted + later) as f64;
    assert!(
        total <= 1.1 * burst as f64,
        "admitted {total} in 0.4 s of a burst of {burst} ({allowed} allowed)"
    );
}

/// Answers take time, and workers keep spending meanwhile: a proxy whose first sync of a
/// new bucket went out with part of its even share spent goes on spending the rest of it
/// until the answer comes, and the answer's grant (the rest of its even share, as the
/// coordinator saw it) must not hand that out a second time. (It did: on real Envoys a new
/// client bursting at three of them got up to 1.23 of its burst, one Envoy 57 of 100.)
#[test]
fn a_new_clients_burst_holds_while_answers_are_on_their_way() {
    let (rate, burst) = (10, 100);
    for answer_ms in [2, 10, 30, 60] {
        for start_ms in [0, 7, 20, 35] {
            let mut fleet = Fleet::new(3, limit(rate, burst), T);
            fleet.answer_delay = answer_ms * MS;
            let start = S + start_ms * MS;
            let admitted = run(
                &mut fleet,
                start,
                start + 400 * MS,
                &Traffic::steady(3_000.0, &[1.0 / 3.0; 3], 1),
                |_, _| {},
                &mut HashMap::new(),
            )
            .admitted;
            assert!(
                admitted as f64 <= 1.1 * burst as f64,
                "answers after {answer_ms} ms, traffic from {start_ms} ms: admitted {admitted} \
                 of a burst of {burst}"
            );
        }
    }
}

/// "At once" on a busy machine: one proxy's first request for the new client comes later
/// than the others' (its connections were slower to start), but within the burst's 0.4 s.
/// Its even share is spent before it reports, so the coordinator must still hold it back
/// from the proxies that reported first.
#[test]
fn a_new_client_reaching_one_proxy_late_still_gets_at_most_its_burst() {
    let (rate, burst) = (10, 100);
    for late_ms in [50, 150, 250, 350] {
        let mut fleet = Fleet::new(3, limit(rate, burst), T);
        let start = S + T / 7;
        let mut per_client = HashMap::new();
        let mut traffic = |fleet: &mut Fleet, from: u64, until: u64, split: &[f64]| {
            run(
                fleet,
                from,
                until,
                &Traffic::steady(3_000.0, split, 1),
                |_, _| {},
                &mut per_client,
            )
            .admitted
        };
        let late = start + late_ms * MS;
        let end = start + 400 * MS;
        let admitted = traffic(&mut fleet, start, late, &[0.5, 0.5, 0.0])
            + traffic(&mut fleet, late, end, &[1.0 / 3.0; 3]);
        assert!(
            admitted as f64 <= 1.1 * burst as f64,
            "the third proxy {late_ms} ms late: admitted {admitted} of a burst of {burst}"
        );
    }
}

/// The coordinator is out of reach for 10 s under the same skewed overload: the fleet
/// stays within 0.8 to 1.1 of the limit, and is exact again within two seconds.
#[test]
fn an_outage_keeps_the_fleet_near_its_limit_and_recovery_is_quick() {
    let rate = 500;
    let mut fleet = Fleet::new(3, limit(rate, rate), T);
    let mut per_client = HashMap::new();
    let mut phase = |fleet: &mut Fleet, from: u64, until: u64| {
        run(
            fleet,
            from,
            until,
            &Traffic::steady(2.0 * rate as f64, &SKEW, 1),
            |_, _| {},
            &mut per_client,
        )
        .admitted
    };
    phase(&mut fleet, S, 6 * S);
    fleet.coordinator.up = false;
    let during = phase(&mut fleet, 6 * S, 16 * S);
    fleet.coordinator.up = true;
    phase(&mut fleet, 16 * S, 18 * S);
    let after = phase(&mut fleet, 18 * S, 28 * S);

    let outage = (rate * 10) as f64;
    let ratio = during as f64 / outage;
    assert!(
        (0.8..=1.1).contains(&ratio),
        "during the outage: {ratio:.4}"
    );
    let ratio = after as f64 / (rate * 10) as f64;
    assert!((0.97..=1.01).contains(&ratio), "after recovery: {ratio:.4}");
    assert!(fleet.proxies.iter().all(|p| !p.view.fallback));
}

/// Answers lost after the coordinator settled them (the admin API answered after the
/// proxy's timeout, as on an overloaded machine): the proxy falls back to its share and
/// reports the same usage again with the next sync. However many are lost, the fleet
/// never admits more than `burst + rate × elapsed` beyond the fallback's own bound (its
/// shares, at most 1.1 of the rate, for the time it is on them).
#[test]
fn answers_lost_on_their_way_never_push_the_fleet_over_its_bound() {
    let losses: [(&str, SyncPattern); 3] = [
        ("every third", |n| n % 3 == 0),
        ("two in three", |n| n % 3 != 0),
        ("bursts of five in twenty", |n| n % 20 < 5),
    ];
    for (rate, burst, demand) in [
        (500, 500, 1_000.0),
        (500, 500, 20_000.0),
        (50, 100, 2_000.0),
    ] {
        for (what, lose) in losses {
            let mut fleet = Fleet::new(3, limit(rate, burst), T);
            fleet.lose_answer = lose;
            let elapsed = 20 * S;
            let ran = run(
                &mut fleet,
                S,
                S + elapsed,
                &Traffic::steady(demand, &SKEW, 1),
                |_, _| {},
                &mut HashMap::new(),
            );
            let bound = burst as f64 + 1.1 * (rate * elapsed / S) as f64;
            assert!(
                ran.admitted as f64 <= bound,
                "{rate}/s, burst {burst}, {demand}/s, {what} answer lost: admitted {} of {bound}",
                ran.admitted
            );
        }
    }
}

/// A coordinator that lost its state grants nothing for one lease length: leases granted
/// before may still be spent. The fleet keeps to fallback shares meanwhile.
#[test]
fn a_restarted_coordinator_warms_up_without_double_spending() {
    let rate = 500;
    let mut fleet = Fleet::new(3, limit(rate, rate), T);
    let mut per_client = HashMap::new();
    run(
        &mut fleet,
        S,
        6 * S,
        &Traffic::steady(2.0 * rate as f64, &SKEW, 1),
        |_, _| {},
        &mut per_client,
    );
    // Second by second: neither the warm-up nor its end may starve or flood the fleet.
    let per_second = restart_and_count_each_second(
        &mut fleet,
        6 * S,
        10,
        &Traffic::steady(2.0 * rate as f64, &SKEW, 1),
    );
    // The new coordinator rebuilds the bucket from the level the proxies last heard
    // (they report it once its answers say it warms up), instead of starting it full:
    // every second within 5% of the rate, the first included (1.026, then 0.99 to
    // 1.006). Started full, the fleet admitted one burst more over the first three
    // seconds, up to 1.47 of the rate in one.
    let shown =
        format!("admitted per second around the restart, as a share of the rate: {per_second:?}");
    assert!(
        per_second.iter().all(|r| (0.95..=1.05).contains(r)),
        "{shown}"
    );
}

/// A coordinator restarted after a 10 s outage (its state lost) under skewed overload:
/// each proxy reports ten seconds of fallback spending at once. Booked over the time it
/// took, with shares withheld while warming up, the fleet stays near its rate and is
/// exact again within two seconds.
#[test]
fn a_coordinator_back_from_an_outage_without_its_state_is_exact_at_once() {
    let rate = 500;
    let mut fleet = Fleet::new(3, limit(rate, rate), T);
    let mut per_client = HashMap::new();
    let traffic = Traffic::steady(2.0 * rate as f64, &SKEW, 1);
    run(&mut fleet, S, 6 * S, &traffic, |_, _| {}, &mut per_client);
    fleet.coordinator.up = false;
    run(
        &mut fleet,
        6 * S,
        16 * S,
        &traffic,
        |_, _| {},
        &mut per_client,
    );
    fleet.coordinator.up = true;
    let per_second = restart_and_count_each_second(&mut fleet, 16 * S, 7, &traffic);
    // Never starved while it warms up (one lease TTL) and hands out the burst its fresh
    // state assumes: at most one more second of the rate (the burst) over the first
    // four, at most 0.7 of it in any one second; exact after. (With 500 ms syncs the
    // burst went out over about two seconds, none above 1.2; with 250 ms syncs and leases
    // sized from demand alone, as 1.16 and 1.47; with leases sized from the limit, the
    // whole bucket is leased at the first answers after the warm-up: 1.14 and 1.66, exact
    // from the third second. Since proxies whose lease ran out sync sooner, each taking
    // its share of the refill over its own gap, the burst goes out more evenly and a
    // second later: 1.13, 1.34, 1.12, 1.08, then 0.98.)
    let shown =
        format!("admitted per second after the restart, as a share of the rate: {per_second:?}");
    assert!(
        per_second[..4].iter().all(|r| (0.8..=1.7).contains(r)),
        "{shown}"
    );
    assert!(per_second[..4].iter().sum::<f64>() <= 5.0, "{shown}");
    assert!(
        per_second[4..].iter().all(|r| (0.95..=1.05).contains(r)),
        "{shown}"
    );
}

/// The coordinator restarts at `restart` without its state (it warms up for one lease
/// TTL); returns what the fleet admits in each of the `seconds` after, as a share of the
/// rate.
fn restart_and_count_each_second(
    fleet: &mut Fleet,
    restart: u64,
    seconds: u64,
    traffic: &Traffic,
) -> Vec<f64> {
    fleet.coordinator.buckets.clear();
    fleet.coordinator.settings.warming_up = true;
    let ttl = T * sluice_core::global::LEASE_TTL_INTERVALS;
    let rate = S as f64 / fleet.limit.interval_ns() as f64;
    let mut per_client = HashMap::new();
    (0..seconds)
        .map(|second| {
            let from = restart + second * S;
            let admitted = run(
                fleet,
                from,
                from + S,
                traffic,
                |fleet, now| {
                    if now >= restart + ttl {
                        fleet.coordinator.settings.warming_up = false;
                    }
                },
                &mut per_client,
            )
            .admitted;
            admitted as f64 / rate
        })
        .collect()
}

/// How a coordinator loses its buckets' state.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// `sluice serve` in memory restarts: nothing answers for `down`, then it starts empty.
    Restart { down: u64 },
    /// Its Redis is emptied (FLUSHALL) while it keeps answering.
    Flushed,
}

/// What the fleet admitted in each sync interval from a loss of state on, beside the
/// same fleet under the same traffic whose coordinator kept its state.
struct AroundLoss {
    lost: Vec<u64>,
    kept: Vec<u64>,
    /// Admitted from the first request to the end, with the loss.
    total: u64,
}

/// Runs a fleet of three (70/20/10) under `traffic` from `S` to `until`, its coordinator
/// losing its state at `at` as `loss` says (warming up for one lease TTL from when it
/// answers again), and a twin whose coordinator keeps it; counts each interval from `at`.
fn lose_state(limit: Gcra, traffic: &Traffic, loss: Loss, at: u64, until: u64) -> AroundLoss {
    let ttl = T * sluice_core::global::LEASE_TTL_INTERVALS;
    let back_at = match loss {
        Loss::Restart { down } => at + down,
        Loss::Flushed => at,
    };
    let per_interval = |lose: bool| {
        let mut fleet = Fleet::new(3, limit, T);
        let mut counts = Vec::new();
        let mut since = 0;
        let ran = run(
            &mut fleet,
            S,
            until,
            traffic,
            |fleet, now| {
                if now >= at && (now - at) % T == 0 {
                    counts.push(fleet.admitted - since);
                    since = fleet.admitted;
                }
                if !lose {
                    return;
                }
                if now == at {
                    fleet.coordinator.up = matches!(loss, Loss::Flushed);
                }
                if now == back_at {
                    fleet.coordinator.buckets.clear();
                    fleet.coordinator.settings.warming_up = true;
                    fleet.coordinator.up = true;
                }
                if now == back_at + ttl {
                    fleet.coordinator.settings.warming_up = false;
                }
            },
            &mut HashMap::new(),
        );
        counts.push(fleet.admitted - since);
        // The first count is the interval before the loss ends at `at`: empty.
        counts.remove(0);
        (counts, ran.admitted)
    };
    let (lost, total) = per_interval(true);
    let (kept, _) = per_interval(false);
    AroundLoss { lost, kept, total }
}

/// Issue #33: a coordinator that lost its state (restarted in memory after 500 ms down,
/// or its Redis emptied) under steady, bursty and pausing load at twice the limit.
/// Proxies on fallback shares report the fleet's level each last heard (`full_in_ms`),
/// and the coordinator rebuilds each bucket from the emptiest instead of starting it
/// full. Against a twin fleet whose coordinator kept its state, under the same traffic:
/// at most one burst more in total over the 10 s from the loss (measured: 25 tokens
/// more at most, a twentieth of the burst), never more than half a burst ahead or behind
/// at any interval's end (measured: 158 ahead, 185 behind), never above `2 × burst +
/// rate × elapsed` from the first request, and under steady load every second from the
/// second interval on within 5% of the twin's (measured: 0.952 to 1.034). (Phases of
/// syncs differ from the twin's after the loss, so one interval's count differs by up
/// to a third either way, in the twin too: bursty and pausing load are judged by the
/// running lead.) Started full instead, the fleet admitted one burst more.
#[test]
fn a_coordinator_that_lost_its_state_rebuilds_it_from_the_proxies() {
    let (rate, burst) = (500, 500);
    let shapes = [
        ("steady", Shape::Steady),
        ("bursty", Shape::Bursts { extra: 250.0 }),
        (
            "pausing",
            Shape::Pausing {
                every: 2 * S,
                pause: 200 * MS,
            },
        ),
    ];
    let losses = [
        ("restarted in memory", Loss::Restart { down: 500 * MS }),
        ("Redis emptied", Loss::Flushed),
    ];
    let (at, until) = (6 * S, 16 * S);
    for (shape_name, shape) in shapes {
        for (loss_name, loss) in losses {
            let traffic = Traffic {
                shape,
                ..Traffic::steady(2.0 * rate as f64, &SKEW, 1)
            };
            let around = lose_state(limit(rate, burst), &traffic, loss, at, until);
            let extra =
                around.lost.iter().sum::<u64>() as i64 - around.kept.iter().sum::<u64>() as i64;
            // The lead over the twin at each interval's end, and each second's ratio to
            // the twin's from the second interval on.
            let leads: Vec<i64> = around
                .lost
                .iter()
                .zip(&around.kept)
                .scan(0i64, |lead, (l, k)| {
                    *lead += *l as i64 - *k as i64;
                    Some(*lead)
                })
                .collect();
            let window = (S / T) as usize;
            let seconds: Vec<f64> = (1..around.lost.len() - window)
                .map(|i| {
                    let sum = |v: &[u64]| v[i..i + window].iter().sum::<u64>() as f64;
                    sum(&around.lost) / sum(&around.kept)
                })
                .collect();
            let range = |v: &[f64]| {
                v.iter()
                    .fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)))
            };
            let lead = range(&leads.iter().map(|l| *l as f64).collect::<Vec<_>>());
            let second = range(&seconds);
            let what = format!(
                "{loss_name}, {shape_name}: {extra} more than the twin over 10 s, lead over \
                 it {lead:?}, each second from the second interval {second:.3?} of it"
            );
            println!("{what}");
            let bound = 2 * burst + rate * (until - S) / S;
            assert!(around.total <= bound, "{what}: {} of {bound}", around.total);
            assert!(extra <= burst as i64, "{what}");
            assert!(leads.iter().all(|l| l.abs() <= burst as i64 / 2), "{what}");
            if matches!(shape, Shape::Steady) {
                assert!(seconds.iter().all(|r| (0.95..=1.05).contains(r)), "{what}");
            }
        }
    }
}

/// What a run with a remote region admitted: most over `burst + rate × elapsed` at any
/// moment (tokens; negative: always under it), and per second as a share of the rate.
struct RegionRun {
    most_over: i64,
    per_second: Vec<f64>,
    total: u64,
    elapsed: u64,
}

/// Four proxies, two in the home region (0.4 and 0.2 of the demand) and two behind
/// `remote`'s link (0.3 and 0.1), at twice the limit, for `seconds`.
fn run_regions(rate: u64, burst: u64, remote: Remote, seconds: u64) -> RegionRun {
    const SPLIT: [f64; 4] = [0.4, 0.2, 0.3, 0.1];
    let mut fleet = Fleet::new(4, limit(rate, burst), T);
    fleet.remote = Some(remote);
    let mut most_over = i64::MIN;
    let mut per_second = Vec::new();
    let mut since = 0;
    let until = S + seconds * S;
    let ran = run(
        &mut fleet,
        S,
        until,
        &Traffic::steady(2.0 * rate as f64, &SPLIT, 1),
        |fleet, now| {
            let bound = burst + rate * (now - S) / S;
            let over = fleet.admitted as i64 - bound as i64;
            most_over = most_over.max(over);
            if now > S && (now - S) % S == 0 {
                per_second.push((fleet.admitted - since) as f64 / rate as f64);
                since = fleet.admitted;
            }
        },
        &mut HashMap::new(),
    );
    RegionRun {
        most_over,
        per_second,
        total: ran.admitted,
        elapsed: seconds * S,
    }
}

/// Issue #33, regions: one limit across two regions, the remote one's replica reaching
/// the shared state (Redis in the home region) over a link of 100 ms, 300 ms, 500 ms and
/// 1 s, and one of 100 ms cut for 30 s, at twice the limit, the remote region holding 0.4
/// of the demand. A replica's batch is two round trips, and a sync waits for the batch in
/// flight, so a remote answer takes up to `4 d`. `docs/global-limits.md` ("Regions")
/// states the bound:
/// - answers within the remote proxies' sync timeout (`4 d` under 2 s, the timeout once
///   their interval has stretched to 1 s: 100 and 300 ms): coordinated, within
///   `burst + rate × elapsed` but for the first seconds, while the remote interval
///   stretches and a few answers come after the shorter timeout of the configured
///   interval (35 and 138 tokens over, a tenth and a quarter of the burst; asserted under
///   a third);
/// - at the edge (500 ms: answers after 1 to 2 s, some after the timeout), seconds on
///   the fallback shares alternate with seconds paying their debt back (1.25 to 1.59 of
///   the rate, then 0.44 to 0.72): 1.015 of the bound over 45 s, asserted within the
///   fallback bound in all;
/// - otherwise (1 s: every Redis call of the remote replica times out; the cut): the
///   remote region is on its fallback shares while the home region leases the whole
///   bucket, so the fleet admits at most `(1 + Σ remote fallback shares) × rate` a second
///   and one burst, where a remote share is its smoothed share of the demand `σ` (within
///   a fifth of it), or an even split if it was never told one; measured 0.40 to 0.42 of
///   the rate for a region holding 0.4 while cut. (Its demand was once read against its
///   own stretched interval, a time constant four times as long: 0.70 to 0.83.) A second
///   after the cut ends pays back its debt (one burst at most), then the fleet is at its
///   rate again.
#[test]
fn a_remote_region_behind_a_slow_or_cut_link_over_admits_within_the_stated_bound() {
    let (rate, burst) = (500, 500);
    let remote_share: f64 = 0.4;
    let remote_proxies: f64 = 2.0;
    /// What a link gives.
    enum Expect {
        Coordinated,
        /// Within the fallback bound in all, not second by second.
        Edge,
        /// Within the fallback bound in all and in each of these seconds (counted from
        /// the run's first): once the burst is spent (the local shares' parts of it as
        /// well, over the first five seconds), and, for the cut, once the leases out when
        /// it began are; the bound has one burst for those in all, not per second.
        Fallback(Range<usize>),
    }
    let links: [(&str, u64, LinkCut, Expect); 5] = [
        ("100 ms", 100 * MS, |_| false, Expect::Coordinated),
        ("300 ms", 300 * MS, |_| false, Expect::Coordinated),
        ("500 ms", 500 * MS, |_| false, Expect::Edge),
        ("1 s", 1_000 * MS, |_| false, Expect::Fallback(5..44)),
        (
            "100 ms, cut for 30 s",
            100 * MS,
            |now| (6 * S..36 * S).contains(&now),
            Expect::Fallback(7..35),
        ),
    ];
    // A remote proxy's fallback share is its smoothed share of the demand, within a
    // fifth of it, or, never having been told one, an even split of the fleet.
    let fallback_most = 1.0 + (1.2 * remote_share).max(remote_proxies / 4.0);
    for (what, rtt, cut, expect) in links {
        let remote = Remote { first: 2, rtt, cut };
        let ran = run_regions(rate, burst, remote, 45);
        let ratio = ran.total as f64 / (burst + rate * ran.elapsed / S) as f64;
        let what = format!(
            "link {what}: most over the bound {} tokens, {ratio:.4} of it in all, per second {:.2?}",
            ran.most_over, ran.per_second
        );
        println!("{what}");
        // The fallback bound in all: at most one burst more than its rate.
        let fallback_over = burst as f64 + (fallback_most - 1.0) * (rate * ran.elapsed / S) as f64;
        match expect {
            Expect::Coordinated => {
                assert!(ran.most_over <= burst as i64 / 3, "{what}");
                assert!(ratio >= 0.98, "{what}");
            }
            Expect::Edge => {
                assert!((ran.most_over as f64) <= fallback_over, "{what}");
                assert!(ratio <= 1.05, "{what}");
            }
            Expect::Fallback(judged) => {
                assert!((ran.most_over as f64) <= fallback_over, "{what}");
                assert!(
                    ran.per_second[judged].iter().all(|r| *r <= fallback_most),
                    "{what}: each second at most {fallback_most:.2}"
                );
            }
        }
    }
    // The cut's end: the remote proxies' fallback spending is debited (into a debt of at
    // most one burst, paid back within a second or so), then one limit again: each second
    // as spread as the coordinated region's own (its proxies sync once a second; 0.83 to
    // 1.16 with the 100 ms link), and on average the rate.
    let cut = Remote {
        first: 2,
        rtt: 100 * MS,
        cut: |now| (6 * S..36 * S).contains(&now),
    };
    let ran = run_regions(rate, burst, cut, 45);
    let after = &ran.per_second[38..];
    let mean = after.iter().sum::<f64>() / after.len() as f64;
    assert!(
        after.iter().all(|r| (0.8..=1.2).contains(r)) && (0.97..=1.03).contains(&mean),
        "after the cut: {after:.2?}, {mean:.3} on average"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the fleet, rate, burst, split and interval, with the coordinator reachable
    /// the fleet never admits more than `burst + rate × elapsed`, plus the new-bucket
    /// allowance of proxies that first see a bucket after others drained it (zero here:
    /// every proxy sees the bucket from its start), plus rounding of one token a proxy.
    #[test]
    fn the_fleet_never_exceeds_the_stated_bound(
        proxies in 1usize..6,
        rate in 1u64..2_000,
        burst_factor in 1u64..4,
        weights in proptest::collection::vec(1u32..10, 6),
        overload in 1.0f64..4.0,
        interval_ms in 50u64..1_000,
        shape in 0usize..4,
    ) {
        let burst = (rate * burst_factor).max(1);
        let interval = interval_ms * MS;
        let mut fleet = Fleet::new(proxies, limit(rate, burst), interval);
        let total: u32 = weights.iter().take(proxies).sum();
        let split: Vec<f64> = weights
            .iter()
            .take(proxies)
            .map(|w| f64::from(*w) / f64::from(total))
            .collect();
        let elapsed = 5 * S;
        let admitted = run(
            &mut fleet,
            S,
            S + elapsed,
            &Traffic {
                // Steady, pausing, ramping and bursty (half a burst at once, every second).
                shape: load_shapes(burst)
                    .map(|s| match s {
                        Shape::Bursts { .. } => Shape::Bursts { extra: burst as f64 / 2.0 },
                        other => other,
                    })[shape],
                ..Traffic::steady(overload * rate as f64, &split, 1)
            },
            |_, _| {},
            &mut HashMap::new(),
        ).admitted;
        let bound = burst + rate * elapsed / S;
        prop_assert!(
            admitted <= bound + proxies as u64,
            "admitted {} of {}", admitted, bound
        );
    }
}

/// A partial partition: one proxy cannot reach the coordinator for 10 s while the others
/// can. It keeps to its fallback share (its part of the demand, as it last knew it) and
/// the others lease the fleet's whole bucket, so while it lasts the fleet admits up to
/// `1 + share` of the rate: the coordinator cannot tell a proxy that is cut off from one
/// that stopped. When it comes back its spending is debited (into a debt of at most one
/// burst) and the fleet is at its rate again.
#[test]
fn a_proxy_cut_off_from_the_coordinator_adds_at_most_its_share() {
    let rate = 500;
    let cut_offs: [(usize, f64, CutOff); 2] = [
        (0, SKEW[0], |p, now| {
            p == 0 && (6 * S..16 * S).contains(&now)
        }),
        (2, SKEW[2], |p, now| {
            p == 2 && (6 * S..16 * S).contains(&now)
        }),
    ];
    for overload in [2.0, 40.0] {
        for (proxy, share, cut_off) in cut_offs {
            let mut fleet = Fleet::new(3, limit(rate, rate), T);
            fleet.cut_off = cut_off;
            let traffic = Traffic::steady(overload * rate as f64, &SKEW, 1);
            let phase = |fleet: &mut Fleet, from: u64, until: u64| {
                run(fleet, from, until, &traffic, |_, _| {}, &mut HashMap::new()).admitted as f64
                    / (rate * (until - from) / S) as f64
            };
            phase(&mut fleet, S, 6 * S);
            let during = phase(&mut fleet, 6 * S, 16 * S);
            phase(&mut fleet, 16 * S, 18 * S);
            let after = phase(&mut fleet, 18 * S, 28 * S);
            // Its fallback share is smoothed and at most 1.1 of its part; one burst more.
            let most = 1.0 + 1.1 * share + 0.1;
            let what = format!("proxy {proxy} cut off at {overload}× the limit");
            assert!(
                during <= most,
                "{what}: {during:.3} of the rate, at most {most:.3}"
            );
            assert!(during >= 0.97, "{what}: {during:.3} of the rate");
            assert!((0.97..=1.01).contains(&after), "{what}: {after:.3} after");
        }
    }
}

/// Leases held over a quiet spell never outlast the fleet's refill: a client that pauses
/// (after heavy load, and after an outage spent on fallback shares) long enough for its
/// idle proxies to give back their leases but a token (a second), and for the fleet's
/// bucket to refill, admits at most `burst + rate × elapsed` over the 4 s after the
/// pause, and at least 0.95 of it. (A kept token spent after the refill is one the bucket
/// no longer misses: three proxies admitted 101 of 100 allowed after a plain pause and 105
/// after one following a 2.6 s outage, the same figure as the real Envoys of
/// `on_a_redis_cluster_the_fleet_limit_holds_while_the_buckets_master_fails_over`.)
/// Shorter pauses end while whole leases are still held idle, as they always were: the
/// bucket refills under them, and a window starting then is held to 1.03 of the bound
/// (measured at most 102 of 100, 1.2 s after an outage; 101 before tokens were kept).
#[test]
fn a_pause_never_lets_held_leases_add_to_a_refilled_bucket() {
    let (rate, burst) = (20, 20);
    let heavy = Traffic::steady(1000.0, &SKEW, 1);
    let quiet = Traffic::steady(0.0, &SKEW, 1);
    let bound = burst + rate * 4;
    for outage_ms in [0, 500, 2_600] {
        for pause_ms in [300, 600, 900, 1_200, 1_500, 2_000, 3_000, 5_000] {
            let mut fleet = Fleet::new(3, limit(rate, burst), T);
            let mut per_client = HashMap::new();
            let mut t = S;
            let mut phase = |fleet: &mut Fleet, length: u64, traffic: &Traffic| {
                let ran = run(fleet, t, t + length, traffic, |_, _| {}, &mut per_client);
                t += length;
                ran.admitted
            };
            phase(&mut fleet, 3 * S, &heavy);
            fleet.coordinator.up = false;
            phase(&mut fleet, outage_ms * MS, &heavy);
            fleet.coordinator.up = true;
            phase(&mut fleet, 5 * S, &heavy);
            phase(&mut fleet, pause_ms * MS, &quiet);
            let admitted = phase(&mut fleet, 4 * S, &heavy);
            let what = format!("after a {outage_ms} ms outage and a {pause_ms} ms pause");
            eprintln!("{what}: {admitted} admitted in 4 s, {bound} allowed");
            let ceiling = if pause_ms >= 1_500 {
                bound
            } else {
                bound * 103 / 100
            };
            assert!(
                admitted <= ceiling,
                "{what}: {admitted} admitted, at most {ceiling}"
            );
            // The bucket refills in a second: after a shorter pause it starts part full.
            if pause_ms >= 1_500 {
                assert!(
                    admitted as f64 >= 0.95 * bound as f64,
                    "{what}: {admitted} admitted of {bound}"
                );
            }
        }
    }
}
