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
    /// Quota (RLQS) streams open at once, on all connections; more are refused
    /// `RESOURCE_EXHAUSTED`.
    pub max_quota_streams: usize,
    /// Buckets one quota stream holds; a new bucket past it gets no assignment (Envoy
    /// applies its no-assignment behaviour to it).
    pub max_stream_buckets: usize,
    /// Longest wait for a quota stream's next usage report (Envoy reports every
    /// `reporting_interval`) before the stream is ended `DEADLINE_EXCEEDED`.
    pub quota_idle_timeout: Duration,
    /// A bucket Envoy reports no request for during this long is abandoned: Envoy drops
    /// it (and its next request starts it again), and so does the stream.
    pub abandon_after: Duration,
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

/// `--rlqs-max-streams`' default: one Envoy holds one stream per filter configuration.
pub const MAX_QUOTA_STREAMS: usize = 1_024;
/// `--rlqs-max-buckets`' default: a bucket id is at most 16 entries of 1 KiB values, so a
/// stream holds at most about 17 MB of ids, usually far less.
pub const MAX_STREAM_BUCKETS: usize = 1_000;
/// `--rlqs-idle-timeout`' default: many reporting intervals (Envoy's are seconds).
pub const QUOTA_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// `--rlqs-abandon-after`' default.
pub const ABANDON_AFTER: Duration = Duration::from_secs(300);
/// How long an assignment holds in Envoy without being sent again. Every report renews
/// it; when the service is gone for this long, Envoy's expired-assignment behaviour
/// applies (the generated configuration keeps the last assignment a while longer).
pub const ASSIGNMENT_TTL: Duration = Duration::from_secs(30);

impl Default for RlsLimits {
    fn default() -> Self {
        RlsLimits {
            max_connections: MAX_CONNECTIONS,
            max_streams: MAX_STREAMS,
            request_timeout: REQUEST_TIMEOUT,
            tls_handshake_timeout: crate::conn::TLS_HANDSHAKE_TIMEOUT,
            max_quota_streams: MAX_QUOTA_STREAMS,
            max_stream_buckets: MAX_STREAM_BUCKETS,
            quota_idle_timeout: QUOTA_IDLE_TIMEOUT,
            abandon_after: ABANDON_AFTER,
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
        if self.max_quota_streams == 0 {
            return Err("--rlqs-max-streams must be at least 1".into());
        }
        if self.max_stream_buckets == 0 {
            return Err("--rlqs-max-buckets must be at least 1".into());
        }
        for (flag, value) in [
            ("--rls-request-timeout", self.request_timeout),
            ("--rlqs-idle-timeout", self.quota_idle_timeout),
            ("--rlqs-abandon-after", self.abandon_after),
            ("--tls-handshake-timeout", self.tls_handshake_timeout),
        ] {
            if value < Duration::from_millis(1) {
                return Err(format!("{flag} must be at least 1ms"));
            }
        }
        Ok(())
    }
}
