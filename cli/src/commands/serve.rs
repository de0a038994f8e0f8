//! `sluice serve`: the admin API server, from flags to a running [`server`] and back down
//! on SIGINT or SIGTERM.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use sluice_admin::conn::ConnLimits;
use sluice_admin::http::AppState;
use sluice_admin::http::failed_auth::FailureLimit;
use sluice_admin::http::report_guard::ReportRate;
use sluice_admin::pipeline::MetricsConfig;
use sluice_admin::rls::{RlsAuth, RlsLimits};
use sluice_admin::server::{self, ADMIN_TOKEN_ENV, Bootstrap, BootstrapError, ServeOptions};
use sluice_coordinator::Backend;
use sluice_coordinator::guard;
use sluice_coordinator::redis::RedisBuckets;
use sluice_core::listening::{RlsListening, Scheme};

use super::Failure;
use super::database::{DatabaseArgs, open_store, redact};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed).
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,

    #[command(flatten)]
    db: DatabaseArgs,

    /// How long 10-second metric buckets are kept (e.g. 24h, 3d).
    #[arg(long = "retention-10s", value_name = "DURATION", default_value = "24h", value_parser = humantime::parse_duration)]
    retention_10s: Duration,

    /// How long 1-minute metric buckets are kept.
    #[arg(long = "retention-1m", value_name = "DURATION", default_value = "14d", value_parser = humantime::parse_duration)]
    retention_1m: Duration,

    /// How long 1-hour metric buckets are kept.
    #[arg(long = "retention-1h", value_name = "DURATION", default_value = "400d", value_parser = humantime::parse_duration)]
    retention_1h: Duration,

    /// Rows each metrics table may hold (checked every minute, with retention); a table
    /// over it loses its oldest buckets first, counted in
    /// sluice_admin_metrics_rows_deleted_total and logged as a warning per table.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::pipeline::DEFAULT_MAX_ROWS_PER_TABLE, value_parser = clap::value_parser!(u64).range(1..))]
    metrics_max_rows: u64,

    /// Keep global (fleet-wide) buckets in this Redis instead of in memory, so several
    /// `sluice serve` replicas share them and they survive restarts. A Redis Cluster is
    /// named by seed nodes: redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]
    /// (the rest of the cluster is learnt from them).
    #[arg(long, env = "SLUICE_REDIS", value_name = "redis://HOST:PORT[/DB]")]
    redis: Option<String>,

    /// Serve over TLS with this PEM certificate chain (the server's certificate first, then
    /// any intermediates). Needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert's certificate.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Failed authentications (wrong tokens, sessions or sign-ins) one client address may
    /// make at once before its wrong secrets are answered 429 (valid ones are always
    /// accepted); then one more every --auth-failure-refill.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::http::failed_auth::ALLOWED_FAILURES)]
    auth_failures: u64,

    /// How often a client address regains one failed authentication (e.g. 10s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    auth_failure_refill: Duration,

    /// Most global buckets the coordinator keeps (in memory, or in --redis). A new bucket
    /// past it is granted nothing (its proxy keeps to its even share) until idle buckets
    /// are swept (in memory) or their keys expire (in Redis); counted in
    /// sluice_quota_refused_total{reason="max_buckets"}.
    #[arg(long, value_name = "N", default_value_t = guard::DEFAULT_MAX_BUCKETS)]
    quota_max_buckets: usize,

    /// Most of those buckets one proxy id may create; counted in
    /// sluice_quota_refused_total{reason="max_buckets_per_proxy"}.
    #[arg(long, value_name = "N", default_value_t = guard::DEFAULT_MAX_BUCKETS_PER_PROXY)]
    quota_max_buckets_per_proxy: usize,

    /// Reports one proxy id may send a minute (proxies report every 1 to 300 s); more are
    /// answered 429 with Retry-After and counted in
    /// sluice_admin_reports_rejected_total{reason="rate_limited"}.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::http::report_guard::DEFAULT_REPORTS_PER_MINUTE)]
    report_rate: u64,

    /// Reports one proxy id may send at once before --report-rate applies.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::http::report_guard::DEFAULT_REPORT_BURST)]
    report_burst: u64,

    /// How long a client may take to send a request's line and headers, counted from when
    /// the connection starts waiting for them (its opening, or the end of the previous
    /// response); then the connection is closed.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    header_read_timeout: Duration,

    /// How long a connection with no request in flight is kept open (long-polls and metric
    /// streams in flight keep it busy). An idle connection is closed after this or
    /// --header-read-timeout, whichever is shorter.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = humantime::parse_duration)]
    idle_timeout: Duration,

    /// How long a client may take to finish its TLS handshake (with --tls-cert).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    tls_handshake_timeout: Duration,

    /// Connections open at once, per listener (handshaking, idle or busy); a connection
    /// over the cap is closed at once. Keep it under the process's file-descriptor limit.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::conn::MAX_CONNECTIONS)]
    max_connections: usize,

    /// Serve /metrics on this address only (plain HTTP), and not on --listen, so the
    /// metrics can be kept off the network the API is reached from.
    #[arg(long, value_name = "IP:PORT")]
    metrics_listen: Option<SocketAddr>,

    /// Also serve Envoy's rate limit and quota services (envoy.service.ratelimit.v3 and
    /// rate_limit_quota.v3, gRPC) on this address, with the same TLS as --listen: rules
    /// with a `descriptor` decide them (see docs/rls.md). Needs --rls-auth.
    #[arg(long, value_name = "IP:PORT")]
    rls_listen: Option<SocketAddr>,

    /// Who may call --rls-listen: `token`, a token with the proxy role in every call's
    /// metadata (`authorization: Bearer TOKEN`; `sluice envoy-config --rls-token` writes
    /// it into Envoy's configuration); `none`, anyone who reaches the address (only for
    /// loopback, a mesh-internal address, or with --rls-client-ca). No default: versions
    /// before it answered anyone, and Envoys sending no token would be refused and fail
    /// open, unnoticed.
    #[arg(long, value_enum, value_name = "token|none", requires = "rls_listen")]
    rls_auth: Option<RlsAuthArg>,

    /// Require a client certificate chaining to these PEM CA certificates on
    /// --rls-listen (mutual TLS; needs --tls-cert). A client without one fails the TLS
    /// handshake.
    #[arg(long, value_name = "FILE", requires_all = ["rls_listen", "tls_cert"])]
    rls_client_ca: Option<PathBuf>,

    /// gRPC connections open at once on --rls-listen; more are closed at once.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::rls::MAX_CONNECTIONS)]
    rls_max_connections: usize,

    /// Calls in flight on one --rls-listen connection (HTTP/2 streams).
    #[arg(long, value_name = "N", default_value_t = sluice_admin::rls::MAX_STREAMS)]
    rls_max_streams: u32,

    /// How long one rate limit service call may take before it is answered
    /// DEADLINE_EXCEEDED.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    rls_request_timeout: Duration,

    /// Quota service (RLQS) streams open at once on --rls-listen; more are refused.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::rls::MAX_QUOTA_STREAMS)]
    rlqs_max_streams: usize,

    /// Buckets one quota stream holds; a new one past it gets no assignment.
    #[arg(long, value_name = "N", default_value_t = sluice_admin::rls::MAX_STREAM_BUCKETS)]
    rlqs_max_buckets: usize,

    /// How long a quota stream may go without a usage report before it is ended.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    rlqs_idle_timeout: Duration,

    /// A quota bucket Envoy reports no request for during this long is abandoned.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    rlqs_abandon_after: Duration,
}

