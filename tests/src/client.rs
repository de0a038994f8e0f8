//! A load driver: K keep-alive HTTP/1.1 connections sending requests concurrently.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Method;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HOST, HeaderValue};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// One request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Req {
    pub method: Method,
    /// Path and query, e.g. `/api/items?page=2`.
    pub path: String,
    /// Sent as given; `host` is added unless present.
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Req {
    pub fn new(method: Method, path: impl Into<String>) -> Req {
        Req {
            method,
            path: path.into(),
            headers: Vec::new(),
            body: Bytes::new(),
        }
    }

    pub fn get(path: impl Into<String>) -> Req {
        Req::new(Method::GET, path)
    }

    pub fn post(path: impl Into<String>, body: impl Into<Bytes>) -> Req {
        Req {
            body: body.into(),
            ..Req::new(Method::POST, path)
        }
    }

    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// One response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resp {
    pub status: u16,
    /// In arrival order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The body, decoded as UTF-8 (lossily).
    pub body: String,
}

impl Resp {
    /// The first value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Every value of a header.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as JSON; panics (showing the body) if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|err| panic!("response body is not JSON ({err}): {}", self.body))
    }

    /// For [`crate::Upstream`]'s echo: a header of the request as the upstream received it.
    pub fn upstream_header(&self, name: &str) -> Option<String> {
        self.json()["headers"][name.to_ascii_lowercase()]
            .as_str()
            .map(str::to_string)
    }
}

/// What a counting run produced: statuses only, for runs too large to keep responses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusCounts {
    pub by_status: BTreeMap<u16, u64>,
    /// Requests that got no response (connection refused or reset, timeout).
    pub errors: u64,
    pub first_error: Option<String>,
    /// From just before the first request was sent to just after the last response came:
    /// every decision the server made for this run happened inside this window.
    pub elapsed: Duration,
    /// From the first response's arrival to the last request's sending: the server was
    /// deciding requests of this run at least from the start to the end of this window
    /// (zero when fewer than two requests were answered).
    pub busy: Duration,
}

impl StatusCounts {
    pub fn get(&self, status: u16) -> u64 {
        self.by_status.get(&status).copied().unwrap_or(0)
    }

    /// Responses received, of any status.
    pub fn responses(&self) -> u64 {
        self.by_status.values().sum()
    }

