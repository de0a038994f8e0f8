//! Envoy's native rate limit filter (`envoy.filters.http.ratelimit`) pointed at Sluice's
//! rate limit service (`sluice serve --rls-listen`), for users who choose the service
//! over the wasm filter: the filter, its HTTP/2 cluster, and the route's `rate_limits`
//! actions that make each request's descriptor.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::str::FromStr;

use serde_json::{Value, json};
use sluice_core::spec::RuleSpec;

use crate::admin::{AdminTls, upstream_tls};
use crate::error::EnvoyConfigError;

/// The cluster of Sluice's rate limit service.
pub const RLS_CLUSTER: &str = "sluice_rls";

/// How Envoy shows itself to Sluice's gRPC listener (`sluice serve --rls-auth token`,
/// `--rls-client-ca`), for the rate limit and the quota filter alike.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RlsCredentials {
    /// A token with the `proxy` role, sent as `authorization: Bearer TOKEN` in every
    /// call's `initial_metadata`.
    pub token: Option<String>,
    /// TLS to the listener (`sluice serve --tls-cert`): the CA its certificate must chain
    /// to, the name it must carry (by default its IP address), and the client certificate
    /// `--rls-client-ca` asks for.
    pub tls: Option<AdminTls>,
    /// Allows the token in clear text (no `tls`) to an address that is not loopback
    /// (`--rls-insecure`): a network the operator trusts, or one a mesh encrypts.
    pub insecure: bool,
}

impl RlsCredentials {
    /// Refuses TLS files Envoy would resolve against its own working directory, and a
    /// token that would cross the network in clear text to any of `addrs` (the listeners
    /// the filters call) unless `insecure` says so.
    pub(crate) fn check(
        &self,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Result<(), EnvoyConfigError> {
        if let Some(relative) = self
            .tls
            .iter()
            .flat_map(AdminTls::paths)
            .find(|p| !p.is_absolute())
        {
            return Err(EnvoyConfigError::RelativeTlsPath(relative.clone()));
        }
        match self.clear_text_to(addrs) {
            Some(remote) if !self.insecure => Err(EnvoyConfigError::PlainRlsTokenToRemote(remote)),
            _ => Ok(()),
        }
    }

    /// The first of `addrs` that is not loopback when the token would reach it in clear
    /// text (a token and no TLS).
    pub(crate) fn clear_text_to(
        &self,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Option<SocketAddr> {
        if self.token.is_none() || self.tls.is_some() {
            return None;
        }
        addrs.into_iter().find(|addr| !addr.ip().is_loopback())
    }

    /// The generated file's warning when `--rls-insecure` let the token go in clear text.
    pub(crate) fn clear_text_warning(
        &self,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Option<String> {
        self.clear_text_to(addrs).map(|remote| {
            format!(
                "WARNING: --rls-insecure: the proxy token crosses the network to {remote} in \
                 clear text."
            )
        })
    }

    /// The `GrpcService` both filters call the listener through.
    pub(crate) fn grpc_service(&self) -> Value {
        let mut service = json!({ "envoy_grpc": { "cluster_name": RLS_CLUSTER } });
        if let Some(token) = &self.token {
            service["initial_metadata"] =
                json!([{ "key": "authorization", "value": format!("Bearer {token}") }]);
        }
        service
    }
}

/// The native filter's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsService {
    /// Where `sluice serve --rls-listen` listens.
    pub addr: SocketAddr,
    /// The `domain` every request names (a rule's `descriptor.domain`).
    pub domain: String,
    /// The descriptors each request sends, each the actions of its entries in order.
    pub descriptors: Vec<Vec<RlsAction>>,
    /// How long Envoy waits for an answer before its failure mode applies.
    pub timeout_ms: u32,
    /// Deny when the service cannot answer (`failure_mode_deny`); by default traffic
    /// flows.
    pub fail_closed: bool,
}

/// One `rate_limits` action: an entry of the descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RlsAction {
    /// `remote_address`: the client's address (Envoy's trusted address).
    RemoteAddress,
    /// `request_headers`: the header's value under `key`; a request without the header
    /// sends no descriptor.
    Header { name: String, key: String },
    /// `generic_key`: a fixed `value` under `key`.
    Generic { key: String, value: String },
}

impl FromStr for RlsAction {
    type Err = String;