/// `--rls-auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RlsAuthArg {
    Token,
    None,
}

/// What a caller of the rate limit service must show, or why `sluice serve` cannot start
/// with these flags.
fn rls_auth(args: &ServeArgs) -> Result<RlsAuth, Failure> {
    match (args.rls_listen, args.rls_auth) {
        (None, _) | (Some(_), Some(RlsAuthArg::Token)) => Ok(RlsAuth::Token),
        (Some(_), Some(RlsAuthArg::None)) => Ok(RlsAuth::None),
        (Some(_), None) => Err(Failure::BadInput(
            "--rls-listen needs --rls-auth: `token` to require a proxy token in every call \
                 (give Envoy one with `sluice envoy-config --rls-token`), or `none` to answer \
                 whoever reaches the address, as earlier versions did (loopback, a \
                 mesh-internal address, or with --rls-client-ca); see docs/rls.md#authentication"
                .into(),
        )),
    }
}

fn init_logging() {
    // RUST_LOG overrides, e.g. RUST_LOG=sluice_admin=debug shows every request.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in files and CI logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Serves until SIGINT or SIGTERM, then stops gracefully (see [`server::Server::stop`]).
pub async fn run(args: ServeArgs) -> Result<(), Failure> {
    init_logging();
    // Checked before anything else, so a wrong file is reported at once and alone.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            sluice_admin::tls::server_config(cert, key)
                .map_err(|err| Failure::BadInput(err.to_string()))?,
        ),
        _ => None,
    };
    let rls_auth = rls_auth(&args)?;
    // With client certificates the rate limit service has TLS of its own: the same
    // certificate, and a handshake that requires theirs.
    let rls_tls = match (&args.rls_client_ca, &args.tls_cert, &args.tls_key) {
        (Some(ca), Some(cert), Some(key)) => Some(
            sluice_admin::tls::client_auth_config(cert, key, ca)
                .map_err(|err| Failure::BadInput(err.to_string()))?,
        ),
        _ => None,
    };
    let auth_failures = FailureLimit {
        allowed: args.auth_failures,
        refill: args.auth_failure_refill,
    };
    if auth_failures.gcra().is_none() {
        return Err(Failure::BadInput(format!(
            "--auth-failures {} with --auth-failure-refill {}: allow at least 1, refill at least 1 ns, and keep their product under 146 years",
            args.auth_failures,
            humantime::format_duration(args.auth_failure_refill)
        )));
    }
    let report_rate = ReportRate {
        per_minute: args.report_rate,
        burst: args.report_burst,
    };
    if report_rate.gcra().is_none() {
        return Err(Failure::BadInput(format!(
            "--report-rate {} with --report-burst {}: allow 1 to 60,000,000,000 a minute and at least 1 at once",
            args.report_rate, args.report_burst
        )));
    }
    let limits = ConnLimits {
        header_read_timeout: args.header_read_timeout,
        idle_timeout: args.idle_timeout,
        tls_handshake_timeout: args.tls_handshake_timeout,
        max_connections: args.max_connections,
    };
    limits.check().map_err(Failure::BadInput)?;
    let rls_limits = RlsLimits {
        max_connections: args.rls_max_connections,
        max_streams: args.rls_max_streams,
        request_timeout: args.rls_request_timeout,
        tls_handshake_timeout: args.tls_handshake_timeout,
        max_quota_streams: args.rlqs_max_streams,
        max_stream_buckets: args.rlqs_max_buckets,
        quota_idle_timeout: args.rlqs_idle_timeout,
        abandon_after: args.rlqs_abandon_after,
    };
    rls_limits.check().map_err(Failure::BadInput)?;
    let store = open_store(&args.db).await?;
    let env_token = std::env::var(ADMIN_TOKEN_ENV).ok();
    let bootstrap = match server::bootstrap_admin(&store, env_token.as_deref()).await {
        Ok(bootstrap) => bootstrap,
        Err(err @ BootstrapError::TooShort { .. }) => {
            return Err(Failure::BadInput(err.to_string()));
        }
        Err(err) => {
            let err = anyhow::Error::new(err).context("creating the bootstrap admin token");
            return Err(Failure::Other(err));
        }
    };
    match bootstrap {
        Bootstrap::FromEnv {
            created,
            token,
            replaced,
        } => {
            if created {
                tracing::info!(id = %token.id, "stored {ADMIN_TOKEN_ENV} as an admin token");
            }
            if replaced > 0 {
                tracing::info!(replaced, "revoked the previous bootstrap admin token");
            }
        }
        Bootstrap::NotNeeded => {}
        Bootstrap::EnvTokenRevoked(token) => {
            tracing::warn!(id = %token.id, "{ADMIN_TOKEN_ENV} names a revoked token; it stays revoked");
        }
        Bootstrap::Generated(token) => {
            eprintln!(
                "\nThe database had no API tokens, so an admin token was created. It is shown \
                 only this once (only its hash is stored):\n\n    {}\n\nUse it as \
                 `Authorization: Bearer TOKEN`, or SLUICE_TOKEN=... for `sluice rules`.\n",
                token.secret
            );
        }
    }
    let signals = ShutdownSignals::install().context("installing signal handlers")?;
    let metrics = MetricsConfig {
        retention_10s: args.retention_10s,
        retention_1m: args.retention_1m,
        retention_1h: args.retention_1h,
        max_rows_per_table: args.metrics_max_rows,
        ..MetricsConfig::default()
    };
    let quota = match &args.redis {
        None => Backend::Memory,
        Some(url) => {
            let redis = RedisBuckets::connect(url)
                .await
                .with_context(|| format!("connecting to Redis at {url}"))?;
            tracing::info!(%url, "global buckets are kept in Redis");
            Backend::Redis(redis)
        }
    };
    let state = AppState::with_options(store.clone(), metrics, quota, auth_failures)
        .await
        .context("reading the current ruleset version")?;
    state.set_report_rate(report_rate);
    state.set_quota_bounds(guard::Bounds {
        max_buckets: args.quota_max_buckets,
        max_buckets_per_proxy: args.quota_max_buckets_per_proxy,
    });
    let options = ServeOptions {
        limits,
        tls,
        metrics_listen: args.metrics_listen,
        rls_listen: args.rls_listen,
        rls_limits,
        rls_auth,
        rls_tls,
    };
    let server = server::start_with(state, args.listen, options)
        .await
        .with_context(|| match args.metrics_listen {
            Some(metrics) => format!("listening on {} and {metrics}", args.listen),
            None => format!("listening on {}", args.listen),
        })?;
    // One stable line on stdout for scripts and tests that start `sluice serve` on port 0
    // (`sluice_core::listening` reads it back); the rate limit service's first.
    if let Some(addr) = server.rls_addr() {
        let tls = server.listening().scheme == Scheme::Https;
        println!("{}", RlsListening { tls, addr });
    }
    println!("{}", server.listening());
    let _ = std::io::stdout().flush();
    tracing::info!(
        addr = %server.addr(),
        metrics = ?server.metrics_addr(),
        database = %redact(&args.db.database),
        backend = store.backend().name(),
        "admin API ready"
    );
    signals.wait().await;
    tracing::info!("shutting down");
    server.stop().await.context("serving")?;
    store.close().await;
    Ok(())
}

/// SIGINT (Ctrl-C) or SIGTERM (what service managers and container runtimes send).
///
/// Installed before the address is printed: whoever reads that line may signal at once,
/// and a signal before the handler exists would kill the process without a clean stop.
struct ShutdownSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> std::io::Result<ShutdownSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(ShutdownSignals {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
