//! An HTTP/1.1 echo server standing in for the protected service behind Envoy, in the
//! end-to-end tests and in `cargo xtask demo`.

use std::convert::Infallible;
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
/// It runs on its own thread and runtime ([`Background`]), so it works the same under
/// `#[test]`, `#[tokio::test]` and in a tokio program, and stops when dropped (its open
/// connections with it).
#[derive(Debug)]
pub struct EchoUpstream {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    _background: Background,
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
        let requests = Arc::new(AtomicU64::new(0));
        let listener = background
            .block_on(
                async move { tokio::net::TcpListener::from_std(listener) },
                Duration::from_secs(10),
            )?
            .context("the echo upstream's listener")?;
        background.spawn(serve(listener, Arc::clone(&requests)));
        Ok(EchoUpstream {
            addr,
            requests,
            _background: background,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests answered so far: how many got past Envoy.
    pub fn requests_seen(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

async fn serve(listener: tokio::net::TcpListener, requests: Arc<AtomicU64>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of file descriptors and the like: keep serving the open connections.
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        let requests = Arc::clone(&requests);
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                requests.fetch_add(1, Ordering::Relaxed);
                async move { Ok::<_, Infallible>(echo_response(&request)) }
            });
            // Envoy closing a pooled connection is routine, not an error worth reporting.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

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
