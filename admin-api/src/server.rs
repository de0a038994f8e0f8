//! Running the admin API: assemble the site (the API, the dashboard beside it), bind,
//! serve until told to stop, then stop gracefully.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Extension;
use axum::http::{HeaderValue, header};
use sluice_core::listening::{Listening, Scheme};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::conn::{self, ConnLimits};
use crate::http::{self, AppState};
use crate::rls::{self, RlsAuth, RlsLimits};
use crate::store::{Actor, NewToken, Role, Store, StoreError, TokenInfo, now_ms};
use crate::tls::OverTls;
use crate::ui;

/// The environment variable holding the bootstrap admin token.
pub const ADMIN_TOKEN_ENV: &str = "SLUICE_ADMIN_TOKEN";
/// The name the bootstrap token is stored under.
pub(crate) const BOOTSTRAP_TOKEN_NAME: &str = "bootstrap-admin";

/// A running server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    scheme: Scheme,
    state: AppState,
    task: JoinHandle<io::Result<()>>,
    /// The separate `/metrics` listener (`--metrics-listen`): its address and task.
    metrics: Option<(SocketAddr, JoinHandle<io::Result<()>>)>,
    /// The metrics pipeline's flusher and retention.
    pipeline: JoinHandle<()>,
    /// Envoy's rate limit service (`--rls-listen`).
    rls: Option<rls::RlsServer>,
}

/// How `sluice serve` serves: the connection budget, TLS, and where `/metrics` is.
#[derive(Debug, Clone, Default)]
pub struct ServeOptions {
    pub limits: ConnLimits,
    /// Serve over TLS (see [`crate::tls::server_config`]): every request carries the
    /// [`OverTls`] extension, so the session cookie is marked `Secure`, and every answer
    /// `Strict-Transport-Security`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Serve `/metrics` on this address alone (plain HTTP, within the same limits) and not
    /// on the main listener, so it can be kept off the network the API is reached from.
    pub metrics_listen: Option<SocketAddr>,
    /// Serve Envoy's rate limit service (gRPC) on this address too, over TLS when `tls` is
    /// given, within `rls_limits` (see [`crate::rls`]).
    pub rls_listen: Option<SocketAddr>,
    pub rls_limits: RlsLimits,
    /// What a caller of the rate limit service must show: a proxy token by default.
    pub rls_auth: RlsAuth,
    /// The rate limit service's own TLS instead of `tls` (with `--rls-client-ca`: the
    /// same certificate, requiring client certificates, [`crate::tls::client_auth_config`]).
    pub rls_tls: Option<Arc<rustls::ServerConfig>>,
}

/// `Strict-Transport-Security` on every answer over TLS: a browser that has reached the
/// dashboard over HTTPS never falls back to plain HTTP for a year. No `includeSubDomains`:
/// the admin API's host may share its domain with sites it knows nothing about.
const HSTS: HeaderValue = HeaderValue::from_static("max-age=31536000");

/// Everything `sluice serve` answers: the API, and the dashboard at every path the API
/// does not route; `/metrics` too unless it has a listener of its own.
pub(crate) fn app(state: AppState, with_metrics: bool) -> axum::Router {
    http::app_beside(state, ui::router(), with_metrics)
}

/// Binds `listen` (port 0: any free port) and serves [`app`] in a background task until
/// [`Server::stop`] (or [`AppState::shutdown`]), within the default [`ConnLimits`].
pub async fn start(state: AppState, listen: SocketAddr) -> io::Result<Server> {
    start_with(state, listen, ServeOptions::default()).await
}

/// [`start`] over TLS.
pub async fn start_tls(
    state: AppState,
    listen: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
) -> io::Result<Server> {
    let options = ServeOptions {
        tls: Some(tls),
        ..ServeOptions::default()
    };
    start_with(state, listen, options).await
}

