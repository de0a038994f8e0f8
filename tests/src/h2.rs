//! Thousands of calls over a few HTTP/2 connections, each read to its end, its reset, or
//! given up on by the caller (the stream reset from the client's side).
//!
//! HTTP/2 because Envoy resets a downstream HTTP/2 stream the moment its upstream call
//! fails, and a client gives one up by resetting it, where an HTTP/1.1 connection is
//! closed only after Envoy's delayed-close timeout (1 s): thousands of failing calls would
//! take an hour over a few HTTP/1.1 connections.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// One call: its request, and how long the caller waits for the whole answer before
/// giving up on it (`None`: to its end).
#[derive(Debug)]
pub struct H2Call {
    pub request: hyper::Request<Full<Bytes>>,
    pub give_up_after: Option<Duration>,
}

impl H2Call {
    /// A call read to its end.
    pub fn whole(request: hyper::Request<Full<Bytes>>) -> H2Call {
        H2Call {
            request,
            give_up_after: None,
        }
    }
}

/// How many calls at once: `connections` × `streams`.
#[derive(Debug, Clone, Copy)]
pub struct H2Load {
    pub connections: usize,
    pub streams: usize,
    /// The whole run's bound: a run that takes longer fails the test.
    pub deadline: Duration,
}

/// What a run got: whole answers by status, calls whose stream was reset or whose answer
/// broke off, and calls given up on.
#[derive(Debug, Default)]
pub struct H2Outcome {
    pub by_status: BTreeMap<u16, u64>,
    pub reset: u64,
    pub given_up: u64,
}

impl H2Outcome {
    pub fn answered(&self, status: u16) -> u64 {
        self.by_status.get(&status).copied().unwrap_or(0)
    }

    /// Calls that did not end in a whole 200 answer.
    pub fn failed(&self) -> u64 {
        let not_ok: u64 = self
            .by_status
            .iter()
            .filter(|(s, _)| **s != 200)
            .map(|(_, n)| n)
            .sum();
        self.reset + self.given_up + not_ok
    }

    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: H2Outcome) {
        self.reset += other.reset;
        self.given_up += other.given_up;
        for (status, n) in other.by_status {
            *self.by_status.entry(status).or_default() += n;
        }
    }
}

/// Sends `total` calls to `addr`, call `n` made by `call(n)`, `load.streams` at a time on
/// each of `load.connections` connections.
///
/// # Panics
/// When a connection cannot be made or the run outlasts `load.deadline`.
pub fn h2_run(
    addr: SocketAddr,
    total: u64,
    load: H2Load,
    call: impl Fn(u64) -> H2Call + Send + Sync + 'static,
) -> H2Outcome {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the HTTP/2 calls");
    let call = Arc::new(call);
    let next = Arc::new(AtomicU64::new(0));
    let run = async move {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..load.connections {
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .expect("connecting for HTTP/2 calls");
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .expect("the HTTP/2 handshake");
            tokio::spawn(connection);
            for _ in 0..load.streams {
                let (mut sender, call, next) =
                    (sender.clone(), Arc::clone(&call), Arc::clone(&next));
                tasks.spawn(async move {
                    let mut outcome = H2Outcome::default();
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= total {
                            return outcome;
                        }
                        let H2Call {
                            request,
                            give_up_after,
                        } = call(n);
                        let whole = async {
                            let response = sender.send_request(request).await.ok()?;
                            let status = response.status().as_u16();
                            response.into_body().collect().await.ok()?;
                            Some(status)
                        };
                        let ended = match give_up_after {
                            // Dropping the call resets its stream.
                            Some(patience) => tokio::time::timeout(patience, whole).await.ok(),
                            None => Some(whole.await),
                        };
                        match ended {
                            Some(Some(status)) => {
                                *outcome.by_status.entry(status).or_default() += 1
                            }
                            Some(None) => outcome.reset += 1,
                            None => outcome.given_up += 1,
                        }
                    }
                });
            }
        }
        let mut all = H2Outcome::default();
        while let Some(part) = tasks.join_next().await {
            all.add(part.expect("an HTTP/2 caller panicked"));
        }
        all
    };
    runtime
        .block_on(async { tokio::time::timeout(load.deadline, run).await })
        .unwrap_or_else(|_| panic!("{total} calls did not end within {:?}", load.deadline))
}
