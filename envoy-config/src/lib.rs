//! `sluice envoy-config`: a complete Envoy (v3 API) bootstrap that runs the Sluice filter.
//!
//! [`build`] is pure: it validates the filter configuration and assembles the bootstrap as
//! a JSON value (so tests and tools can inspect or adjust it), and [`Bootstrap::to_yaml`]
//! writes it out. Nothing here touches the file system; the CLI resolves paths and reads
//! rules files before calling in.
//!
//! This module only declares the others and names what they export. Each depends only on
//! those before it:
//!
//! * `error`: [`EnvoyConfigError`], and the core's refusals as field errors.
//! * `admin`: the admin API connection, its cluster and the control service that
//!   long-polls it (a singleton bootstrap extension, or in [`ControlMode::Worker`] a
//!   `control` section of the plugin configuration: [`plugin_configuration`]).
//! * `rls`: Envoy's native rate limit filter pointed at Sluice's rate limit service
//!   ([`RlsService`]), its cluster and the route's `rate_limits`.
//! * `rlqs`: Envoy's quota filter pointed at Sluice's quota service ([`RlqsService`]),
//!   its bucket matcher and the same cluster.
//! * `options`: [`EnvoyConfigOptions`], everything the bootstrap depends on.
//! * `plugin`: the filter's `http_filters` entry, its VM and its plugin configuration.
//! * `output`: [`Bootstrap`], written as YAML under a header that says how to run it.
//! * `bootstrap`: the listener with the filter, the upstream, and [`build`].
//! * [`render`](mod@render): what users apply on their platforms (`sluice render`), built on the
//!   above.
//!
//! A crate of its own, apart from the admin API's server: the `sluice` command line and
//! the end-to-end tests' harness generate configs with it, and need only the core.

mod admin;
mod bootstrap;
mod error;
mod options;
mod output;
mod plugin;
pub mod render;
mod rlqs;
mod rls;
#[cfg(test)]
mod testing;

pub use admin::{ADMIN_CLUSTER, AdminConnection, AdminTls, AdminUrl, CONTROL_ROOT_ID};
pub use bootstrap::{
    DIRECT_RESPONSE_BODY, HTTP_STAT_PREFIX, LISTENER_NAME, RULE_TAG, RULE_TAG_REGEX,
    UPSTREAM_CLUSTER, build, render,
};
pub use error::EnvoyConfigError;
pub use options::{
    ControlMode, DEFAULT_ENVOY_ADMIN, EnvoyConfigOptions, PluginConfig, Upstream, UpstreamProtocol,
};
pub use output::Bootstrap;
pub use plugin::{PLUGIN_NAME, WASM_FILTER, plugin_configuration};
pub use rlqs::{REUSE_EXPIRED_ASSIGNMENT_S, RlqsService};
pub use rls::{
    KeyHeader, RLS_CLUSTER, RlsAction, RlsCredentials, RlsService, descriptors_for_rules,
    rls_domains,
};
pub use sluice_core::listening::Scheme;