    /// `remote_address`, `header:NAME=KEY` or `generic:KEY=VALUE`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let pair = |rest: &str| {
            rest.split_once('=')
                .filter(|(a, b)| !a.is_empty() && !b.is_empty())
                .map(|(a, b)| (a.to_string(), b.to_string()))
        };
        if s == "remote_address" {
            return Ok(RlsAction::RemoteAddress);
        }
        if let Some((name, key)) = s.strip_prefix("header:").and_then(pair) {
            return Ok(RlsAction::Header {
                name: name.to_ascii_lowercase(),
                key,
            });
        }
        if let Some((key, value)) = s.strip_prefix("generic:").and_then(pair) {
            return Ok(RlsAction::Generic { key, value });
        }
        Err(format!(
            "`{s}`: give remote_address, header:NAME=KEY or generic:KEY=VALUE"
        ))
    }
}

impl RlsService {
    /// The `http_filters` entry, before the router.
    pub(crate) fn filter(&self, credentials: &RlsCredentials) -> Value {
        json!({
            "name": "envoy.filters.http.ratelimit",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                "domain": self.domain,
                "timeout": format!("{}s", f64::from(self.timeout_ms) / 1000.0),
                "failure_mode_deny": self.fail_closed,
                "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
                "rate_limit_service": {
                    "transport_api_version": "V3",
                    "grpc_service": credentials.grpc_service(),
                },
            },
        })
    }

    /// The service's cluster.
    pub(crate) fn cluster(&self, credentials: &RlsCredentials) -> Value {
        grpc_cluster(self.addr, credentials)
    }

    /// The route's `rate_limits`: one entry per descriptor, its actions in order.
    pub(crate) fn rate_limits(&self) -> Value {
        let entries: Vec<Value> = self
            .descriptors
            .iter()
            .map(|actions| json!({ "actions": actions.iter().map(RlsAction::to_json).collect::<Vec<_>>() }))
            .collect();
        Value::Array(entries)
    }
}

/// The cluster of Sluice's gRPC listener (rate limit and quota services): HTTP/2, one
/// static endpoint, over TLS (ALPN `h2`) when `credentials` say so.
pub(crate) fn grpc_cluster(addr: SocketAddr, credentials: &RlsCredentials) -> Value {
    let mut cluster = json!({
        "name": RLS_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": {} },
            },
        },
        "load_assignment": {
            "cluster_name": RLS_CLUSTER,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": {
                "socket_address": {
                    "address": addr.ip().to_string(),
                    "port_value": addr.port(),
                },
            } } }] }],
        },
    });
    if let Some(tls) = &credentials.tls {
        let ip = addr.ip().to_string();
        let mut socket = upstream_tls(&[ip.as_str()], tls);
        socket["typed_config"]["common_tls_context"]["alpn_protocols"] = json!(["h2"]);
        cluster["transport_socket"] = socket;
    }
    cluster
}

/// Which request header carries a descriptor entry's value (`--rls-key-header KEY=NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyHeader {
    pub key: String,
    /// Lower case; may be a pseudo-header such as `:path`.
    pub header: String,
}

impl FromStr for KeyHeader {
    type Err = String;

    /// `KEY=HEADER`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.split_once('=')
            .filter(|(key, header)| !key.is_empty() && !header.is_empty())
            .map(|(key, header)| KeyHeader {
                key: key.to_string(),
                header: header.to_ascii_lowercase(),
            })
            .ok_or_else(|| format!("`{s}`: give KEY=HEADER, e.g. api_key=x-api-key"))
    }
}

