//! What one client of the rate limit service may send and hold: every bound of the gRPC
//! listener (`sluice serve --rls-*`), with its default and the reason for it.

use std::time::Duration;

/// The budget of the RLS listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RlsLimits {
    /// gRPC connections open at once (handshaking or serving); more are closed at once.
    pub max_connections: usize,
    /// Calls in flight on one connection (HTTP/2 streams); Envoy multiplexes its calls
    /// over few connections, so this is also what one Envoy can have in flight per
    /// connection.
    pub max_streams: u32,
    /// How long one call may take before it is answered `DEADLINE_EXCEEDED` (Envoy's own
    /// `timeout`, 20 ms by default, is usually shorter).
    pub request_timeout: Duration,
    /// How long a client may take to finish its TLS handshake (without TLS: to send its
    /// first bytes).
    pub tls_handshake_timeout: Duration,
}

/// Largest `RateLimitRequest` decoded: 64 descriptors of 16 entries at the longest
/// strings is about 1.3 MB, and no real request comes near; 256 KiB is far above what
/// Envoy sends and keeps a hostile message from costing more than that to parse.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// Largest HTTP/2 header list (the call's metadata).
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;
/// `--rls-max-connections`' default.
pub const MAX_CONNECTIONS: usize = 256;
/// `--rls-max-streams`' default.
pub const MAX_STREAMS: u32 = 128;
/// `--rls-request-timeout`' default.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How often an idle connection is pinged, and how long a ping may go unanswered before
/// the connection is closed: a peer that vanished frees its slot within a minute.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

impl Default for RlsLimits {
    fn default() -> Self {
        RlsLimits {
            max_connections: MAX_CONNECTIONS,
            max_streams: MAX_STREAMS,
            request_timeout: REQUEST_TIMEOUT,
            tls_handshake_timeout: crate::conn::TLS_HANDSHAKE_TIMEOUT,
        }
    }
}

impl RlsLimits {
    /// Why these limits cannot be served with, for `sluice serve`'s error message.
    pub fn check(&self) -> Result<(), String> {
        if self.max_connections == 0 {
            return Err("--rls-max-connections must be at least 1".into());
        }
        if self.max_streams == 0 {
            return Err("--rls-max-streams must be at least 1".into());
        }
        for (flag, value) in [
            ("--rls-request-timeout", self.request_timeout),
            ("--tls-handshake-timeout", self.tls_handshake_timeout),
        ] {
            if value < Duration::from_millis(1) {
                return Err(format!("{flag} must be at least 1ms"));
            }
        }
        Ok(())
    }
}
