//! The echo server standing in for the protected service (the harness's
//! [`EchoUpstream`]), with the route to it in the terms of the tests' [`crate::Envoy`].

use std::net::SocketAddr;

use sluice_envoy_config as envoy_config;
use sluice_harness::upstream::EchoUpstream;

/// Answers every request with 200 and a JSON body describing the request as it arrived:
/// `{"method": "GET", "path": "/a?b=c", "headers": {"x-api-key": "k", ...}}` (header names
/// lowercased; repeated headers joined with ", "). Lets tests see what the filter added or
/// removed on the way upstream. Stops when dropped.
#[derive(Debug)]
pub struct Upstream(EchoUpstream);

impl Upstream {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub fn start() -> Upstream {
        Upstream(EchoUpstream::start().unwrap_or_else(|err| panic!("{err:#}")))
    }

    pub fn addr(&self) -> SocketAddr {
        self.0.addr()
    }

    /// The route to this server, for [`crate::EnvoyOptions::upstream`].
    pub fn target(&self) -> envoy_config::Upstream {
        envoy_config::Upstream::Cluster(self.0.addr())
    }

    /// Requests answered so far: how many got past Envoy.
    pub fn requests_seen(&self) -> u64 {
        self.0.requests_seen()
    }

    /// Requests being worked on now (see [`EchoUpstream::in_flight`]).
    pub fn in_flight(&self) -> u64 {
        self.0.in_flight()
    }

    /// The most requests worked on at once since the start or the last reset.
    pub fn in_flight_high_water(&self) -> u64 {
        self.0.in_flight_high_water()
    }

    pub fn reset_high_water(&self) {
        self.0.reset_high_water();
    }
}
