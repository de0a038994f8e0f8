//! Closed-loop HTTP load on several Envoys at once, for the fleet-wide sections: each
//! connection sends its next request as soon as the last one is answered, cycling
//! through client keys, until the run's deadline. Answers are counted per Envoy, per
//! client key and per 100 ms of the run (with the slowest answer of each 100 ms), so a
//! fault run can tell what happened before, during and after the fault.
//!
//! wrk cannot tell which key an answer belongs to; this can, which the per-client bar
//! needs. It shares the machine's cores with the Envoys, so the offered load is what
//! the machine gives, and the sections report it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Width of one bin of the run's timeline.
pub const BIN: Duration = Duration::from_millis(100);
/// An answer slower than this is counted as an error: nothing on the request path may wait.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);
const HEADER: &str = "x-api-key";

/// What to send.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Each Envoy's listener and how many connections it gets (the traffic split).
    pub targets: Vec<(SocketAddr, usize)>,
    pub path: String,
    /// Requests carry `x-api-key: PREFIXn` for n in `0..clients`, in turn.
    pub key_prefix: String,
    pub clients: u64,
    pub duration: Duration,
}

/// Answers of one kind of outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub admitted: u64,
    pub throttled: u64,
    /// Any other status.
    pub other: u64,
    /// No answer: connection errors and answers slower than [`ANSWER_LIMIT`].
    pub errors: u64,
    /// The slowest answer, in microseconds.
    pub max_latency_us: u64,
}

impl Counts {
    pub fn answered(&self) -> u64 {
        self.admitted + self.throttled + self.other
    }

    fn add(&mut self, other: &Counts) {
        self.admitted += other.admitted;
        self.throttled += other.throttled;
        self.other += other.other;
        self.errors += other.errors;
        self.max_latency_us = self.max_latency_us.max(other.max_latency_us);
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub per_target: Vec<Counts>,
    /// Admitted requests per client key and Envoy: `per_client[key][target]`.
    pub per_client: Vec<Vec<u64>>,
    /// One entry per [`BIN`] from the start of the run.
    pub bins: Vec<Counts>,
    /// From the first request sent to the last answer: every decision fell inside it.
    pub elapsed: Duration,
    /// Latency percentiles over every answer, in microseconds: p50, p99.
    pub p50_us: u64,
    pub p99_us: u64,
}

impl Outcome {
    pub fn total(&self) -> Counts {
        let mut total = Counts::default();
        for c in &self.per_target {
            total.add(c);
        }
        total
    }

    /// Counts over the bins in `[from, to)` (times since the start of the run).
    pub fn between(&self, from: Duration, to: Duration) -> Counts {
        let first = (from.as_millis() / BIN.as_millis()) as usize;
        let last = ((to.as_millis() / BIN.as_millis()) as usize).min(self.bins.len());
        let mut sum = Counts::default();
        for bin in self.bins.get(first..last).unwrap_or_default() {
            sum.add(bin);
        }
        sum
    }

