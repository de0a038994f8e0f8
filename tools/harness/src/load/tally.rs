//! What a load counted: answers by status, per target, per client key and per time bin,
//! and the running counts a caller can read while it goes on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::message::Resp;

/// Answers counted by status, with the requests that got none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub by_status: BTreeMap<u16, u64>,
    /// Requests that got no answer: the connection could not be made, was refused or reset,
    /// or the answer took longer than the load's answer limit.
    pub errors: u64,
    pub first_error: Option<String>,
    /// The longest a request took, answered or not.
    pub slowest: Duration,
    first_answer: Option<Instant>,
    last_sent: Option<Instant>,
}

impl Tally {
    pub fn get(&self, status: u16) -> u64 {
        self.by_status.get(&status).copied().unwrap_or(0)
    }

    /// Answers of any status.
    pub fn responses(&self) -> u64 {
        self.by_status.values().sum()
    }

    /// Answers with a 2xx status.
    pub fn admitted(&self) -> u64 {
        self.by_status.range(200..300).map(|(_, n)| n).sum()
    }

    /// From the first answer's arrival to the last request's sending: the server was
    /// deciding these requests at least from the start to the end of this window (zero
    /// when fewer than two requests were answered).
    pub fn busy(&self) -> Duration {
        match (self.first_answer, self.last_sent) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        }
    }

    pub fn merge(&mut self, other: &Tally) {
        for (&status, &n) in &other.by_status {
            *self.by_status.entry(status).or_default() += n;
        }
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        self.slowest = self.slowest.max(other.slowest);
        self.first_answer = match (self.first_answer, other.first_answer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_sent = self.last_sent.max(other.last_sent);
    }

    /// Request `n`, sent at `sent`, finished `took` later with a status or an error.
    pub(super) fn record(
        &mut self,
        n: u64,
        sent: Instant,
        took: Duration,
        result: Result<u16, &str>,
    ) {
        match result {
            Ok(status) => {
                *self.by_status.entry(status).or_default() += 1;
                let arrived = sent + took;
                self.first_answer = Some(self.first_answer.map_or(arrived, |a| a.min(arrived)));
            }
            Err(err) => {
                self.errors += 1;
                self.first_error
                    .get_or_insert_with(|| format!("request #{n}: {err}"));
            }
        }
        self.slowest = self.slowest.max(took);
        self.last_sent = self.last_sent.max(Some(sent));
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Every answer.
    pub total: Tally,
    /// Per target, in the order the targets were given.
    pub per_target: Vec<Tally>,
    /// Per client key and target, `per_key[key][target]`, when the load counts keys.
    pub per_key: Vec<Vec<Tally>>,
    /// Per [`Outcome::bin`] of the run by the time each request was sent, when the load
    /// counts bins.
    pub bins: Vec<Tally>,
    pub bin: Duration,
    /// From just before the first request was sent to just after the last answer came:
    /// every decision the server made for this run happened inside this window.
    pub elapsed: Duration,
    /// Every request's answer in request order, when the load keeps them; `Err` for a
    /// request that got none or was never sent.
    pub answers: Vec<Result<Resp, String>>,
    /// Each request's time, sorted, when the load keeps them.
    pub(super) latencies: Vec<Duration>,
}

impl Outcome {
    /// Answers per second over the run.
    pub fn rate(&self) -> f64 {
        self.total.responses() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The counts of the bins in `[from, to)` (times since the start of the run).
    pub fn between(&self, from: Duration, to: Duration) -> Tally {
        let bin = self.bin.as_nanos().max(1);
        let first = (from.as_nanos() / bin) as usize;
        let last = ((to.as_nanos() / bin) as usize).min(self.bins.len());
        let mut sum = Tally::default();
        for part in self.bins.get(first..last).unwrap_or_default() {
            sum.merge(part);
        }
        sum
    }

    /// The request time below which the share `q` of the requests finished (zero when
    /// the load did not keep them).
    pub fn percentile(&self, q: f64) -> Duration {
        let at = (self.latencies.len().saturating_sub(1) as f64 * q) as usize;
        self.latencies.get(at).copied().unwrap_or_default()
    }
}

/// The load's counts so far, readable while it runs.
#[derive(Debug)]
pub struct Live {
    sent: AtomicU64,
    errors: AtomicU64,
    /// Indexed by status code (0 to 999).
    statuses: Vec<AtomicU64>,
}

impl Default for Live {
    fn default() -> Live {
        Live {
            sent: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            statuses: (0..1000).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Live {
    /// Requests sent so far (each is answered, failed, or on its way).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Answers by status and requests that got none, so far.
    pub fn tally(&self) -> Tally {
        let by_status = self
            .statuses
            .iter()
            .enumerate()
            .filter_map(|(status, n)| {
                let n = n.load(Ordering::Relaxed);
                (n > 0).then(|| (u16::try_from(status).unwrap_or(u16::MAX), n))
            })
            .collect();
        Tally {
            by_status,
            errors: self.errors.load(Ordering::Relaxed),
            ..Tally::default()
        }
    }

    pub(super) fn sending(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn record(&self, result: Result<u16, &str>) {
        let counter = match result {
            Ok(status) => self.statuses.get(usize::from(status)),
            Err(_) => None,
        };
        counter
            .unwrap_or(&self.errors)
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Ends a load from outside: every connection stops before its next request.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn new() -> Stop {
        Stop::default()
    }

    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}
