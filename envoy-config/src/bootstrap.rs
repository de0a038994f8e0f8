//! The bootstrap itself: the listener with the filter, the upstream (a cluster or Envoy's
//! own answer), with an admin API its cluster and control service, and the stats tags of
//! the filter's per-rule counters; [`build`] assembles it and [`render`] writes it out.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::admin::{admin_cluster, control_service};
use crate::error::EnvoyConfigError;
use crate::options::{ControlMode, EnvoyConfigOptions, Upstream, UpstreamProtocol};
use crate::output::{Bootstrap, header};
use crate::plugin::{plugin_configuration, vm_config, wasm_filter};

/// The listener that carries client traffic; also its stats prefix
/// (`listener.sluice_ingress.worker_N.downstream_cx_total`), which would otherwise be the
/// bound address and change with every port.
pub const LISTENER_NAME: &str = "sluice_ingress";
/// The HTTP connection manager's stats prefix (`http.ingress_http.*`).
pub const HTTP_STAT_PREFIX: &str = "ingress_http";
/// The cluster that receives allowed requests.
pub const UPSTREAM_CLUSTER: &str = "sluice_upstream";
/// The body of the `direct` upstream's answer.
pub const DIRECT_RESPONSE_BODY: &str = "ok\n";
/// The Prometheus label the filter's per-rule counters (`sluice_rule.<id>.<outcome>_total`)
/// carry their rule id in.
pub const RULE_TAG: &str = "sluice_rule";
/// Envoy's tag extraction for those counters: the rule id between the prefix and the
/// outcome becomes the `sluice_rule` tag, so Prometheus sees one metric per outcome.
pub const RULE_TAG_REGEX: &str = r"^wasmcustom\.sluice_rule\.(([^.]+)\.)";

/// Validates the options and renders the bootstrap YAML in one step.
pub fn render(options: &EnvoyConfigOptions) -> Result<String, EnvoyConfigError> {
    build(options)?.to_yaml()
}

/// Validates the options and assembles the bootstrap.
pub fn build(options: &EnvoyConfigOptions) -> Result<Bootstrap, EnvoyConfigError> {
    if let Some(rlqs) = &options.rlqs {
        rlqs.check().map_err(EnvoyConfigError::InvalidRlqs)?;
    }
    if options.rls.is_some() || options.rlqs.is_some() {
        options.rls_credentials.check(options.service_addrs())?;
        return Ok(with_services(options));
    }
    if !options.filter_wasm.is_absolute() {
        return Err(EnvoyConfigError::RelativeFilterPath(
            options.filter_wasm.clone(),
        ));
    }
    if let Some(admin) = &options.admin {
        admin.check_transport()?;
    }
    let plugin_json = plugin_configuration(options)?;
    let vm_config = vm_config(&options.filter_wasm);
    let wasm_filter = wasm_filter(vm_config.clone(), plugin_json);
    let router = router();

    let mut clusters = Vec::new();
    let route = upstream_route(options, &mut clusters);
    let listener = listener(options, route, vec![wasm_filter, router]);

    // The admin API's cluster either way: in worker mode it stands for what a control
    // plane provides (an Istio ServiceEntry, an Envoy Gateway Backend).
    let control = match (&options.admin, options.control_mode) {
        (Some(admin), ControlMode::Singleton) => {
            clusters.push(admin_cluster(admin));
            Some(control_service(admin, vm_config)?)
        }
        (Some(admin), ControlMode::Worker) => {
            clusters.push(admin_cluster(admin));
            None
        }
        (None, _) => None,
    };

    let mut config = config(options, listener, clusters);
    if let Some(control) = control {
        config["bootstrap_extensions"] = json!([control]);
    }

    Ok(Bootstrap {
        header: header(options),
        config,
    })
}