    /// Responses per second over the run.
    pub fn rate(&self) -> f64 {
        self.responses() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn merge(&mut self, other: StatusCounts) {
        for (status, n) in other.by_status {
            *self.by_status.entry(status).or_default() += n;
        }
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

type Sender = SendRequest<Full<Bytes>>;
type Pool = Arc<tokio::sync::Mutex<Vec<Option<Sender>>>>;

/// Holds `connections` keep-alive HTTP/1.1 connections to one address and spreads requests
/// over them, one in flight per connection. Each is its own TCP connection, so the kernel
/// spreads them over Envoy's workers as it would real clients.
///
/// The connections live on the client's own thread and runtime; the methods block, and work
/// from plain `#[test]`s and from async tests alike. Every run is bounded: a per-request
/// timeout and an overall one (see [`Client::with_timeouts`]). A connection the server
/// closes is reopened before its next request.
#[derive(Debug)]
pub struct Client {
    peer: Peer,
    host: HeaderValue,
    connections: usize,
    request_timeout: Duration,
    run_timeout: Duration,
    pool: Pool,
    runtime: tokio::runtime::Handle,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Client {
    /// Opens `connections` connections to `addr` now; panics if it cannot.
    pub fn connect(addr: SocketAddr, connections: usize) -> Client {
        Client::open_to(Peer { addr, tls: None }, connections)
    }

    /// [`Client::connect`] over TLS with `config` (e.g. [`crate::TestPki::client_config`]),
    /// checking that the server's certificate names `addr`'s IP address.
    pub fn connect_tls(
        addr: SocketAddr,
        connections: usize,
        config: Arc<rustls::ClientConfig>,
    ) -> Client {
        let tls = Tls {
            connector: tokio_rustls::TlsConnector::from(config),
            name: ServerName::IpAddress(addr.ip().into()),
        };
        Client::open_to(
            Peer {
                addr,
                tls: Some(Arc::new(tls)),
            },
            connections,
        )
    }

    fn open_to(peer: Peer, connections: usize) -> Client {
        let addr = peer.addr;
        assert!(connections > 0, "a client needs at least one connection");
        let (handle_tx, handle_rx) = mpsc::channel();
        let (shutdown, stop) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("client-{addr}"))
            .spawn(move || {
                // One thread is plenty for loopback HTTP/1.1 and leaves the other cores to
                // Envoy, which is what the tests measure.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => panic!("starting the client's runtime: {err}"),
                };
                let _ = handle_tx.send(runtime.handle().clone());
                let _ = runtime.block_on(stop);
            })
            .unwrap_or_else(|err| panic!("starting the client's thread: {err}"));
        let runtime = handle_rx
            .recv()
            .unwrap_or_else(|_| panic!("the client's runtime did not start"));
        let host = HeaderValue::from_str(&addr.to_string())
            .unwrap_or_else(|err| panic!("{addr} as a Host header: {err}"));
        let client = Client {
            peer: peer.clone(),
            host,
            connections,
            request_timeout: Duration::from_secs(10),
            run_timeout: Duration::from_secs(300),
            pool: Arc::new(tokio::sync::Mutex::new(Vec::new())),
            runtime,
            shutdown: Some(shutdown),
            thread: Some(thread),
        };
        let pool = Arc::clone(&client.pool);
        client
            .execute(async move {
                let mut senders = Vec::with_capacity(connections);
                for _ in 0..connections {
                    senders.push(Some(open(&peer).await?));
                }
                *pool.lock().await = senders;
                Ok::<_, anyhow::Error>(())
            })
            .unwrap_or_else(|err| panic!("connecting to {addr}: {err:#}"));
        client
    }

    /// Changes the time one request may take and the time a whole run may take.
    pub fn with_timeouts(mut self, request: Duration, run: Duration) -> Client {
        self.request_timeout = request;
        self.run_timeout = run;
        self
    }

    pub fn addr(&self) -> SocketAddr {
        self.peer.addr
    }

    pub fn connections(&self) -> usize {
        self.connections
    }

    /// Sends one request; panics if no response comes.
    pub fn send(&self, request: Req) -> Resp {
        self.run([request])
            .pop()
            .unwrap_or_else(|| panic!("no response"))
    }

    /// Sends every request, `connections` at a time, and returns the responses in request
    /// order. Panics if any request gets no response.
    pub fn run(&self, requests: impl IntoIterator<Item = Req>) -> Vec<Resp> {
        self.try_run(requests)
            .into_iter()
            .enumerate()
            .map(|(i, result)| result.unwrap_or_else(|err| panic!("request #{i}: {err}")))
            .collect()
    }

    /// Like [`Client::run`], with failures (no response) as errors in place.
    pub fn try_run(&self, requests: impl IntoIterator<Item = Req>) -> Vec<Result<Resp, String>> {
        let requests: Arc<Vec<Req>> = Arc::new(requests.into_iter().collect());
        let total = requests.len();
        let next = Arc::new(AtomicUsize::new(0));
        let per_request = self.request_timeout;
        let host = self.host.clone();
        let results = self.on_every_connection(move |mut slot, peer| {
            let requests = Arc::clone(&requests);
            let next = Arc::clone(&next);
            let host = host.clone();
            async move {
                let mut out = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(request) = requests.get(i) else {
                        break;
                    };
                    let result = exchange(&mut slot, &peer, &host, request, per_request, collect)
                        .await
                        .map_err(|err| format!("{err:#}"));
                    out.push((i, result));
                }
                (slot, out)
            }
        });
        let mut ordered: Vec<Option<Result<Resp, String>>> = vec![None; total];
        for (i, result) in results.into_iter().flatten() {
            ordered[i] = Some(result);
        }
        ordered
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err("not sent: the run timed out".to_string())))
            .collect()
    }

    /// Sends `total` requests made by `make(i)` for i in `0..total`, keeping only status
    /// counts: for millions of requests. Requests that fail are counted, not fatal. For load
    /// that must last a while, use [`Client::run_for`]: how long a count takes depends on
    /// the machine.
    pub fn run_counting<F>(&self, total: u64, make: F) -> StatusCounts
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        self.drive(Some(total), None, make)
    }

    /// Sends requests made by `make(i)` for i = 0, 1, 2, ... on every connection until
    /// `duration` has passed, keeping only status counts: load that lasts as long on a fast
    /// machine as on a slow one.
    pub fn run_for<F>(&self, duration: Duration, make: F) -> StatusCounts
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        self.drive(None, Some(duration), make)
    }

    /// Like [`Client::run_for`], but stops after `total` requests if they are sent before
    /// `duration` has passed.
    pub fn run_counting_for<F>(&self, total: u64, duration: Duration, make: F) -> StatusCounts
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        self.drive(Some(total), Some(duration), make)
    }

    /// Sends requests until `total` were taken or `duration` has passed, whichever comes
    /// first (at least one of them is given).
    fn drive<F>(&self, total: Option<u64>, duration: Option<Duration>, make: F) -> StatusCounts
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        let total = total.unwrap_or(u64::MAX);
        let started = Instant::now();
        let deadline = duration.map(|d| started + d);
        let make = Arc::new(make);
        let next = Arc::new(AtomicU64::new(0));
        let per_request = self.request_timeout;
        let host = self.host.clone();
        let per_connection = self.on_every_connection(move |mut slot, peer| {
            let make = Arc::clone(&make);
            let next = Arc::clone(&next);
            let host = host.clone();
            async move {
                let mut counts = StatusCounts::default();
                let mut first_response: Option<Instant> = None;
                let mut last_sent: Option<Instant> = None;
                loop {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    let request = make(i);
                    last_sent = Some(Instant::now());
                    match exchange(&mut slot, &peer, &host, &request, per_request, drain).await {
                        Ok(status) => {
                            first_response.get_or_insert_with(Instant::now);
                            *counts.by_status.entry(status).or_default() += 1;
                        }
                        Err(err) => {
                            counts.errors += 1;
                            if counts.first_error.is_none() {
                                counts.first_error = Some(format!("request #{i}: {err:#}"));
                            }
                        }
                    }
                }
                (slot, (counts, first_response, last_sent))
            }
        });
        let finished = per_connection.len();
        let mut counts = StatusCounts::default();
        let mut first_response: Option<Instant> = None;
        let mut last_sent: Option<Instant> = None;
        for (part, first, last) in per_connection {
            counts.merge(part);
            first_response = match (first_response, first) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            last_sent = last_sent.max(last);
        }
        if finished < self.connections {
            // The run timeout aborted some connections' work, and their counts with it.
            let stuck = self.connections - finished;
            counts.errors += 1;
            counts.first_error.get_or_insert_with(|| {
                format!("{stuck} connections did not finish: the run timed out")
            });
        } else if deadline.is_none() {
            let unsent = total.saturating_sub(counts.responses() + counts.errors);
            if unsent > 0 {
                counts.errors += unsent;
                counts.first_error.get_or_insert_with(|| {
                    format!("{unsent} requests not sent: the run timed out")
                });
            }
        }
        counts.elapsed = started.elapsed();
        counts.busy = match (first_response, last_sent) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        };
        counts
    }

    /// Runs `work` once per connection, concurrently, each owning its connection for the
    /// run, and puts the connections back afterwards. Bounded by the run timeout.
    fn on_every_connection<W, Fut, T>(&self, work: W) -> Vec<T>
    where
        W: Fn(Option<Sender>, Peer) -> Fut + Send + 'static,
        Fut: Future<Output = (Option<Sender>, T)> + Send + 'static,
        T: Send + 'static,
    {
        let pool = Arc::clone(&self.pool);
        let peer = self.peer.clone();
        let connections = self.connections;
        let run_timeout = self.run_timeout;
        self.execute(async move {
            // Runs from several threads take turns: each needs every connection.
            let mut pool = pool.lock_owned().await;
            pool.resize_with(connections, || None);
            let mut tasks = JoinSet::new();
            for slot in pool.iter_mut() {
                tasks.spawn(work(slot.take(), peer.clone()));
            }
            let mut outputs = Vec::with_capacity(connections);
            let gathered = tokio::time::timeout(run_timeout, async {
                while let Some(joined) = tasks.join_next().await {
                    match joined {
                        Ok((slot, output)) => {
                            if let Some(empty) = pool.iter_mut().find(|s| s.is_none()) {
                                *empty = slot;
                            }
                            outputs.push(output);
                        }
                        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                        Err(_) => {}
                    }
                }
            })
            .await;
            // On timeout the unfinished tasks are aborted with the JoinSet and their
            // connections reopened by the next run.
            drop(gathered);
            outputs
        })
    }

    /// Runs a future on the client's runtime and waits for it.
    fn execute<F, T>(&self, future: F) -> T
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, result) = mpsc::channel();
        self.runtime.spawn(async move {
            let _ = reply.send(future.await);
        });
        // Every run bounds itself by the run timeout; this is a backstop against a stuck
        // runtime.
        result
            .recv_timeout(self.run_timeout + Duration::from_secs(30))
            .unwrap_or_else(|err| panic!("the client's work did not finish: {err}"))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where the connections go: an address, over TLS or not.