/// [`start`] with `options`.
pub async fn start_with(
    state: AppState,
    listen: SocketAddr,
    options: ServeOptions,
) -> io::Result<Server> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let metrics = match options.metrics_listen {
        Some(metrics_listen) => {
            let metrics_listener = TcpListener::bind(metrics_listen).await?;
            let metrics_addr = metrics_listener.local_addr()?;
            let site = http::metrics_only(state.clone());
            let task = serve(metrics_listener, None, site, options.limits, &state);
            Some((metrics_addr, task))
        }
        None => None,
    };
    let rls = match options.rls_listen {
        Some(rls_listen) => Some(
            rls::start(
                state.clone(),
                rls_listen,
                options.rls_tls.clone().or_else(|| options.tls.clone()),
                options.rls_limits,
                options.rls_auth,
            )
            .await?,
        ),
        None => None,
    };
    let site = app(state.clone(), metrics.is_none());
    let (scheme, acceptor, site) = match options.tls {
        Some(tls) => (
            Scheme::Https,
            Some(TlsAcceptor::from(tls)),
            site.layer(Extension(OverTls))
                .layer(axum::middleware::map_response(strict_transport)),
        ),
        None => (Scheme::Http, None, site),
    };
    let task = serve(listener, acceptor, site, options.limits, &state);
    let mut server = Server::running(state, addr, scheme, task);
    server.metrics = metrics;
    server.rls = rls;
    Ok(server)
}

async fn strict_transport(mut response: axum::response::Response) -> axum::response::Response {
    response
        .headers_mut()
        .insert(header::STRICT_TRANSPORT_SECURITY, HSTS);
    response
}

/// The one serving path of every listener: see [`crate::conn`].
fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: axum::Router,
    limits: ConnLimits,
    state: &AppState,
) -> JoinHandle<io::Result<()>> {
    let state = state.clone();
    // Held long-polls see the same signal and answer at once, so in-flight requests
    // finish within milliseconds and the graceful shutdown is prompt.
    tokio::spawn(async move {
        let counts = state.connection_metrics();
        conn::serve(listener, tls, app, limits, counts, async move {
            state.shutting_down().await;
        })
        .await
    })
}

impl Server {
    /// Starts the server's background work beside the serving task.
    fn running(
        state: AppState,
        addr: SocketAddr,
        scheme: Scheme,
        task: JoinHandle<io::Result<()>>,
    ) -> Server {
        let background = state.clone();
        let pipeline = tokio::spawn(async move {
            background
                .pipeline()
                .run(background.store(), background.shutting_down())
                .await;
        });
        // Replicas sharing one database learn of each other's rule changes.
        let follower = state.clone();
        tokio::spawn(async move { follower.follow_versions().await });
        Server {
            addr,
            scheme,
            state,
            task,
            metrics: None,
            pipeline,
            rls: None,
        }
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of the separate `/metrics` listener, if there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(|(addr, _)| *addr)
    }

    /// The address of the rate limit service's listener, if there is one.
    pub fn rls_addr(&self) -> Option<SocketAddr> {
        self.rls.as_ref().map(|rls| rls.addr)
    }

