//! An HTTP/1.1 echo server standing in for the protected service behind Envoy, in the
//! end-to-end tests and in `cargo xtask demo`.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value};

use crate::background::Background;

/// Answers every request with 200 and a JSON body describing the request as it arrived:
/// `{"method": "GET", "path": "/a?b=c", "headers": {"x-api-key": "k", ...}}` (header names
/// lowercased; repeated headers joined with ", "). Lets a test, or a person trying the
/// demo, see what got past Envoy and what the filter added or removed on the way.
///
/// A request may ask for a slower or a broken answer, to stand in for a slow service:
/// [`DELAY_HEADER`] (milliseconds, at most [`MAX_DELAY`]) delays the answer, and
/// [`RESET_HEADER`] closes the connection instead of answering, after any delay. The
/// server counts the requests it is working on at once ([`EchoUpstream::in_flight`]) and
/// the most it ever was ([`EchoUpstream::in_flight_high_water`]); a request stops counting
/// when it is answered or its connection goes.
///
/// It runs on its own thread and runtime ([`Background`]), so it works the same under
/// `#[test]`, `#[tokio::test]` and in a tokio program, and stops when dropped (its open
/// connections with it).
#[derive(Debug)]
pub struct EchoUpstream {
    addr: SocketAddr,
    counts: Arc<Counts>,
    _background: Background,
}

/// The request header asking the echo upstream to wait this many milliseconds first.
pub const DELAY_HEADER: &str = "x-echo-delay-ms";
/// The request header asking the echo upstream to close the connection, unanswered.
pub const RESET_HEADER: &str = "x-echo-reset";
/// The longest delay a request can ask for.
pub const MAX_DELAY: Duration = Duration::from_secs(30);

/// What the server counts.
#[derive(Debug, Default)]
struct Counts {
    requests: AtomicU64,
    in_flight: AtomicU64,
    high_water: AtomicU64,
}

/// One request being worked on; it stops counting when dropped (answered, or its
/// connection closed under it).
struct InFlight(Arc<Counts>);

impl InFlight {
    fn start(counts: &Arc<Counts>) -> InFlight {
        counts.requests.fetch_add(1, Ordering::Relaxed);
        let now = counts.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        counts.high_water.fetch_max(now, Ordering::SeqCst);
        InFlight(Arc::clone(counts))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EchoUpstream {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub fn start() -> Result<EchoUpstream> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .context("binding the echo upstream on 127.0.0.1")?;
        EchoUpstream::serve_on(listener)
    }

    /// Starts serving on a listener the caller bound (e.g. a fixed port checked early).
    pub fn serve_on(listener: TcpListener) -> Result<EchoUpstream> {
        listener
            .set_nonblocking(true)
            .context("making the echo upstream's listener non-blocking")?;
        let addr = listener
            .local_addr()
            .context("the echo upstream's address")?;
        let background = Background::start(&format!("echo-upstream-{}", addr.port()))?;
        let counts = Arc::new(Counts::default());
        let listener = background
            .block_on(
                async move { tokio::net::TcpListener::from_std(listener) },
                Duration::from_secs(10),
            )?
            .context("the echo upstream's listener")?;
        background.spawn(serve(listener, Arc::clone(&counts)));
        Ok(EchoUpstream {
            addr,
            counts,
            _background: background,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far: how many got past Envoy.
    pub fn requests_seen(&self) -> u64 {
        self.counts.requests.load(Ordering::Relaxed)
    }

    /// Requests being worked on now.
    pub fn in_flight(&self) -> u64 {
        self.counts.in_flight.load(Ordering::SeqCst)
    }

    /// The most requests ever worked on at once, since the start or the last
    /// [`EchoUpstream::reset_high_water`].
    pub fn in_flight_high_water(&self) -> u64 {
        self.counts.high_water.load(Ordering::SeqCst)
    }

    /// Starts the high-water mark again from the requests in flight now.
    pub fn reset_high_water(&self) {
        self.counts
            .high_water
            .store(self.in_flight(), Ordering::SeqCst);
    }
}

async fn serve(listener: tokio::net::TcpListener, counts: Arc<Counts>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors and the like: keep serving the open connections.
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        let counts = Arc::clone(&counts);
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let in_flight = InFlight::start(&counts);
                async move {
                    let answer = answer(&request).await;
                    drop(in_flight);
                    answer
                }
            });
            // Envoy closing a pooled connection is routine, not an error worth reporting.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The echo, after the delay the request asks for; an error (hyper then closes the
/// connection) when it asks for a reset.
async fn answer<B>(request: &Request<B>) -> Result<Response<Full<Bytes>>, ResetAsked> {
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(ms) = header(DELAY_HEADER).and_then(|v| v.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms).min(MAX_DELAY)).await;
    }
    if header(RESET_HEADER).is_some() {
        // hyper closes the connection unanswered: what Envoy sees of a service that crashed.
        return Err(ResetAsked);
    }
    Ok(echo_response(request))
}

/// The request asked for its connection to be closed unanswered ([`RESET_HEADER`]).
#[derive(Debug)]
struct ResetAsked;

impl std::fmt::Display for ResetAsked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request asked for a reset")
    }
}

impl std::error::Error for ResetAsked {}

fn echo_response<B>(request: &Request<B>) -> Response<Full<Bytes>> {
    let mut headers = Map::new();
    for (name, value) in request.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        match headers.get_mut(name.as_str()) {
            Some(Value::String(existing)) => {
                existing.push_str(", ");
                existing.push_str(&value);
            }
            _ => {
                headers.insert(name.as_str().to_string(), Value::String(value));
            }
        }
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let body = serde_json::json!({
        "method": request.method().as_str(),
        "path": path,
        "headers": headers,
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn echoes_method_path_and_headers() {
        let request = Request::post("/api/hello?x=1")
            .header("x-api-key", "alice")
            .header("accept", "a")
            .header("accept", "b")
            .body(())
            .unwrap();
        let response = echo_response(&request);
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["method"], "POST");
        assert_eq!(json["path"], "/api/hello?x=1");
        assert_eq!(json["headers"]["x-api-key"], "alice");
        assert_eq!(json["headers"]["accept"], "a, b");
    }

    #[tokio::test]
    async fn a_missing_header_is_absent() {
        let request = Request::get("/").body(()).unwrap();
        let body = echo_response(&request)
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let json: Value = serde_json::from_slice(&body).unwrap();
        assert!(json["headers"]["x-api-key"].is_null());
    }
}