#[derive(Debug, Clone)]
struct Peer {
    addr: SocketAddr,
    tls: Option<Arc<Tls>>,
}

struct Tls {
    connector: tokio_rustls::TlsConnector,
    /// What the server's certificate must name.
    name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("name", &self.name).finish()
    }
}

async fn open(peer: &Peer) -> Result<Sender> {
    let addr = peer.addr;
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    // Ends when either side closes; the sender then reports closed and is replaced.
    let sender = match &peer.tls {
        None => {
            let (sender, connection) = http1::handshake(TokioIo::new(stream))
                .await
                .context("HTTP/1.1 handshake")?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            sender
        }
        Some(tls) => {
            let stream = tls
                .connector
                .connect(tls.name.clone(), stream)
                .await
                .with_context(|| format!("TLS handshake with {addr}"))?;
            let (sender, connection) = http1::handshake(TokioIo::new(stream))
                .await
                .context("HTTP/1.1 handshake")?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            sender
        }
    };
    Ok(sender)
}

/// A usable sender in `slot`, reopening the connection if the server closed it.
async fn ready<'a>(slot: &'a mut Option<Sender>, peer: &Peer) -> Result<&'a mut Sender> {
    let usable = match slot.as_mut() {
        Some(sender) => !sender.is_closed() && sender.ready().await.is_ok(),
        None => false,
    };
    if !usable {
        let mut sender = open(peer).await?;
        sender.ready().await.context("new connection not ready")?;
        *slot = Some(sender);
    }
    slot.as_mut().ok_or_else(|| anyhow!("no connection"))
}