    /// The line `sluice serve` prints: scheme and bound address.
    pub fn listening(&self) -> Listening {
        Listening {
            scheme: self.scheme,
            addr: self.addr,
        }
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Stops taking connections, ends held long-polls and metric streams, waits for
    /// in-flight requests, then writes the metrics accepted since the last flush.
    pub async fn stop(self) -> io::Result<()> {
        self.state.shutdown();
        let served = self.task.await.map_err(io::Error::other)?;
        if let Some((_, metrics)) = self.metrics {
            metrics.await.map_err(io::Error::other)??;
        }
        if let Some(rls) = self.rls {
            rls.task.await.map_err(io::Error::other)??;
            // Its last counts reach the pipeline before the final flush below.
            rls.stats.await.map_err(io::Error::other)?;
        }
        // The flusher stops at the signal; the final flush comes after the last request,
        // so every report answered 204 is written.
        self.pipeline.await.map_err(io::Error::other)?;
        let flushed = self
            .state
            .pipeline()
            .final_flush(self.state.store())
            .await
            .map_err(|e| io::Error::other(format!("writing the last metrics: {e}")));
        served.and(flushed.map(|_| ()))
    }
}

/// The shortest `SLUICE_ADMIN_TOKEN` accepted: 32 characters, the length of the random
/// part of a generated token. A short bootstrap token is an admin token anyone can guess.
pub const MIN_ADMIN_TOKEN_LEN: usize = 32;

/// What start-up did about the first admin token.
#[derive(Debug)]
pub enum Bootstrap {
    /// `SLUICE_ADMIN_TOKEN` is stored (`created`: just now); `replaced` earlier bootstrap
    /// tokens (a previous `SLUICE_ADMIN_TOKEN`, or the generated one) were revoked.
    FromEnv {
        created: bool,
        token: TokenInfo,
        replaced: usize,
    },
    /// `SLUICE_ADMIN_TOKEN` names a revoked token: it stays revoked.
    EnvTokenRevoked(TokenInfo),
    /// There were no tokens at all: this one was made, to be shown once.
    Generated(NewToken),
    /// Tokens exist and no bootstrap token was given.
    NotNeeded,
}

/// Why the bootstrap token could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error(
        "{ADMIN_TOKEN_ENV} is {length} characters long; it must be at least \
         {MIN_ADMIN_TOKEN_LEN} (e.g. `openssl rand -hex 32`)"
    )]
    TooShort { length: usize },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Makes sure someone can log in: stores `env_token` as an admin token if given (hashed,
/// once) and revokes any earlier bootstrap token, so changing `SLUICE_ADMIN_TOKEN` retires
/// the old one; or mints an admin token when the database has no tokens at all.
pub async fn bootstrap_admin(
    store: &Store,
    env_token: Option<&str>,
) -> Result<Bootstrap, BootstrapError> {
    let now = now_ms();
    if let Some(secret) = env_token.filter(|s| !s.is_empty()) {
        let length = secret.chars().count();
        if length < MIN_ADMIN_TOKEN_LEN {
            return Err(BootstrapError::TooShort { length });
        }
        let (created, token) = match store.find_token(secret).await? {
            Some(token) if token.revoked_at.is_some() => {
                return Ok(Bootstrap::EnvTokenRevoked(token));
            }
            Some(token) => (false, token),
            None => {
                let token = store
                    .add_token(
                        &Actor::system(),
                        BOOTSTRAP_TOKEN_NAME,
                        Role::Admin,
                        secret,
                        now,
                    )
                    .await?;
                (true, token)
            }
        };
        let replaced = revoke_other_bootstraps(store, &token.id, now).await?;
        return Ok(Bootstrap::FromEnv {
            created,
            token,
            replaced,
        });
    }
    if store.token_count().await? == 0 {
        let token = store
            .create_token(&Actor::system(), BOOTSTRAP_TOKEN_NAME, Role::Admin, now)
            .await?;
        return Ok(Bootstrap::Generated(token));
    }
    Ok(Bootstrap::NotNeeded)
}

/// Revokes every active bootstrap token (made by the system under
/// [`BOOTSTRAP_TOKEN_NAME`]) but `keep`; returns how many.
async fn revoke_other_bootstraps(store: &Store, keep: &str, now: i64) -> Result<usize, StoreError> {
    let mut revoked = 0;
    for token in store.list_tokens().await? {
        let system_made = token.created_by == Actor::system().name;
        if token.id != keep
            && token.name == BOOTSTRAP_TOKEN_NAME
            && system_made
            && token.revoked_at.is_none()
        {
            store.revoke_token(&Actor::system(), &token.id, now).await?;
            revoked += 1;
        }
    }
    Ok(revoked)
}
