//! An HTTP/1.1 echo server standing in for the protected service.

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value};
use sluice_envoy_config as envoy_config;
use tokio::sync::oneshot;

/// Answers every request with 200 and a JSON body describing the request as it arrived:
/// `{"method": "GET", "path": "/a?b=c", "headers": {"x-api-key": "k", ...}}` (header names
/// lowercased; repeated headers joined with ", "). Lets tests see what the filter added or
/// removed on the way upstream.
///
/// It runs on its own thread and runtime, so it works the same under `#[test]` and
/// `#[tokio::test]`, and stops when dropped.
#[derive(Debug)]
pub struct Upstream {
    addr: SocketAddr,
    requests: Arc<AtomicU64>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Upstream {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub fn start() -> Upstream {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("binding the echo upstream on 127.0.0.1");
        listener
            .set_nonblocking(true)
            .expect("making the echo upstream's listener non-blocking");
        let addr = listener.local_addr().expect("the echo upstream's address");
        let requests = Arc::new(AtomicU64::new(0));
        let (shutdown, stop) = oneshot::channel();
        let counter = Arc::clone(&requests);
        let thread = std::thread::Builder::new()
            .name(format!("echo-upstream-{}", addr.port()))
            .spawn(move || serve(listener, counter, stop))
            .expect("starting the echo upstream's thread");
        Upstream {
            addr,
            requests,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The route to this server, for [`crate::EnvoyOptions::upstream`].
    pub fn target(&self) -> envoy_config::Upstream {
        envoy_config::Upstream::Cluster(self.addr)
    }

    /// Requests answered so far: how many got past Envoy.
    pub fn requests_seen(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(
    listener: std::net::TcpListener,
    requests: Arc<AtomicU64>,
    mut stop: oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => panic!("starting the echo upstream's runtime: {err}"),
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(err) => panic!("handing the echo upstream's listener to tokio: {err}"),
        };
        loop {
            let stream = tokio::select! {
                _ = &mut stop => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    // Out of file descriptors and the like: keep serving the open connections.
                    Err(_) => continue,
                },
            };
            let _ = stream.set_nodelay(true);
            let requests = Arc::clone(&requests);
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    requests.fetch_add(1, Ordering::Relaxed);
                    echo(request)
                });
                // Envoy closing a pooled connection is routine, not an error worth reporting.
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    // Dropping the runtime here cancels the open connections' tasks.
}

async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
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
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}
