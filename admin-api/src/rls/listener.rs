//! The RLS listener's connections within a budget: a cap on open connections (over it a
//! connection is closed at once, never queued), a TLS handshake timeout (without TLS, the
//! same time for the client's first bytes), each in its connection's own task so a slow
//! client delays no other. tonic serves HTTP/2 on
//! what this yields.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::limits::RlsLimits;
use crate::http::ConnectionMetrics;

/// One accepted connection, holding its place under the cap until it closes.
#[derive(Debug)]
pub(crate) struct Conn {
    io: Io,
    /// The peer's address, for the failed-authentication limit (`Request::remote_addr`).
    info: TcpConnectInfo,
    _permit: OwnedSemaphorePermit,
    _open: OpenGuard,
}

#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Keeps the open-connections gauge right however the connection ends.
#[derive(Debug)]
struct OpenGuard(ConnectionMetrics);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.dec();
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Accepts from `listener` until the receiver is dropped, and sends each connection that
/// fits under the cap (after its TLS handshake, when `tls` is given) to the receiver.
pub(crate) fn accept(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: RlsLimits,
    counts: ConnectionMetrics,
) -> mpsc::Receiver<io::Result<Conn>> {
    let (send, receive) = mpsc::channel(limits.max_connections.clamp(1, 1_024));
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => accepted,
                () = send.closed() => return,
            };
            let Ok((stream, peer)) = stream else {
                // Out of file descriptors or the like: try again in a moment.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                counts.refused.inc();
                drop(stream);
                continue;
            };
            counts.open.inc();
            let open = OpenGuard(counts.clone());
            let _ = stream.set_nodelay(true);
            let info = TcpConnectInfo {
                local_addr: stream.local_addr().ok(),
                remote_addr: Some(peer),
            };
            let send = send.clone();
            let tls = tls.clone();
            let counts = counts.clone();
            tokio::spawn(async move {
                let io = match tls {
                    None => {
                        // A client that connects and says nothing holds no slot for long:
                        // its first bytes (HTTP/2's preface) are due within the same time
                        // as a TLS handshake.
                        let mut byte = [0u8; 1];
                        let first = stream.peek(&mut byte);
                        match tokio::time::timeout(limits.tls_handshake_timeout, first).await {
                            Ok(Ok(1..)) => Io::Plain(stream),
                            // Closed or reset without a word (a TCP health check): not
                            // a failure.
                            Ok(_) => return,
                            Err(_) => {
                                counts.handshake_failed(None);
                                return;
                            }
                        }
                    }
                    Some(acceptor) => {
                        let handshake = acceptor.accept(stream);
                        // A failed or slow handshake closes the connection (and frees
                        // its slot as `open` and `permit` drop).
                        match tokio::time::timeout(limits.tls_handshake_timeout, handshake).await {
                            Ok(Ok(tls)) => Io::Tls(Box::new(tls)),
                            Ok(Err(err)) => {
                                counts.handshake_failed(Some(&err));
                                return;
                            }
                            Err(_) => {
                                counts.handshake_failed(None);
                                return;
                            }
                        }
                    }
                };
                let _ = send
                    .send(Ok(Conn {
                        io,
                        info,
                        _permit: permit,
                        _open: open,
                    }))
                    .await;
            });
        }
    });
    receive
}
