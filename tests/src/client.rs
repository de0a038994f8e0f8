//! The tests' load driver: the harness's [`load::Client`], opened at once (panicking if it
//! cannot), over plain TCP or TLS.

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::ServerName;
use sluice_harness::load::{self, Dialer, Req};

/// `connections` keep-alive HTTP/1.1 connections to one address, spreading each run's
/// requests over them (see [`load::Client`] for the runs).
#[derive(Debug)]
pub struct Client(load::Client);

impl Client {
    /// Opens `connections` connections to `addr` now; panics if it cannot.
    pub fn connect(addr: SocketAddr, connections: usize) -> Client {
        Client::open(addr, connections, Dialer::tcp())
    }

    /// [`Client::connect`] over TLS with `config` (e.g. [`crate::TestPki::client_config`]),
    /// checking that the server's certificate names `addr`'s IP address.
    pub fn connect_tls(
        addr: SocketAddr,
        connections: usize,
        config: Arc<rustls::ClientConfig>,
    ) -> Client {
        let connector = tokio_rustls::TlsConnector::from(config);
        let dialer = Dialer::new(move |addr: SocketAddr| {
            let connector = connector.clone();
            async move {
                let stream = load::tcp(addr).await?;
                connector
                    .connect(ServerName::IpAddress(addr.ip().into()), stream)
                    .await
                    .with_context(|| format!("TLS handshake with {addr}"))
            }
        });
        Client::open(addr, connections, dialer)
    }

    fn open(addr: SocketAddr, connections: usize, dialer: Dialer) -> Client {
        Client(
            load::Client::connect(addr, connections, dialer)
                .unwrap_or_else(|err| panic!("connecting to {addr}: {err:#}")),
        )
    }

    /// Changes the time one request may take and the time a whole run may take.
    pub fn with_timeouts(self, request: Duration, run: Duration) -> Client {
        Client(self.0.with_timeouts(request, run))
    }

    /// Sends `n` copies of `request` and returns how many passed (200); panics on any
    /// answer but 200 and 429.
    pub fn passed(&self, request: &Req, n: usize) -> usize {
        let responses = self.run((0..n).map(|_| request.clone()));
        for r in &responses {
            assert!(r.status == 200 || r.status == 429, "{r:?}");
        }
        responses.iter().filter(|r| r.status == 200).count()
    }
}

impl Deref for Client {
    type Target = load::Client;

    fn deref(&self) -> &load::Client {
        &self.0
    }
}