/// The domains of the rules with a `descriptor` section, each once, in order.
pub fn rls_domains(rules: &[RuleSpec]) -> BTreeSet<&str> {
    rules
        .iter()
        .filter_map(|r| r.descriptor.as_ref())
        .map(|d| d.domain.as_str())
        .collect()
}

/// The route's descriptors that reach the rules of `domain` with a `descriptor` section:
/// one per distinct list of entries, each entry read by the action that makes it.
/// `remote_address` is the client's address and a `generic_key` with a fixed value is
/// sent as is (on the one route the bootstrap has: with every request); any other key is
/// read from the header `headers` names for it, else from the header named like the key
/// with `_` as `-` (`api_key` from `api-key`). Envoy sends a descriptor only when every
/// header it reads is present, and the service's walk picks the most specific rule, so
/// rules that share their keys share one descriptor.
pub fn descriptors_for_rules(
    rules: &[RuleSpec],
    domain: &str,
    headers: &[KeyHeader],
) -> Vec<Vec<RlsAction>> {
    let mut descriptors: Vec<Vec<RlsAction>> = Vec::new();
    let entries = rules
        .iter()
        .filter_map(|r| r.descriptor.as_ref())
        .filter(|d| d.domain == domain);
    for descriptor in entries {
        let actions: Vec<RlsAction> = descriptor
            .entries
            .iter()
            .map(|entry| match (entry.key.as_str(), &entry.value) {
                ("remote_address", _) => RlsAction::RemoteAddress,
                ("generic_key", Some(value)) => RlsAction::Generic {
                    key: entry.key.clone(),
                    value: value.clone(),
                },
                (key, _) => RlsAction::Header {
                    name: headers.iter().find(|h| h.key == key).map_or_else(
                        || key.replace('_', "-").to_ascii_lowercase(),
                        |h| h.header.clone(),
                    ),
                    key: key.to_string(),
                },
            })
            .collect();
        if !descriptors.contains(&actions) {
            descriptors.push(actions);
        }
    }
    descriptors
}

impl RlsAction {
    /// Parses a comma-separated list of actions: one descriptor (`--rls-descriptor`).
    pub fn parse_list(s: &str) -> Result<Vec<RlsAction>, String> {
        s.split(',').map(str::parse).collect()
    }