async fn exchange<T, R, Fut>(
    slot: &mut Option<Sender>,
    peer: &Peer,
    host: &HeaderValue,
    request: &Req,
    timeout: Duration,
    read: R,
) -> Result<T>
where
    R: FnOnce(hyper::Response<Incoming>) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let outcome = tokio::time::timeout(timeout, async {
        let request = build(request, host)?;
        let sender = ready(slot, peer).await?;
        let response = sender
            .send_request(request)
            .await
            .context("sending the request")?;
        read(response).await
    })
    .await;
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => {
            // The connection's state is unknown after a failure: start afresh.
            *slot = None;
            Err(err)
        }
        Err(_elapsed) => {
            *slot = None;
            Err(anyhow!("no response within {} s", timeout.as_secs_f32()))
        }
    }
}

fn build(request: &Req, host: &HeaderValue) -> Result<hyper::Request<Full<Bytes>>> {
    let mut builder = hyper::Request::builder()
        .method(request.method.clone())
        .uri(request.path.as_str());
    // hyper's connection-level client sends no Host of its own, and Envoy rejects HTTP/1.1
    // requests without one.
    if !request
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        builder = builder.header(HOST, host.clone());
    }
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder
        .body(Full::new(request.body.clone()))
        .with_context(|| format!("building the request {} {}", request.method, request.path))
}

async fn collect(response: hyper::Response<Incoming>) -> Result<Resp> {
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .context("reading the response body")?
        .to_bytes();
    Ok(Resp {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// Reads the body to the end without keeping it, so the connection can be reused.
async fn drain(response: hyper::Response<Incoming>) -> Result<u16> {
    let status = response.status().as_u16();
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        frame.context("reading the response body")?;
    }
    Ok(status)
}
