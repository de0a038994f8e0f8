//! [`Load`]: what to drive at which targets, until when, how fast, and what to count; and
//! the connections' loops that do it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::task::JoinSet;

use super::connection::{Answer, Connection, Dialer, Failure};
use super::message::{Req, Resp};
use super::tally::{Live, Outcome, Stop, Tally};

/// How long a request may take unless the load says otherwise.
const ANSWER_LIMIT: Duration = Duration::from_secs(10);
/// A connection that could not be made waits this long before its next attempt, so a
/// target that is down is not hammered until the run ends.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);

type KeyOf = Arc<dyn Fn(u64) -> usize + Send + Sync>;

/// Requests driven at one or more targets over keep-alive HTTP/1.1 connections, each
/// connection sending request `n` (made by the caller from `n = 0, 1, 2, …`, drawn in turn
/// by all connections) as soon as its last one is answered, or on its own clock when
/// [paced](Load::paced).
///
/// A load ends when its duration has passed, its number of requests were sent or its
/// [`Stop`] was used, whichever comes first (at least one of them is given); never a
/// fixed count that assumes a speed. Each request is bounded by the answer limit, and the
/// whole run, when asked, by [`Load::give_up_after`].
pub struct Load {
    connections: Vec<Connection>,
    targets: usize,
    requests: Option<u64>,
    duration: Option<Duration>,
    stop: Option<Stop>,
    give_up: Option<Duration>,
    pace: Option<(Duration, u32)>,
    answer_limit: Duration,
    bin: Option<Duration>,
    keys: Option<(usize, KeyOf)>,
    keep_answers: bool,
    keep_latencies: bool,
    live: Arc<Live>,
    threads: usize,
}

impl fmt::Debug for Load {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Load")
            .field("connections", &self.connections.len())
            .field("targets", &self.targets)
            .field("requests", &self.requests)
            .field("duration", &self.duration)
            .field("pace", &self.pace)
            .field("answer_limit", &self.answer_limit)
            .finish_non_exhaustive()
    }
}

impl Load {
    /// `connections` plain TCP connections to each target's address, opened on first use.
    pub fn new(targets: impl IntoIterator<Item = (SocketAddr, usize)>) -> Load {
        let dialer = Dialer::tcp();
        let connections = targets
            .into_iter()
            .enumerate()
            .flat_map(|(target, (addr, connections))| {
                let dialer = dialer.clone();
                (0..connections).map(move |_| Connection::new(target, addr, dialer.clone()))
            })
            .collect();
        Load::over(connections)
    }

    /// Over connections the caller holds (open or not, TLS or not), handed back by
    /// [`Load::drive`]; targets are numbered by [`Connection::target`].
    pub fn over(connections: Vec<Connection>) -> Load {
        let targets = connections
            .iter()
            .map(|c| c.target() + 1)
            .max()
            .unwrap_or(0);
        Load {
            connections,
            targets,
            requests: None,
            duration: None,
            stop: None,
            give_up: None,
            pace: None,
            answer_limit: ANSWER_LIMIT,
            bin: None,
            keys: None,
            keep_answers: false,
            keep_latencies: false,
            live: Arc::default(),
            threads: 1,
        }
    }

    /// Sends no request after `duration` from the start.
    pub fn for_duration(mut self, duration: Duration) -> Load {
        self.duration = Some(duration);
        self
    }

    /// Sends requests `0..requests` at most.
    pub fn at_most(mut self, requests: u64) -> Load {
        self.requests = Some(requests);
        self
    }

    /// Sends no request after `stop` was used.
    pub fn until_stopped(mut self, stop: &Stop) -> Load {
        self.stop = Some(stop.clone());
        self
    }

    /// Abandons the requests still on their way `limit` after the start (their
    /// connections' counts are lost and one error says so).
    pub fn give_up_after(mut self, limit: Duration) -> Load {
        self.give_up = Some(limit);
        self
    }

    /// Each connection sends `batch` requests, one after another, every `every`; the
    /// connections' clocks are spread evenly over one period. A connection that falls
    /// behind sends late rather than in a rush.
    pub fn paced(mut self, every: Duration, batch: u32) -> Load {
        self.pace = Some((every.max(Duration::from_micros(1)), batch));
        self
    }

    /// A request not answered within `limit` counts as an error (10 s unless set).
    pub fn answer_limit(mut self, limit: Duration) -> Load {
        self.answer_limit = limit;
        self
    }

