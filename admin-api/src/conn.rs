//! Serving connections within a budget: the accept loop of both the plain and the TLS
//! listener, with a cap on concurrent connections, a TLS handshake timeout, a request-head
//! read timeout and an idle keep-alive timeout (`sluice serve --max-connections`,
//! `--tls-handshake-timeout`, `--header-read-timeout`, `--idle-timeout`).
//!
//! Without them, clients that open connections and send nothing, or half a request head,
//! hold a file descriptor and a task each for ever, until valid clients cannot connect.
//! hyper's own `header_read_timeout` bounds the head (it runs from the moment the
//! connection starts waiting for one, so it also bounds an idle keep-alive connection);
//! the idle timeout closes a connection that has had no request in flight for that long.
//! Over the cap, a new connection is closed at once rather than queued.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::http::ConnectionMetrics;

/// The budget of every connection, and how many may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// How long a client may take to send a request's head (line and headers), counted
    /// from when the connection starts waiting for it.
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight is kept open.
    pub idle_timeout: Duration,
    /// How long a client may take to finish its TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Connections open at once (handshaking, idle or busy); more are closed at once.
    pub max_connections: usize,
}

/// `--header-read-timeout`'s default.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// `--idle-timeout`'s default: longer than a proxy's report interval (about 2 s), so a
/// proxy keeps its connection.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// `--tls-handshake-timeout`'s default.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// `--max-connections`' default: well under a default file-descriptor limit of 1,024 once
/// the database pool and the process's own files are counted, and far above what a fleet
/// of proxies (one or two connections each) and a few dashboards need.
pub const MAX_CONNECTIONS: usize = 768;

/// Header fields a request may have; more are answered 431 (hyper's default, stated).
pub const MAX_HEADERS: usize = 100;
/// Bytes a request's head (request line, query string included, and headers) may take;
/// more are answered 431. A browser's head, cookies included, is a few kilobytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            tls_handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

impl ConnLimits {
    /// Why these limits cannot be served with, for `sluice serve`'s error message.
    pub fn check(&self) -> Result<(), String> {
        if self.max_connections == 0 || u32::try_from(self.max_connections).is_err() {
            return Err(format!(
                "--max-connections {}: give 1 to {}",
                self.max_connections,
                u32::MAX
            ));
        }
        for (flag, value) in [
            ("--header-read-timeout", self.header_read_timeout),
            ("--idle-timeout", self.idle_timeout),
            ("--tls-handshake-timeout", self.tls_handshake_timeout),
        ] {
            if value < Duration::from_millis(1) {
                return Err(format!("{flag} must be at least 1ms"));
            }
        }
        Ok(())
    }
}

/// Accepts connections from `listener` (over TLS when `tls` is given) and serves `app` on
/// each, within `limits`, until `stop` resolves; then stops accepting, lets every
/// connection finish its request in flight, and returns once all have closed.
pub(crate) async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Router,
    limits: ConnLimits,
    counts: ConnectionMetrics,
    stop: impl Future<Output = ()>,
) -> io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let (closing, _) = tokio::sync::watch::channel(false);
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // As axum's own listener does: errors of one connection are skipped;
                // others (out of file descriptors) are logged and waited out.
                if !matches!(
                    err.kind(),
                    io::ErrorKind::ConnectionRefused
                        | io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                ) {
                    tracing::error!("accepting a connection: {err}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            // Closed at once: the client sees its connection end and may retry, instead
            // of waiting in a queue behind connections that may never finish.
            tracing::debug!(%peer, "connection refused: --max-connections reached");
            counts.refused.inc();
            drop(tcp);
            continue;
        };
        let permit = Open::counted(permit, &counts);
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let tls = tls.clone();
        let counts = counts.clone();
        let closing = closing.subscribe();
        tokio::spawn(async move {
            match tls {
                None => connection(tcp, peer, app, limits, closing, permit).await,
                Some(acceptor) => {
                    let handshake = acceptor.accept(tcp);
                    match tokio::time::timeout(limits.tls_handshake_timeout, handshake).await {
                        Ok(Ok(stream)) => {
                            connection(stream, peer, app, limits, closing, permit).await;
                        }
                        // A client that does not speak TLS or does not trust the
                        // certificate: its problem, worth a debug line and a count only.
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, "TLS handshake failed: {err}");
                            counts.handshake_failed(Some(&err));
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            counts.handshake_failed(None);
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    closing.send_replace(true);
    // Every connection holds a permit until it has closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _all_closed = open.acquire_many(all).await;
    Ok(())
}

/// A connection's place under the cap, counted in `sluice_admin_open_connections` until
/// the connection closes.
#[derive(Debug)]
struct Open {
    _permit: OwnedSemaphorePermit,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Open {
    fn counted(permit: OwnedSemaphorePermit, counts: &ConnectionMetrics) -> Open {
        counts.open.inc();
        Open {
            _permit: permit,
            gauge: counts.open.clone(),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// What a connection is doing, for its idle timer.
#[derive(Debug)]
struct Activity {
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
}

/// One request in flight on a connection, until its response body is dropped (sent,
/// or abandoned): a long-poll or a metrics stream keeps its connection busy, not idle.
#[derive(Debug)]
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut since) = self.0.idle_since.lock() {
            *since = Instant::now();
        }
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Activity {
    /// When the connection will have been idle for `idle`; `None` while a request is in
    /// flight.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        self.idle_since.lock().ok().map(|since| *since + idle)
    }
}

/// Resolves once the connection has had no request in flight for `idle`.
async fn idle_for(activity: &Activity, idle: Duration) {
    loop {
        match activity.idle_deadline(idle) {
            Some(deadline) if deadline <= Instant::now() => return,
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => tokio::time::sleep(idle).await,
        }
    }
}

/// Resolves once the server stops taking connections.
async fn stopping(closing: &mut tokio::sync::watch::Receiver<bool>) {
    // An error means the server is gone: stopping too.
    let _ = closing.wait_for(|closed| *closed).await;
}

/// Serves one connection until the client closes it, its head or idle timer runs out, or
/// the server stops.
async fn connection<S>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    limits: ConnLimits,
    mut closing: tokio::sync::watch::Receiver<bool>,
    _open: Open,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        idle_since: Mutex::new(Instant::now()),
    });
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
        // What axum's `into_make_service_with_connect_info` would add: the ruleset and
        // report endpoints and the failed-authentication limit read the peer from it.
        request.extensions_mut().insert(ConnectInfo(peer));
        let busy = InFlight::start(&requests);
        let app = app.clone();
        async move {
            let Ok(response) = app.oneshot(request.map(Body::new)).await;
            // The guard lives as long as the body: dropped when it is sent or abandoned.
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &busy;
                    frame
                }))
            }))
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(MAX_HEADERS)
        .max_header_size(MAX_HEAD_BYTES);
    let served = http.serve_connection(TokioIo::new(stream), service);
    let mut served = std::pin::pin!(served);
    tokio::select! {
        result = served.as_mut() => {
            if let Err(err) = result {
                tracing::debug!(%peer, "connection ended: {err}");
            }
        }
        () = idle_for(&activity, limits.idle_timeout) => {
            tracing::debug!(%peer, "idle connection closed");
        }
        () = stopping(&mut closing) => {
            // Finishes the request in flight (held long-polls and streams end on the same
            // signal), then closes.
            served.as_mut().graceful_shutdown();
            let _ = served.await;
        }
    }
}