    fn to_json(&self) -> Value {
        match self {
            RlsAction::RemoteAddress => json!({ "remote_address": {} }),
            RlsAction::Header { name, key } => json!({ "request_headers": {
                    "header_name": name, "descriptor_key": key,
                } }),
            RlsAction::Generic { key, value } => json!({ "generic_key": {
                    "descriptor_key": key, "descriptor_value": value,
                } }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both sides of the clear-text rule: a token without TLS goes to loopback freely, to
    /// any other address only with `insecure`; with TLS, or without a token, anywhere.
    #[test]
    fn a_token_goes_in_clear_text_only_to_loopback_unless_insecure_says_so() {
        let loopback: SocketAddr = "127.0.0.1:8081".parse().unwrap();
        let loopback_v6: SocketAddr = "[::1]:8081".parse().unwrap();
        let remote: SocketAddr = "10.0.0.7:8081".parse().unwrap();
        let token = RlsCredentials {
            token: Some("slc_proxy".into()),
            ..RlsCredentials::default()
        };
        assert!(token.check([loopback, loopback_v6]).is_ok());
        assert!(token.clear_text_warning([loopback]).is_none());
        match token.check([loopback, remote]) {
            Err(err @ EnvoyConfigError::PlainRlsTokenToRemote(addr)) => {
                assert_eq!(addr, remote);
                assert!(err.to_string().contains("--rls-insecure"), "{err}");
                assert!(err.to_string().contains("--rls-ca"), "{err}");
            }
            other => panic!("{remote} was accepted in clear text: {other:?}"),
        }
        let insecure = RlsCredentials {
            insecure: true,
            ..token.clone()
        };
        assert!(insecure.check([remote]).is_ok());
        let warning = insecure.clear_text_warning([remote]).unwrap();
        assert!(warning.contains("10.0.0.7:8081"), "{warning}");
        let tls = RlsCredentials {
            tls: Some(AdminTls::new("/pki/ca.pem")),
            ..token.clone()
        };
        assert!(tls.check([remote]).is_ok());
        assert!(tls.clear_text_warning([remote]).is_none());
        assert!(RlsCredentials::default().check([remote]).is_ok());
    }

    #[test]
    fn actions_are_read_from_their_flags() {
        assert_eq!("remote_address".parse(), Ok(RlsAction::RemoteAddress));
        assert_eq!(
            "header:X-Api-Key=api_key".parse(),
            Ok(RlsAction::Header {
                name: "x-api-key".into(),
                key: "api_key".into()
            })
        );
        assert_eq!(
            "generic:path=/login".parse(),
            Ok(RlsAction::Generic {
                key: "path".into(),
                value: "/login".into()
            })
        );
        for bad in ["header:x", "generic:=v", "cookie:a=b", ""] {
            assert!(bad.parse::<RlsAction>().is_err(), "{bad}");
        }
    }

    fn rules(yaml: &str) -> Vec<RuleSpec> {
        sluice_rules_file::parse_rules(
            yaml,
            sluice_rules_file::RulesFormat::Yaml,
            std::path::Path::new("rules.yaml"),
        )
        .unwrap()
    }

    const RULES: &str = "
- name: per-key
  key: global
  limits: [{requests: 10, period: second}]
  descriptor: {domain: edge, entries: [{key: api_key}]}
- name: acme
  key: global
  limits: [{requests: 100, period: second}]
  descriptor: {domain: edge, entries: [{key: api_key, value: acme}]}
- name: login
  key: global
  limits: [{requests: 5, period: minute}]
  descriptor:
    domain: edge
    entries: [{key: path, value: /login}, {key: remote_address}]
- name: slow
  key: global
  limits: [{requests: 1, period: second}]
  descriptor:
    domain: edge
    entries: [{key: generic_key, value: slowpath}, {key: tenant_id, value_prefix: t-}]
- name: elsewhere
  key: global
  limits: [{requests: 1, period: second}]
  descriptor: {domain: other, entries: [{key: user}]}
";

    #[test]
    fn each_distinct_list_of_entries_of_the_domain_is_one_descriptor() {
        let rules = rules(RULES);
        let path = "path=:path".parse::<KeyHeader>().unwrap();
        let descriptors = descriptors_for_rules(&rules, "edge", &[path]);
        let header = |name: &str, key: &str| RlsAction::Header {
            name: name.into(),
            key: key.into(),
        };
        assert_eq!(
            descriptors,
            [
                // per-key and acme share their keys: one descriptor, the walk picks.
                vec![header("api-key", "api_key")],
                vec![header(":path", "path"), RlsAction::RemoteAddress],
                vec![
                    RlsAction::Generic {
                        key: "generic_key".into(),
                        value: "slowpath".into()
                    },
                    header("tenant-id", "tenant_id")
                ],
            ]
        );
        assert_eq!(
            descriptors_for_rules(&rules, "other", &[]),
            [vec![header("user", "user")]]
        );
        assert!(descriptors_for_rules(&rules, "none", &[]).is_empty());
        assert_eq!(
            rls_domains(&rules).into_iter().collect::<Vec<_>>(),
            ["edge", "other"]
        );
    }

    #[test]
    fn a_key_header_names_both_sides() {
        assert_eq!(
            "api_key=X-Api-Key".parse(),
            Ok(KeyHeader {
                key: "api_key".into(),
                header: "x-api-key".into()
            })
        );
        for bad in ["api_key", "=x", "k=", ""] {
            assert!(bad.parse::<KeyHeader>().is_err(), "{bad}");
        }
    }
}