/// The bootstrap with Envoy's native rate limit filter asking Sluice's rate limit service
/// and/or its quota filter asking the quota service (no wasm filter, no control service).
fn with_services(options: &EnvoyConfigOptions) -> Bootstrap {
    let mut clusters = Vec::new();
    let mut route = upstream_route(options, &mut clusters);
    let mut filters = Vec::new();
    if let Some(rls) = &options.rls {
        if let Some(action) = route.get_mut("route") {
            action["rate_limits"] = rls.rate_limits();
        }
        clusters.push(rls.cluster(&options.rls_credentials));
        filters.push(rls.filter(&options.rls_credentials));
    }
    if let Some(rlqs) = &options.rlqs {
        if options.rls.is_none() {
            clusters.push(rlqs.cluster(&options.rls_credentials));
        }
        filters.push(rlqs.filter(&options.rls_credentials));
    }
    filters.push(router());
    let listener = listener(options, route, filters);
    Bootstrap {
        header: header(options),
        config: config(options, listener, clusters),
    }
}

fn router() -> Value {
    json!({
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        },
    })
}

/// The whole bootstrap around its listener and clusters.
fn config(options: &EnvoyConfigOptions, listener: Value, clusters: Vec<Value>) -> Value {
    let mut static_resources = json!({ "listeners": [listener] });
    if !clusters.is_empty() {
        static_resources["clusters"] = Value::Array(clusters);
    }
    json!({
        "admin": { "address": socket_address(options.envoy_admin) },
        "static_resources": static_resources,
        "stats_config": { "stats_tags": [{ "tag_name": RULE_TAG, "regex": RULE_TAG_REGEX }] },
    })
}

/// The route to the upstream (adding its cluster to `clusters`), or Envoy's own answer.
fn upstream_route(options: &EnvoyConfigOptions, clusters: &mut Vec<Value>) -> Value {
    match options.upstream {
        Upstream::Cluster(addr) => {
            let mut cluster = json!({
                "name": UPSTREAM_CLUSTER,
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {
                    "cluster_name": UPSTREAM_CLUSTER,
                    "endpoints": [{
                        "lb_endpoints": [{ "endpoint": { "address": socket_address(addr) } }],
                    }],
                },
            });
            if let Some(protocol) = upstream_protocol_options(options.upstream_protocol) {
                cluster["typed_extension_protocol_options"] = json!({
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": protocol,
                });
            }
            clusters.push(cluster);
            json!({ "match": { "prefix": "/" }, "route": { "cluster": UPSTREAM_CLUSTER } })
        }
        Upstream::Direct => json!({
            "match": { "prefix": "/" },
            "direct_response": { "status": 200, "body": { "inline_string": DIRECT_RESPONSE_BODY } },
        }),
    }
}

/// The client traffic's listener: one route, these HTTP filters.
fn listener(options: &EnvoyConfigOptions, route: Value, http_filters: Vec<Value>) -> Value {
    json!({
        "name": LISTENER_NAME,
        "stat_prefix": LISTENER_NAME,
        "address": socket_address(options.listen),
        "filter_chains": [{
            "filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": HTTP_STAT_PREFIX,
                    "codec_type": "AUTO",
                    "route_config": {
                        "name": "sluice_routes",
                        "virtual_hosts": [{
                            "name": "all",
                            "domains": ["*"],
                            "routes": [route],
                        }],
                    },
                    "http_filters": http_filters,
                },
            }],
        }],
    })
}

/// The cluster's `HttpProtocolOptions` for `protocol`, or `None` for Envoy's default
/// (HTTP/1.1).
fn upstream_protocol_options(protocol: UpstreamProtocol) -> Option<Value> {
    let kind = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
    match protocol {
        UpstreamProtocol::Http1 => None,
        UpstreamProtocol::Http2 => Some(json!({
            "@type": kind,
            "explicit_http_config": { "http2_protocol_options": {} },
        })),
        UpstreamProtocol::Downstream => Some(json!({
            "@type": kind,
            "use_downstream_protocol_config": {
                "http_protocol_options": {},
                "http2_protocol_options": {},
            },
        })),
    }
}

