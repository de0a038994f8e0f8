//! Envoy's rate limit service: `sluice serve --rls-listen ADDR` answers
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC (HTTP/2, plain
//! or with the server's `--tls-cert`/`--tls-key`), from the same process, database and
//! bucket store as the HTTP API. The decisions are the core's (`sluice_core::rls`), the
//! buckets the coordinator's (in memory, or in Redis with `--redis`, so any number of
//! replicas answer one fleet); this module is the glue.
//!
//! Its parts, each using only those before it: `limits` (every bound a client is held
//! to), `rules` (the RLS rules in force, following the ruleset version), `stats` (the
//! decisions' counts, handed to the metrics pipeline as a proxy's report), `service` (the
//! call: convert, check, plan, charge, answer, count), `quota` (the quota service's
//! streams, RLQS, experimental: usage charged, assignments answered, every stream
//! bounded), `listener` (connections within the cap, TLS handshakes within their
//! timeout, client certificates checked when asked), `auth` (a call's token).
//!
//! Architecture Invariant: no call is answered, and nothing charged, before its caller is
//! authenticated as `sluice serve` was told: a proxy token in the call's metadata
//! ([`RlsAuth::Token`]) unless `--rls-auth none` says the listener is reached by trusted
//! peers only, and a client certificate from `--rls-client-ca` when given.

mod auth;
mod limits;
mod listener;
mod quota;
mod rules;
mod service;
mod stats;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

pub use auth::RlsAuth;
pub use limits::{
    ABANDON_AFTER, ASSIGNMENT_TTL, KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT, MAX_CONNECTIONS,
    MAX_HEADER_LIST_BYTES, MAX_MESSAGE_BYTES, MAX_QUOTA_STREAMS, MAX_STREAM_BUCKETS, MAX_STREAMS,
    QUOTA_IDLE_TIMEOUT, REQUEST_TIMEOUT, RlsLimits,
};

use crate::http::AppState;

/// A running RLS listener.
#[derive(Debug)]
pub(crate) struct RlsServer {
    pub(crate) addr: SocketAddr,
    pub(crate) task: JoinHandle<io::Result<()>>,
    /// Hands the decisions' counts to the pipeline; its last report comes after shutdown.
    pub(crate) stats: JoinHandle<()>,
}

/// Binds `listen` and serves the rate limit service until `state` shuts down.
pub(crate) async fn start(
    state: AppState,
    listen: SocketAddr,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: RlsLimits,
    auth: RlsAuth,
) -> io::Result<RlsServer> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let current = rules::Current::default();
    current.load(&state).await;
    tokio::spawn(current.clone().follow(state.clone()));
    let acceptor = tls.map(|config| {
        // The same certificate and key, speaking HTTP/2 as gRPC needs.
        let mut config = (*config).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    });
    let counts = state.rls_metrics().connections.clone();
    let incoming = ReceiverStream::new(listener::accept(listener, acceptor, limits, counts));
    let stats = Arc::new(stats::Stats::default());
    let reporter = stats.clone();
    let reporting = state.clone();
    let stats_task =
        tokio::spawn(async move { reporter.run(reporting, format!("rls@{addr}")).await });
    let quota = RateLimitQuotaServiceServer::new(quota::Rlqs::new(
        state.clone(),
        current.clone(),
        stats.clone(),
        limits,
        auth,
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let service = RateLimitServiceServer::new(service::Rls {
        state: state.clone(),
        rules: current,
        stats,
        auth,
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let server = tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_streams)
        .concurrency_limit_per_connection(limits.max_streams as usize)
        .timeout(limits.request_timeout)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .add_service(service)
        .add_service(quota);
    let task = tokio::spawn(async move {
        server
            .serve_with_incoming_shutdown(incoming, async move { state.shutting_down().await })
            .await
            .map_err(io::Error::other)
    });
    Ok(RlsServer {
        addr,
        task,
        stats: stats_task,
    })
}
