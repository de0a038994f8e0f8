//! What the crate's tests share: options as the command line makes them, rules as
//! operators write them, and where in a bootstrap the tests look.

use std::path::Path;

use serde_json::Value;
use sluice_core::config::{FilterConfig, FilterConfigSpec};
use sluice_rules_file::{RulesFormat, parse_rules};

use crate::render::Rendered;
use crate::{AdminConnection, EnvoyConfigOptions, Upstream, WASM_FILTER};

pub(crate) const WASM: &str = "/opt/sluice/sluice_filter.wasm";

pub(crate) fn options(upstream: Upstream) -> EnvoyConfigOptions {
    EnvoyConfigOptions::new("127.0.0.1:10000".parse().unwrap(), upstream, WASM)
}

/// Rules from the admin API at `url` (plain HTTP, loopback unless the test says
/// `insecure`), with the upstream a cluster.
pub(crate) fn with_admin(url: &str) -> EnvoyConfigOptions {
    let mut opts = options(Upstream::Cluster("127.0.0.1:8081".parse().unwrap()));
    let mut admin = AdminConnection::new(url.parse().unwrap(), "slc_proxy_token");
    admin.proxy_id = Some("envoy-1".to_string());
    opts.admin = Some(admin);
    opts
}

/// A filter configuration with the rules of a rules file's `text`, defaults otherwise.
pub(crate) fn filter_spec(text: &str, format: RulesFormat) -> FilterConfigSpec {
    let rules = parse_rules(text, format, Path::new("rules")).unwrap();
    FilterConfigSpec {
        rules,
        ..FilterConfigSpec::default()
    }
}

/// One rule with two limits.
pub(crate) fn example_rules() -> FilterConfigSpec {
    filter_spec(
        r#"[{"name":"api-per-key","match":{"path_prefix":"/api/"},"key":{"header":"x-api-key"},
             "limits":[{"requests":5,"period":"second","burst":10},{"requests":100,"period":"minute"}],
             "mode":"enforce"}]"#,
        RulesFormat::Json,
    )
}

/// Parses the YAML back the way Envoy will see it.
pub(crate) fn parse(yaml: &str) -> Value {
    serde_norway::from_str(yaml).unwrap()
}

/// The wasm filter's `config`, checking that it comes first and the router after it.
pub(crate) fn wasm_config(config: &Value) -> &Value {
    let filters = config
        .pointer(
            "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
        )
        .unwrap();
    assert_eq!(filters[0]["name"], WASM_FILTER);
    assert_eq!(filters[1]["name"], "envoy.filters.http.router");
    &filters[0]["typed_config"]["config"]
}

/// The plugin configuration the filter will parse.
pub(crate) fn embedded_plugin(config: &Value) -> String {
    wasm_config(config)["configuration"]["value"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The configuration the singleton control service will parse.
pub(crate) fn embedded_control(config: &Value) -> String {
    config["bootstrap_extensions"][0]["typed_config"]["config"]["configuration"]["value"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Checks a STATIC cluster named `name` that reaches 127.0.0.1:`port`.
pub(crate) fn assert_loopback_cluster(cluster: &Value, name: &str, port: u16) {
    assert_eq!(cluster["name"], name);
    assert_eq!(cluster["type"], "STATIC");
    assert_eq!(cluster["connect_timeout"], "1s");
    let address = cluster
        .pointer("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
        .unwrap();
    assert_eq!(address["address"], "127.0.0.1");
    assert_eq!(address["port_value"], port);
}

/// The listener's one route.
pub(crate) fn route(config: &Value) -> &Value {
    config
        .pointer("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes/0")
        .unwrap()
}

/// The plugin configuration as the filter will read it: JSON bytes, parsed and checked by
/// the core.
pub(crate) fn filter_reads(config: &Value) -> FilterConfig {
    FilterConfig::from_json(config.to_string().as_bytes()).unwrap()
}

/// The one rendered resource of `kind`.
pub(crate) fn of_kind<'a>(rendered: &'a Rendered, kind: &str) -> &'a Value {
    rendered
        .resources
        .iter()
        .find(|r| r["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}