    /// Counts the answers per `bin` of the run too (by when each request was sent).
    pub fn bins(mut self, bin: Duration) -> Load {
        self.bin = Some(bin.max(Duration::from_micros(1)));
        self
    }

    /// Counts the answers per client key and target too: request `n` belongs to key
    /// `key_of(n)`, one of `0..keys` (others are not counted per key).
    pub fn count_keys(
        mut self,
        keys: usize,
        key_of: impl Fn(u64) -> usize + Send + Sync + 'static,
    ) -> Load {
        self.keys = Some((keys, Arc::new(key_of)));
        self
    }

    /// Keeps every request's whole answer ([`Outcome::answers`]).
    pub fn keep_answers(mut self) -> Load {
        self.keep_answers = true;
        self
    }

    /// Keeps every request's time ([`Outcome::percentile`]).
    pub fn keep_latencies(mut self) -> Load {
        self.keep_latencies = true;
        self
    }

    /// Worker threads of the runtime [`Load::run`] starts (1 unless set).
    pub fn threads(mut self, threads: usize) -> Load {
        self.threads = threads.max(1);
        self
    }

    /// The counts so far, to read while the load runs.
    pub fn live(&self) -> Arc<Live> {
        Arc::clone(&self.live)
    }

    /// Runs the load on a runtime of its own; blocks until it ends.
    pub fn run<F>(self, make: F) -> Result<Outcome>
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.threads)
            .enable_all()
            .build()
            .context("starting the load generator's runtime")?;
        Ok(runtime.block_on(self.drive(make)).0)
    }

    /// Runs the load on the caller's runtime; returns what it counted and the
    /// connections that finished, still open where the server kept them open.
    ///
    /// # Panics
    ///
    /// When the load has no end (no duration, number of requests or [`Stop`]), and when
    /// `make` panics.
    pub async fn drive<F>(self, make: F) -> (Outcome, Vec<Connection>)
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        assert!(
            self.duration.is_some() || self.requests.is_some() || self.stop.is_some(),
            "a load needs an end: a duration, a number of requests or a stop"
        );
        let started = Instant::now();
        let count = self.connections.len();
        let run = Arc::new(Run {
            make,
            next: AtomicU64::new(0),
            requests: self.requests.unwrap_or(u64::MAX),
            deadline: self.duration.map(|d| started + d),
            stop: self.stop,
            pace: self.pace,
            connections: count,
            answer_limit: self.answer_limit,
            bin: self.bin,
            key_of: self.keys.as_ref().map(|(_, key_of)| Arc::clone(key_of)),
            keep_answers: self.keep_answers,
            keep_latencies: self.keep_latencies,
            live: self.live,
            started,
        });
        let mut tasks = JoinSet::new();
        for (index, connection) in self.connections.into_iter().enumerate() {
            tasks.spawn(work(Arc::clone(&run), index, connection));
        }
        let mut finished = Vec::with_capacity(count);
        let gather = async {
            while let Some(joined) = tasks.join_next().await {
                match joined {
                    Ok(done) => finished.push(done),
                    Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                    Err(_) => {}
                }
            }
        };
        match self.give_up {
            Some(limit) => drop(tokio::time::timeout(limit, gather).await),
            None => gather.await,
        }
        // Dropping the set aborts what did not finish; those connections are lost.
        drop(tasks);
        let elapsed = started.elapsed();
        let mut outcome = Outcome {
            per_target: vec![Tally::default(); self.targets],
            per_key: match &self.keys {
                Some((keys, _)) => vec![vec![Tally::default(); self.targets]; *keys],
                None => Vec::new(),
            },
            bin: self.bin.unwrap_or_default(),
            elapsed,
            ..Outcome::default()
        };
        let mut answers = BTreeMap::new();
        let mut connections = Vec::with_capacity(finished.len());
        for (connection, part) in finished {
            part.add_to(&mut outcome, &mut answers);
            connections.push(connection);
        }
        outcome.latencies.sort_unstable();
        let stuck = count - connections.len();
        if stuck > 0 {
            outcome.total.errors += 1;
            outcome.total.first_error.get_or_insert_with(|| {
                format!(
                    "{stuck} connections did not finish: the run was given up after {} s",
                    elapsed.as_secs_f32()
                )
            });
        }
        if self.keep_answers {
            let sent = answers.keys().next_back().map_or(0, |n| n + 1);
            let total = self.requests.unwrap_or(sent);
            outcome.answers = (0..total)
                .map(|n| {
                    answers
                        .remove(&n)
                        .unwrap_or_else(|| Err("not sent: the run ended first".to_string()))
                })
                .collect();
        }
        (outcome, connections)
    }
}