    pub fn offered_per_second(&self) -> f64 {
        self.total().answered() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Default)]
struct AtomicCounts {
    admitted: AtomicU64,
    throttled: AtomicU64,
    other: AtomicU64,
    errors: AtomicU64,
    max_latency_us: AtomicU64,
}

impl AtomicCounts {
    fn record(&self, status: Option<u16>, latency: Duration) {
        let counter = match status {
            Some(200..=299) => &self.admitted,
            Some(429) => &self.throttled,
            Some(_) => &self.other,
            None => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.max_latency_us
            .fetch_max(latency.as_micros() as u64, Ordering::Relaxed);
    }

    fn load(&self) -> Counts {
        Counts {
            admitted: self.admitted.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
            other: self.other.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            max_latency_us: self.max_latency_us.load(Ordering::Relaxed),
        }
    }
}

struct Shared {
    plan: Plan,
    started: Instant,
    next_key: AtomicU64,
    per_target: Vec<AtomicCounts>,
    per_client: Vec<AtomicU64>,
    bins: Vec<AtomicCounts>,
}

/// Runs `plan` from now until its duration has passed; blocks.
pub fn run(plan: &Plan) -> Result<Outcome> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the load generator's runtime")?;
    let bins = (plan.duration.as_millis() / BIN.as_millis()) as usize + 2;
    let shared = Arc::new(Shared {
        plan: plan.clone(),
        started: Instant::now(),
        next_key: AtomicU64::new(0),
        per_target: plan
            .targets
            .iter()
            .map(|_| AtomicCounts::default())
            .collect(),
        per_client: (0..plan.clients * plan.targets.len() as u64)
            .map(|_| AtomicU64::new(0))
            .collect(),
        bins: (0..bins).map(|_| AtomicCounts::default()).collect(),
    });
    let latencies = runtime.block_on(async {
        let mut tasks = Vec::new();
        for (target, &(addr, connections)) in plan.targets.iter().enumerate() {
            for _ in 0..connections {
                tasks.push(tokio::spawn(connection(Arc::clone(&shared), target, addr)));
            }
        }
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.unwrap_or_default());
        }
        latencies
    });
    let elapsed = shared.started.elapsed();
    let mut latencies = latencies;
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len().saturating_sub(1)) as f64 * q) as usize)
            .copied()
            .unwrap_or(0) as u64
    };
    Ok(Outcome {
        per_target: shared.per_target.iter().map(AtomicCounts::load).collect(),
        per_client: shared
            .per_client
            .chunks(plan.targets.len().max(1))
            .map(|row| row.iter().map(|n| n.load(Ordering::Relaxed)).collect())
            .collect(),
        bins: shared.bins.iter().map(AtomicCounts::load).collect(),
        elapsed,
        p50_us: at(0.5),
        p99_us: at(0.99),
    })
}

/// One connection's closed loop; returns its answers' latencies in microseconds.
async fn connection(shared: Arc<Shared>, target: usize, addr: SocketAddr) -> Vec<u32> {
    let deadline = shared.started + shared.plan.duration;
    let mut latencies = Vec::new();
    let mut sender = None;
    while Instant::now() < deadline {
        if sender.is_none() {
            sender = connect(addr).await;
            if sender.is_none() {
                shared.per_target[target].record(None, Duration::ZERO);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        }
        let Some(send) = sender.as_mut() else {
            continue;
        };
        let n = shared.next_key.fetch_add(1, Ordering::Relaxed) % shared.plan.clients.max(1);
        let request = Request::get(shared.plan.path.as_str())
            .header("host", "bench")
            .header(HEADER, format!("{}{n}", shared.plan.key_prefix))
            .body(Empty::<Bytes>::new());
        let Ok(request) = request else {
            break;
        };
        let sent = Instant::now();
        let answer = tokio::time::timeout(ANSWER_LIMIT, async {
            let response = send.send_request(request).await.ok()?;
            let status = response.status().as_u16();
            response.into_body().collect().await.ok()?;
            Some(status)
        })
        .await
        .ok()
        .flatten();
        let latency = sent.elapsed();
        if answer.is_none() {
            sender = None;
        }
        shared.per_target[target].record(answer, latency);
        let bin = (sent.duration_since(shared.started).as_millis() / BIN.as_millis()) as usize;
        if let Some(bin) = shared.bins.get(bin) {
            bin.record(answer, latency);
        }
        if matches!(answer, Some(200..=299)) {
            let at = n as usize * shared.plan.targets.len() + target;
            if let Some(count) = shared.per_client.get(at) {
                count.fetch_add(1, Ordering::Relaxed);
            }
        }
        latencies.push(latency.as_micros().min(u32::MAX as u128) as u32);
    }
    latencies
}

/// One HTTP/1.1 connection to `addr` (no Nagle delay), or `None` if it cannot be made.
pub async fn connect(
    addr: SocketAddr,
) -> Option<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(driver);
    Some(sender)
}
