//! Running the admin API: assemble the site (the API, the dashboard beside it), bind,
//! serve until told to stop, then stop gracefully.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Extension;
use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener, ListenerExt as _};
use sluice_core::listening::{Listening, Scheme};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::http::{self, AppState};
use crate::store::{Actor, NewToken, Role, Store, StoreError, TokenInfo, now_ms};
use crate::tls::{OverTls, TlsListener};
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
    /// The metrics pipeline's flusher and retention.
    pipeline: JoinHandle<()>,
}

/// Everything `sluice serve` answers: the API, and the dashboard at every path the API
/// does not route.
pub(crate) fn app(state: AppState) -> axum::Router {
    http::app_beside(state, ui::router())
}

/// Binds `listen` (port 0: any free port) and serves [`app`] in a background task until
/// [`Server::stop`] (or [`AppState::shutdown`]).
pub async fn start(state: AppState, listen: SocketAddr) -> io::Result<Server> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    let task = serve(listener, app(state.clone()), state.clone());
    Ok(Server::running(state, addr, Scheme::Http, task))
}

/// [`start`] over TLS (see [`crate::tls::server_config`]): every request carries the
/// [`OverTls`] extension, so the session cookie is marked `Secure`.
pub async fn start_tls(
    state: AppState,
    listen: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
) -> io::Result<Server> {
    let listener = TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    // axum 0.8 gives `ConnectInfo<SocketAddr>` (which the ruleset and report endpoints
    // read) only to its own TCP listener and to listeners wrapped by `tap_io`: hence the
    // wrapper, which does nothing to the connection.
    let listener = TlsListener::new(listener, tls)?.tap_io(|_| {});
    let site = app(state.clone()).layer(Extension(OverTls));
    let task = serve(listener, site, state.clone());
    Ok(Server::running(state, addr, Scheme::Https, task))
}

/// The one serving path of both: plain and TLS differ only in their listener.
fn serve<L>(listener: L, app: axum::Router, state: AppState) -> JoinHandle<io::Result<()>>
where
    L: Listener<Addr = SocketAddr>,
    for<'a> SocketAddr: Connected<IncomingStream<'a, L>>,
{
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        // Held long-polls see the same signal and answer at once, so in-flight requests
        // finish within milliseconds and the graceful shutdown is prompt.
        .with_graceful_shutdown(async move { state.shutting_down().await })
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
            pipeline,
        }
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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

/// What start-up did about the first admin token.
#[derive(Debug)]
pub enum Bootstrap {
    /// `SLUICE_ADMIN_TOKEN` is stored (`created`: just now).
    FromEnv { created: bool, token: TokenInfo },
    /// `SLUICE_ADMIN_TOKEN` names a revoked token: it stays revoked.
    EnvTokenRevoked(TokenInfo),
    /// There were no tokens at all: this one was made, to be shown once.
    Generated(NewToken),
    /// Tokens exist and no bootstrap token was given.
    NotNeeded,
}

/// Makes sure someone can log in: stores `env_token` as an admin token if given (hashed,
/// once), or mints an admin token when the database has no tokens at all.
pub async fn bootstrap_admin(
    store: &Store,
    env_token: Option<&str>,
) -> Result<Bootstrap, StoreError> {
    let now = now_ms();
    if let Some(secret) = env_token.filter(|s| !s.is_empty()) {
        return Ok(match store.find_token(secret).await? {
            Some(token) if token.revoked_at.is_some() => Bootstrap::EnvTokenRevoked(token),
            Some(token) => Bootstrap::FromEnv {
                created: false,
                token,
            },
            None => Bootstrap::FromEnv {
                created: true,
                token: store
                    .add_token(
                        &Actor::system(),
                        BOOTSTRAP_TOKEN_NAME,
                        Role::Admin,
                        secret,
                        now,
                    )
                    .await?,
            },
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
