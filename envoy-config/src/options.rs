//! What the bootstrap depends on: [`EnvoyConfigOptions`] and the choices it is made of
//! (the upstream and its protocol, where the control service runs, the filter's plugin
//! configuration).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::str::FromStr;

use sluice_core::config::FilterConfigSpec;

use crate::admin::AdminConnection;
use crate::rlqs::RlqsService;
use crate::rls::{RlsCredentials, RlsService};

/// Envoy's usual admin address.
pub const DEFAULT_ENVOY_ADMIN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9901));

/// Where allowed requests go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// A static cluster with this one endpoint.
    Cluster(SocketAddr),
    /// Envoy answers 200 `ok` itself: benchmarks and memory tests then measure Envoy and the
    /// filter alone, with no upstream process competing for CPU.
    Direct,
}

impl FromStr for Upstream {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "direct" {
            return Ok(Upstream::Direct);
        }
        s.parse()
            .map(Upstream::Cluster)
            .map_err(|_| format!("`{s}` is neither IP:PORT (e.g. 127.0.0.1:8081) nor `direct`"))
    }
}

/// The protocol Envoy speaks to the upstream (`--upstream-protocol`: with the `cli`
/// feature, each variant's comment is its help).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum UpstreamProtocol {
    /// HTTP/1.1, whatever the client spoke (Envoy's default).
    #[default]
    Http1,
    /// HTTP/2 (cleartext) for every request: a gRPC upstream.
    Http2,
    /// The client's protocol: HTTP/2 for HTTP/2 clients (gRPC), HTTP/1.1 for the others.
    Downstream,
}

/// Where the control service runs (`--control`: with the `cli` feature, each variant's
/// comment is its help).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum ControlMode {
    /// A singleton on Envoy's main thread (a bootstrap extension).
    #[default]
    Singleton,
    /// One worker elected among the filter's workers: no bootstrap extension, the
    /// `control` section in the filter's plugin configuration (Istio, Envoy Gateway).
    Worker,
}

/// The filter's plugin configuration as handed to Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginConfig {
    /// Validated before anything is emitted, so a bad rule is caught here and not at
    /// Envoy start-up.
    Spec(FilterConfigSpec),
    /// Embedded verbatim and unchecked: lets tests feed the filter a malformed
    /// configuration.
    Raw(String),
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig::Spec(FilterConfigSpec::default())
    }
}

/// Everything the bootstrap depends on.
///
/// Built with [`EnvoyConfigOptions::new`] and then adjusted field by field: the struct is
/// `non_exhaustive` so that later options (such as the admin API connection, which adds a
/// singleton service and a cluster) can be added without breaking callers.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EnvoyConfigOptions {
    /// Where the listener binds; port 0 lets the kernel choose.
    pub listen: SocketAddr,
    pub upstream: Upstream,
    /// Absolute path of the filter's `.wasm` file. Envoy resolves relative paths against its
    /// own working directory, which is rarely the one the config was generated in.
    pub filter_wasm: PathBuf,
    pub plugin: PluginConfig,
    /// Worker threads, for the run command written at the top of the file.
    pub concurrency: Option<NonZeroU32>,
    /// Envoy's admin interface.
    pub envoy_admin: SocketAddr,
    /// Where the bootstrap will be saved, for the run command; `None` when printed.
    pub config_path: Option<PathBuf>,
    /// Rules pushed from the admin API: adds the control service and its cluster.
    pub admin: Option<AdminConnection>,
    /// What Envoy speaks to a cluster upstream.
    pub upstream_protocol: UpstreamProtocol,
    /// Where the control service runs, with an admin API.
    pub control_mode: ControlMode,
    /// Set: Envoy's native rate limit filter asks Sluice's rate limit service instead of
    /// running the wasm filter (`filter_wasm`, `plugin` and `admin` are then not used).
    pub rls: Option<RlsService>,
    /// Set: Envoy's quota filter (RLQS) asks Sluice's quota service instead of running
    /// the wasm filter (and besides `rls` when both are set).
    pub rlqs: Option<RlqsService>,
    /// What `rls` and `rlqs` show Sluice's listener: a proxy token, TLS, a client
    /// certificate.
    pub rls_credentials: RlsCredentials,
}

impl EnvoyConfigOptions {
    pub fn new(listen: SocketAddr, upstream: Upstream, filter_wasm: impl Into<PathBuf>) -> Self {
        Self {
            listen,
            upstream,
            filter_wasm: filter_wasm.into(),
            plugin: PluginConfig::default(),
            concurrency: None,
            envoy_admin: DEFAULT_ENVOY_ADMIN,
            config_path: None,
            admin: None,
            upstream_protocol: UpstreamProtocol::default(),
            control_mode: ControlMode::default(),
            rls: None,
            rlqs: None,
            rls_credentials: RlsCredentials::default(),
        }
    }

    /// The addresses of Sluice's gRPC listener the native filters call (`rls`, `rlqs`).
    pub(crate) fn service_addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.rls
            .iter()
            .map(|r| r.addr)
            .chain(self.rlqs.iter().map(|q| q.addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_flag_values() {
        assert_eq!("direct".parse::<Upstream>(), Ok(Upstream::Direct));
        assert_eq!(
            "127.0.0.1:8081".parse::<Upstream>(),
            Ok(Upstream::Cluster("127.0.0.1:8081".parse().unwrap()))
        );
        assert!("localhost:8081".parse::<Upstream>().is_err());
    }
}
