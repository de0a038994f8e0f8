//! [`Client`]: connections to one address held across runs, driven from blocking code.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use super::connection::{Connection, Dialer};
use super::drive::Load;
use super::message::{Req, Resp};
use super::tally::Outcome;
use crate::background::Background;

/// `connections` keep-alive HTTP/1.1 connections to one address, opened at once and kept
/// between runs; each run spreads its requests over them, one in flight per connection.
///
/// The connections live on the client's own thread and runtime; the methods block, and
/// work from plain `#[test]`s and from async tests alike (in `block_in_place`). Every run
/// is bounded: a per-request time and an overall one (see [`Client::with_timeouts`]). A
/// connection the server closed is opened again before its next request.
#[derive(Debug)]
pub struct Client {
    addr: SocketAddr,
    connections: usize,
    dialer: Dialer,
    request_timeout: Duration,
    run_timeout: Duration,
    /// Taken whole by each run: runs from several threads take turns.
    pool: Arc<tokio::sync::Mutex<Vec<Connection>>>,
    background: Background,
}

impl Client {
    /// Opens `connections` connections to `addr` with `dialer` now.
    pub fn connect(addr: SocketAddr, connections: usize, dialer: Dialer) -> Result<Client> {
        anyhow::ensure!(connections > 0, "a client needs at least one connection");
        let background = Background::start(&format!("client-{addr}"))?;
        let client = Client {
            addr,
            connections,
            dialer,
            request_timeout: Duration::from_secs(10),
            run_timeout: Duration::from_secs(300),
            pool: Arc::default(),
            background,
        };
        let (pool, dialer) = (Arc::clone(&client.pool), client.dialer.clone());
        let opened = client.background.block_on(
            async move {
                let mut opened = Vec::with_capacity(connections);
                for _ in 0..connections {
                    let mut connection = Connection::new(0, addr, dialer.clone());
                    connection.open().await?;
                    opened.push(connection);
                }
                *pool.lock().await = opened;
                Ok::<_, anyhow::Error>(())
            },
            client.run_timeout,
        )?;
        opened.with_context(|| format!("connecting to {addr}"))?;
        Ok(client)
    }

    /// Changes the time one request may take and the time a whole run may take.
    pub fn with_timeouts(mut self, request: Duration, run: Duration) -> Client {
        self.request_timeout = request;
        self.run_timeout = run;
        self
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn connections(&self) -> usize {
        self.connections
    }

    /// Sends one request.
    ///
    /// # Panics
    ///
    /// If no response comes.
    pub fn send(&self, request: Req) -> Resp {
        self.run([request])
            .pop()
            .unwrap_or_else(|| panic!("no response"))
    }

    /// Sends every request, `connections` at a time, and returns the responses in request
    /// order.
    ///
    /// # Panics
    ///
    /// If any request gets no response.
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
        let total = requests.len() as u64;
        self.drive(
            move |load| load.at_most(total).keep_answers(),
            move |n| requests[n as usize].clone(),
        )
        .answers
    }

    /// Sends requests made by `make(n)` for n = 0, 1, 2, ... on every connection until
    /// `duration` has passed, keeping only counts: load that lasts as long on a fast
    /// machine as on a slow one.
    pub fn run_for<F>(&self, duration: Duration, make: F) -> Outcome
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        self.drive(move |load| load.for_duration(duration), make)
    }

    /// Like [`Client::run_for`], but stops after `total` requests if they are sent before
    /// `duration` has passed.
    pub fn run_counting_for<F>(&self, total: u64, duration: Duration, make: F) -> Outcome
    where
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        self.drive(move |load| load.at_most(total).for_duration(duration), make)
    }

    /// Runs a load over all the client's connections, bounded by the client's timeouts,
    /// and puts the connections back afterwards (new ones for those the run abandoned).
    fn drive<C, F>(&self, configure: C, make: F) -> Outcome
    where
        C: FnOnce(Load) -> Load + Send + 'static,
        F: Fn(u64) -> Req + Send + Sync + 'static,
    {
        let pool = Arc::clone(&self.pool);
        let (addr, connections, dialer) = (self.addr, self.connections, self.dialer.clone());
        let (request_timeout, run_timeout) = (self.request_timeout, self.run_timeout);
        let run = async move {
            let mut pool = pool.lock_owned().await;
            let load = configure(
                Load::over(std::mem::take(&mut *pool))
                    .answer_limit(request_timeout)
                    .give_up_after(run_timeout),
            );
            let (outcome, mut back) = load.drive(make).await;
            back.resize_with(connections, || Connection::new(0, addr, dialer.clone()));
            *pool = back;
            outcome
        };
        self.background
            .block_on(run, run_timeout + Duration::from_secs(30))
            .unwrap_or_else(|err| panic!("the client's run on {addr}: {err:#}"))
    }
}
