//! One keep-alive HTTP/1.1 connection of the load generator, over plain TCP or whatever
//! stream a caller's [`Dialer`] makes (the end-to-end tests' TLS).

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HOST, HeaderValue};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::message::{Req, Resp};

/// A byte stream a connection can run HTTP/1.1 over.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

type Dialing = Pin<Box<dyn Future<Output = Result<Box<dyn Stream>>> + Send>>;

/// How a connection's stream is opened: [`Dialer::tcp`], or a caller's layer over
/// [`tcp`] such as TLS (the harness itself stays free of TLS libraries).
#[derive(Clone)]
pub struct Dialer(Arc<dyn Fn(SocketAddr) -> Dialing + Send + Sync>);

impl Dialer {
    /// Plain TCP with Nagle's delay off.
    pub fn tcp() -> Dialer {
        Dialer::new(tcp)
    }

    pub fn new<F, Fut, S>(dial: F) -> Dialer
    where
        F: Fn(SocketAddr) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<S>> + Send + 'static,
        S: Stream,
    {
        Dialer(Arc::new(move |addr| {
            let dialing = dial(addr);
            Box::pin(async move { Ok(Box::new(dialing.await?) as Box<dyn Stream>) })
        }))
    }
}

impl fmt::Debug for Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Dialer")
    }
}

/// A TCP connection to `addr` with Nagle's delay off: where every dialer starts.
pub async fn tcp(addr: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true).context("setting TCP_NODELAY")?;
    Ok(stream)
}

type Sender = SendRequest<Full<Bytes>>;

/// One keep-alive HTTP/1.1 connection to one target, one request in flight at a time:
/// opened on first use (or by [`Connection::open`]), opened again when the server closed
/// it or a request on it failed. Each is its own TCP connection, so the kernel spreads
/// them over Envoy's workers as it would real clients.
#[derive(Debug)]
pub struct Connection {
    /// The target's index in the load.
    target: usize,
    addr: SocketAddr,
    /// hyper's connection-level client sends no `Host` of its own, and Envoy rejects
    /// HTTP/1.1 requests without one.
    host: HeaderValue,
    dialer: Dialer,
    sender: Option<Sender>,
}

/// What came back for one request.
pub(super) struct Answer {
    pub status: u16,
    /// The whole response, when asked for.
    pub resp: Option<Resp>,
}

/// Why a request got no answer.
pub(super) struct Failure {
    /// Whether the connection could not be made (the next attempt waits a moment).
    pub connecting: bool,
    pub message: String,
}

impl Connection {
    pub fn new(target: usize, addr: SocketAddr, dialer: Dialer) -> Connection {
        let host = HeaderValue::from_str(&addr.to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("localhost"));
        Connection {
            target,
            addr,
            host,
            dialer,
            sender: None,
        }
    }

    pub fn target(&self) -> usize {
        self.target
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Opens the connection now.
    pub async fn open(&mut self) -> Result<()> {
        self.sender = Some(self.handshake().await?);
        Ok(())
    }

    async fn handshake(&self) -> Result<Sender> {
        let stream = (self.dialer.0)(self.addr).await?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        // Ends when either side closes; the sender then reports closed and is replaced.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// A sender ready for a request, the connection opened again if the server closed it.
    async fn ready(&mut self) -> Result<&mut Sender> {
        let usable = match self.sender.as_mut() {
            Some(sender) => !sender.is_closed() && sender.ready().await.is_ok(),
            None => false,
        };
        if !usable {
            let mut sender = self.handshake().await?;
            sender.ready().await.context("new connection not ready")?;
            self.sender = Some(sender);
        }
        self.sender.as_mut().ok_or_else(|| anyhow!("no connection"))
    }

    /// Sends `request` and reads the whole answer (kept when `keep`), within `limit`.
    pub(super) async fn exchange(
        &mut self,
        request: &Req,
        limit: Duration,
        keep: bool,
    ) -> Result<Answer, Failure> {
        let mut connecting = true;
        let outcome = tokio::time::timeout(limit, async {
            let request = build(request, &self.host)?;
            let sender = self.ready().await?;
            connecting = false;
            let response = sender
                .send_request(request)
                .await
                .context("sending the request")?;
            read(response, keep).await
        })
        .await;
        let failure = match outcome {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(err)) => format!("{err:#}"),
            Err(_elapsed) => format!("no response within {} s", limit.as_secs_f32()),
        };
        // The connection's state is unknown after a failure: start afresh.
        self.sender = None;
        Err(Failure {
            connecting,
            message: failure,
        })
    }
}

fn build(request: &Req, host: &HeaderValue) -> Result<hyper::Request<Full<Bytes>>> {
    let mut builder = hyper::Request::builder()
        .method(request.method.clone())
        .uri(request.path.as_str());
    if !request
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        builder = builder.header(HOST, host.clone());
    }
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    builder
        .body(Full::new(request.body.clone()))
        .with_context(|| format!("building the request {} {}", request.method, request.path))
}

/// Reads the body to the end, so the connection can be reused; keeps the response only
/// when asked.
async fn read(response: hyper::Response<Incoming>, keep: bool) -> Result<Answer> {
    let status = response.status().as_u16();
    if !keep {
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            frame.context("reading the response body")?;
        }
        return Ok(Answer { status, resp: None });
    }
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_string(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .context("reading the response body")?
        .to_bytes();
    Ok(Answer {
        status,
        resp: Some(Resp {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }),
    })
}