/// What the connections of one run share.
struct Run<F> {
    make: F,
    next: AtomicU64,
    requests: u64,
    deadline: Option<Instant>,
    stop: Option<Stop>,
    pace: Option<(Duration, u32)>,
    connections: usize,
    answer_limit: Duration,
    bin: Option<Duration>,
    key_of: Option<KeyOf>,
    keep_answers: bool,
    keep_latencies: bool,
    live: Arc<Live>,
    started: Instant,
}

impl<F> Run<F> {
    fn over(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
            || self.stop.as_ref().is_some_and(Stop::is_stopped)
    }

    /// The clock of the `index`th connection of a paced load.
    fn ticks(&self, index: usize) -> Option<tokio::time::Interval> {
        let (every, _) = self.pace?;
        let offset = every.mul_f64(index as f64 / self.connections.max(1) as f64);
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + offset, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Some(ticks)
    }
}

/// One connection's loop: draws request numbers until the run is over.
async fn work<F>(run: Arc<Run<F>>, index: usize, mut connection: Connection) -> (Connection, Part)
where
    F: Fn(u64) -> Req + Send + Sync + 'static,
{
    let mut part = Part {
        target: connection.target(),
        ..Part::default()
    };
    let mut ticks = run.ticks(index);
    let batch = run.pace.map_or(1, |(_, batch)| batch);
    let mut pause = false;
    'run: loop {
        if let Some(ticks) = ticks.as_mut() {
            if run.over() {
                break;
            }
            ticks.tick().await;
        }
        for _ in 0..batch {
            if run.over() {
                break 'run;
            }
            let n = run.next.fetch_add(1, Ordering::Relaxed);
            if n >= run.requests {
                break 'run;
            }
            if pause {
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
            let request = (run.make)(n);
            run.live.sending();
            let sent = Instant::now();
            let result = connection
                .exchange(&request, run.answer_limit, run.keep_answers)
                .await;
            pause = matches!(
                &result,
                Err(Failure {
                    connecting: true,
                    ..
                })
            );
            part.record(&run, n, sent, result);
        }
    }
    (connection, part)
}

/// What one connection counted.
#[derive(Default)]
struct Part {
    target: usize,
    tally: Tally,
    bins: Vec<Tally>,
    keys: BTreeMap<usize, Tally>,
    latencies: Vec<Duration>,
    answers: Vec<(u64, Result<Resp, String>)>,
}

impl Part {
    fn record<F>(&mut self, run: &Run<F>, n: u64, sent: Instant, result: Result<Answer, Failure>) {
        let took = sent.elapsed();
        let status = match &result {
            Ok(answer) => Ok(answer.status),
            Err(failure) => Err(failure.message.as_str()),
        };
        run.live.record(status);
        self.tally.record(n, sent, took, status);
        if let Some(bin) = run.bin {
            let at = (sent.duration_since(run.started).as_nanos() / bin.as_nanos()) as usize;
            if self.bins.len() <= at {
                self.bins.resize_with(at + 1, Tally::default);
            }
            self.bins[at].record(n, sent, took, status);
        }
        if let Some(key_of) = &run.key_of {
            self.keys
                .entry(key_of(n))
                .or_default()
                .record(n, sent, took, status);
        }
        if run.keep_latencies {
            self.latencies.push(took);
        }
        if run.keep_answers {
            let answer = match result {
                Ok(answer) => answer.resp.ok_or_else(|| "no response kept".to_string()),
                Err(failure) => Err(failure.message),
            };
            self.answers.push((n, answer));
        }
    }

    fn add_to(self, outcome: &mut Outcome, answers: &mut BTreeMap<u64, Result<Resp, String>>) {
        outcome.total.merge(&self.tally);
        if let Some(target) = outcome.per_target.get_mut(self.target) {
            target.merge(&self.tally);
        }
        if outcome.bins.len() < self.bins.len() {
            outcome.bins.resize_with(self.bins.len(), Tally::default);
        }
        for (sum, bin) in outcome.bins.iter_mut().zip(&self.bins) {
            sum.merge(bin);
        }
        for (key, tally) in &self.keys {
            if let Some(sum) = outcome
                .per_key
                .get_mut(*key)
                .and_then(|row| row.get_mut(self.target))
            {
                sum.merge(tally);
            }
        }
        outcome.latencies.extend(self.latencies);
        answers.extend(self.answers);
    }
}