fn socket_address(addr: SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::rls::{RlsAction, RlsService};
    use crate::testing::*;

    #[test]
    fn the_upstream_protocol_sets_the_cluster_protocol_options() {
        let upstream = Upstream::Cluster("127.0.0.1:50051".parse().unwrap());
        let options_of = |protocol| {
            let mut opts = options(upstream);
            opts.upstream_protocol = protocol;
            let config = parse(&render(&opts).unwrap());
            config
                .pointer("/static_resources/clusters/0")
                .unwrap()
                .clone()
        };
        let key = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
        assert!(
            options_of(UpstreamProtocol::Http1)
                .get("typed_extension_protocol_options")
                .is_none(),
            "HTTP/1.1 is Envoy's default"
        );
        let http2 = options_of(UpstreamProtocol::Http2);
        assert_eq!(
            http2["typed_extension_protocol_options"][key]["explicit_http_config"],
            json!({"http2_protocol_options": {}})
        );
        let downstream = options_of(UpstreamProtocol::Downstream);
        assert_eq!(
            downstream["typed_extension_protocol_options"][key]["use_downstream_protocol_config"],
            json!({"http_protocol_options": {}, "http2_protocol_options": {}})
        );
    }

    #[test]
    fn with_a_rate_limit_service_the_native_filter_asks_it_over_http2() {
        let mut opts = options(Upstream::Cluster("127.0.0.1:8081".parse().unwrap()));
        opts.rls = Some(RlsService {
            addr: "127.0.0.1:8082".parse().unwrap(),
            domain: "edge".into(),
            descriptors: vec![
                vec![
                    "generic:path=/login".parse().unwrap(),
                    "remote_address".parse().unwrap(),
                ],
                RlsAction::parse_list("header:x-tenant=tenant").unwrap(),
            ],
            timeout_ms: 250,
            fail_closed: false,
        });
        let config = parse(&render(&opts).unwrap());
        let hcm = config
            .pointer("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config")
            .unwrap();
        let filters = hcm["http_filters"].as_array().unwrap();
        assert_eq!(filters.len(), 2, "no wasm filter");
        let rls = &filters[0]["typed_config"];
        assert_eq!(rls["domain"], "edge");
        assert_eq!(rls["timeout"], "0.25s");
        assert_eq!(rls["failure_mode_deny"], false);
        assert_eq!(rls["enable_x_ratelimit_headers"], "DRAFT_VERSION_03");
        assert_eq!(
            rls["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"],
            crate::RLS_CLUSTER
        );
        let route = route(&config);
        assert_eq!(
            route["route"]["rate_limits"],
            json!([
                {"actions": [
                    {"generic_key": {"descriptor_key": "path", "descriptor_value": "/login"}},
                    {"remote_address": {}},
                ]},
                {"actions": [
                    {"request_headers": {"header_name": "x-tenant", "descriptor_key": "tenant"}},
                ]},
            ])
        );
        let cluster = &config["static_resources"]["clusters"][1];
        assert_loopback_cluster(cluster, crate::RLS_CLUSTER, 8082);
        assert!(
            cluster["typed_extension_protocol_options"]
                .to_string()
                .contains("http2_protocol_options")
        );
        assert!(config.get("bootstrap_extensions").is_none());
    }

    #[test]
    fn the_rate_limit_and_quota_filters_send_the_proxy_token_and_speak_tls_with_a_client_certificate()
     {
        let mut opts = options(Upstream::Cluster("127.0.0.1:8081".parse().unwrap()));
        let addr = "127.0.0.1:8082".parse().unwrap();
        opts.rls = Some(RlsService {
            addr,
            domain: "edge".into(),
            descriptors: vec![vec![RlsAction::RemoteAddress]],
            timeout_ms: 250,
            fail_closed: false,
        });
        opts.rlqs = Some(crate::RlqsService {
            addr,
            domain: "edge".into(),
            bucket: RlsAction::parse_list("header:x-api-key=api_key").unwrap(),
            reporting_interval_ms: 1_000,
            fail_closed: false,
        });
        let plain = parse(&render(&opts).unwrap());
        let filters = |config: &Value| {
            config
                .pointer("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters")
                .unwrap()
                .clone()
        };
        assert!(!filters(&plain).to_string().contains("initial_metadata"));
        assert!(plain["static_resources"]["clusters"][1]["transport_socket"].is_null());

        let mut tls = crate::AdminTls::new("/pki/ca.pem");
        tls.client_cert = Some(("/pki/client.pem".into(), "/pki/client.key".into()));
        opts.rls_credentials = crate::RlsCredentials {
            token: Some("slc_proxy".into()),
            tls: Some(tls),
            insecure: false,
        };
        let config = parse(&render(&opts).unwrap());
        let filters = filters(&config);
        let metadata = json!([{"key": "authorization", "value": "Bearer slc_proxy"}]);
        assert_eq!(
            filters[0]["typed_config"]["rate_limit_service"]["grpc_service"]["initial_metadata"],
            metadata
        );
        assert_eq!(
            filters[1]["typed_config"]["rlqs_server"]["initial_metadata"],
            metadata
        );
        let clusters = config["static_resources"]["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2, "one cluster for both services");
        let context = &clusters[1]["transport_socket"]["typed_config"];
        let common = &context["common_tls_context"];
        assert_eq!(common["alpn_protocols"], json!(["h2"]));
        assert_eq!(
            common["validation_context"]["trusted_ca"]["filename"],
            "/pki/ca.pem"
        );
        assert_eq!(
            common["validation_context"]["match_typed_subject_alt_names"],
            json!([{"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}])
        );
        assert_eq!(
            common["tls_certificates"],
            json!([{
                "certificate_chain": {"filename": "/pki/client.pem"},
                "private_key": {"filename": "/pki/client.key"},
            }])
        );
        assert!(
            context.get("sni").is_none(),
            "an IP address is not sent as SNI"
        );

        opts.rls_credentials.tls = Some(crate::AdminTls::new("pki/ca.pem"));
        assert!(matches!(
            render(&opts),
            Err(EnvoyConfigError::RelativeTlsPath(_))
        ));
    }

    #[test]
    fn a_relative_filter_path_is_refused() {
        let opts = EnvoyConfigOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            Upstream::Direct,
            "target/dist/sluice_filter.wasm",
        );
        assert!(matches!(
            render(&opts),
            Err(EnvoyConfigError::RelativeFilterPath(_))
        ));
    }

    #[test]
    fn a_cluster_upstream_routes_to_a_static_loopback_cluster() {
        let config = parse(
            &render(&options(Upstream::Cluster(
                "127.0.0.1:8081".parse().unwrap(),
            )))
            .unwrap(),
        );
        assert_loopback_cluster(
            &config["static_resources"]["clusters"][0],
            UPSTREAM_CLUSTER,
            8081,
        );
        let route = route(&config);
        assert_eq!(route["route"]["cluster"], UPSTREAM_CLUSTER);
        assert!(route.get("direct_response").is_none());
    }

    #[test]
    fn a_direct_upstream_answers_from_envoy_without_a_cluster() {
        let config = parse(&render(&options(Upstream::Direct)).unwrap());
        assert!(config["static_resources"].get("clusters").is_none());
        let route = route(&config);
        assert_eq!(route["direct_response"]["status"], 200);
        assert_eq!(route["direct_response"]["body"]["inline_string"], "ok\n");
        assert!(route.get("route").is_none());
    }

    #[test]
    fn listener_and_admin_addresses_are_used_verbatim() {
        let mut opts = EnvoyConfigOptions::new("[::1]:0".parse().unwrap(), Upstream::Direct, WASM);
        opts.envoy_admin = "127.0.0.1:19901".parse().unwrap();
        let config = parse(&render(&opts).unwrap());
        let listener = &config["static_resources"]["listeners"][0];
        assert_eq!(listener["name"], LISTENER_NAME);
        assert_eq!(listener["address"]["socket_address"]["address"], "::1");
        assert_eq!(listener["address"]["socket_address"]["port_value"], 0);
        assert_eq!(
            config["admin"]["address"]["socket_address"]["port_value"],
            19901
        );
        let hcm = listener
            .pointer("/filter_chains/0/filters/0/typed_config")
            .unwrap();
        assert_eq!(hcm["stat_prefix"], HTTP_STAT_PREFIX);
        assert_eq!(hcm["codec_type"], "AUTO");
    }
}
