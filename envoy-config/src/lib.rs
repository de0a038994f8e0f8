//! `sluice envoy-config`: a complete Envoy (v3 API) bootstrap that runs the Sluice filter.
//!
//! [`build`] is pure: it validates the filter configuration and assembles the bootstrap as
//! a JSON value (so tests and tools can inspect or adjust it), and [`Bootstrap::to_yaml`]
//! writes it out. Nothing here touches the file system; the CLI resolves paths and reads
//! rules files before calling in.
//!
//! * This module: the options, the listener with the filter, the upstream, and [`build`].
//! * `admin`: with an admin API, its cluster and the control service that long-polls it
//!   (a singleton bootstrap extension, or in [`ControlMode::Worker`] a `control` section
//!   of the plugin configuration: [`plugin_configuration`]).
//! * `output`: the bootstrap as YAML, under a header that says how to run it.
//!
//! A crate of its own, apart from the admin API's server: the `sluice` command line and
//! the end-to-end tests' harness generate configs with it, and need only the core.

mod admin;
mod output;
pub mod render;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::str::FromStr;

use serde_json::{Value, json};
use sluice_core::config::{ConfigError, FilterConfig, FilterConfigSpec};
pub use sluice_core::listening::Scheme;
use sluice_core::validation::{FieldError, ValidationErrors};

pub use admin::{AdminConnection, AdminTls, AdminUrl};
use admin::{admin_cluster, control_service};
use output::header;

/// The listener that carries client traffic; also its stats prefix
/// (`listener.sluice_ingress.worker_N.downstream_cx_total`), which would otherwise be the
/// bound address and change with every port.
pub const LISTENER_NAME: &str = "sluice_ingress";
/// The HTTP connection manager's stats prefix (`http.ingress_http.*`).
pub const HTTP_STAT_PREFIX: &str = "ingress_http";
/// The cluster that receives allowed requests.
pub const UPSTREAM_CLUSTER: &str = "sluice_upstream";
/// Envoy's name for the wasm HTTP filter in `http_filters`.
pub const WASM_FILTER: &str = "envoy.filters.http.wasm";
/// Plugin name, root id and VM id. The later singleton service must use the same `vm_id`
/// to share the filter's shared data.
pub const PLUGIN_NAME: &str = "sluice";
/// The cluster through which the control service reaches the admin API.
pub const ADMIN_CLUSTER: &str = "sluice_admin";
/// Plugin name and root id of the control service: the singleton inside Envoy that
/// long-polls the admin API and publishes rulesets to the filter's shared data.
pub const CONTROL_ROOT_ID: &str = "sluice_control";
/// Envoy's usual admin address.
pub const DEFAULT_ENVOY_ADMIN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9901));
/// The body of the `direct` upstream's answer.
pub const DIRECT_RESPONSE_BODY: &str = "ok\n";
/// The Prometheus label the filter's per-rule counters (`sluice_rule.<id>.<outcome>_total`)
/// carry their rule id in.
pub const RULE_TAG: &str = "sluice_rule";
/// Envoy's tag extraction for those counters: the rule id between the prefix and the
/// outcome becomes the `sluice_rule` tag, so Prometheus sees one metric per outcome.
pub const RULE_TAG_REGEX: &str = r"^wasmcustom\.sluice_rule\.(([^.]+)\.)";

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
        }
    }
}

/// Why no bootstrap was produced.
#[derive(Debug, thiserror::Error)]
pub enum EnvoyConfigError {
    #[error("the filter path {} is not absolute", .0.display())]
    RelativeFilterPath(PathBuf),
    #[error("the filter configuration is invalid: {0}")]
    InvalidFilterConfig(ValidationErrors),
    #[error("the admin API connection is invalid: {0}")]
    InvalidControlConfig(ValidationErrors),
    #[error(
        "refusing to send the proxy token in clear text to {0}, which is not a loopback \
         address: use an https:// admin URL (with --admin-ca), or pass --insecure to accept \
         plain HTTP on a network you trust"
    )]
    PlainHttpToRemote(String),
    #[error(
        "{0}: an https:// admin URL needs --admin-ca FILE, the PEM CA certificates Envoy \
         checks the admin API's certificate against (for a publicly trusted certificate, \
         the system bundle, e.g. /etc/ssl/certs/ca-certificates.crt); without one Envoy \
         would accept any certificate"
    )]
    AdminCaMissing(String),
    #[error(
        "{0}: --admin-ca, --admin-sni and --admin-client-cert/--admin-client-key apply only \
         to an https:// admin URL"
    )]
    AdminTlsWithoutHttps(String),
    #[error("the TLS file path {} is not absolute", .0.display())]
    RelativeTlsPath(PathBuf),
    #[error(
        "the admin URLs {0} and {1} differ in scheme: replicas of one admin API are all \
         http:// or all https://"
    )]
    MixedAdminSchemes(String, String),
    #[error("cannot serialise the bootstrap: {0}")]
    Serialise(String),
}

/// A generated bootstrap: leading comment lines and the configuration itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Bootstrap {
    /// Comment lines without the `# ` marker.
    pub header: Vec<String>,
    /// The Envoy v3 bootstrap.
    pub config: Value,
}

impl Bootstrap {
    /// The HTTP filter chain of the ingress listener, e.g. to drop or add filters when
    /// comparing Envoy with and without Sluice.
    pub fn http_filters_mut(&mut self) -> Option<&mut Vec<Value>> {
        self.config
            .pointer_mut(
                "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
            )?
            .as_array_mut()
    }
}

/// Validates the options and renders the bootstrap YAML in one step.
pub fn render(options: &EnvoyConfigOptions) -> Result<String, EnvoyConfigError> {
    build(options)?.to_yaml()
}

/// Validates the options and assembles the bootstrap.
pub fn build(options: &EnvoyConfigOptions) -> Result<Bootstrap, EnvoyConfigError> {
    if !options.filter_wasm.is_absolute() {
        return Err(EnvoyConfigError::RelativeFilterPath(
            options.filter_wasm.clone(),
        ));
    }
    if let Some(admin) = &options.admin {
        admin.check_transport()?;
    }
    let plugin_json = plugin_configuration(options)?;
    // The filter and the control service must share one VM configuration: shared data
    // (where the control service publishes rulesets) is per `vm_id`, and identical
    // `vm_config`s let Envoy reuse one loaded module.
    let vm_config = json!({
        "vm_id": PLUGIN_NAME,
        "runtime": "envoy.wasm.runtime.v8",
        "code": { "local": { "filename": options.filter_wasm.to_string_lossy() } },
    });

    let wasm_filter = json!({
        "name": WASM_FILTER,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": PLUGIN_NAME,
                "root_id": PLUGIN_NAME,
                "vm_config": vm_config.clone(),
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": plugin_json,
                },
                "failure_policy": "FAIL_OPEN",
            },
        },
    });
    let router = json!({
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        },
    });

    let mut clusters = Vec::new();
    let route = match options.upstream {
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
    };

    let listener = json!({
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
                    "http_filters": [wasm_filter, router],
                },
            }],
        }],
    });

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

    let mut static_resources = json!({ "listeners": [listener] });
    if !clusters.is_empty() {
        static_resources["clusters"] = Value::Array(clusters);
    }
    let mut config = json!({
        "admin": { "address": socket_address(options.envoy_admin) },
        "static_resources": static_resources,
        "stats_config": { "stats_tags": [{ "tag_name": RULE_TAG, "regex": RULE_TAG_REGEX }] },
    });
    if let Some(control) = control {
        config["bootstrap_extensions"] = json!([control]);
    }

    Ok(Bootstrap {
        header: header(options),
        config,
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

/// The filter's plugin configuration, as the `configuration` string of the
/// `envoy.filters.http.wasm` entry: validated as the filter will validate it. In
/// [`ControlMode::Worker`] with an admin API it carries the `control` section (the admin
/// API's cluster, authority, proxy token and intervals), so it is all a control plane that
/// loads Sluice as a plain HTTP filter (Istio's `WasmPlugin.pluginConfig`, Envoy Gateway's
/// `EnvoyExtensionPolicy`) needs besides a route to the admin API. A
/// [`PluginConfig::Raw`] is returned verbatim.
pub fn plugin_configuration(options: &EnvoyConfigOptions) -> Result<String, EnvoyConfigError> {
    match (&options.plugin, &options.admin, options.control_mode) {
        (PluginConfig::Spec(spec), Some(admin), ControlMode::Worker) => {
            let spec = FilterConfigSpec {
                control: Some(admin.control_spec()?),
                ..spec.clone()
            };
            plugin_json(&PluginConfig::Spec(spec))
        }
        (plugin, _, _) => plugin_json(plugin),
    }
}

fn plugin_json(plugin: &PluginConfig) -> Result<String, EnvoyConfigError> {
    match plugin {
        PluginConfig::Raw(raw) => Ok(raw.clone()),
        PluginConfig::Spec(spec) => {
            FilterConfig::try_from(spec.clone())
                .map_err(|e| EnvoyConfigError::InvalidFilterConfig(field_errors(e)))?;
            // Pretty-printed, it becomes a readable block in the YAML; the filter does not mind.
            serde_json::to_string_pretty(spec)
                .map_err(|e| EnvoyConfigError::Serialise(e.to_string()))
        }
    }
}

/// A configuration refused by the core, as field errors: shape errors (only parsing makes
/// them) become one field error, so every refusal names where it is.
fn field_errors(error: ConfigError) -> ValidationErrors {
    match error {
        ConfigError::Invalid(errors) => errors,
        ConfigError::Shape { path, message } => ValidationErrors(vec![FieldError {
            field: path,
            message,
        }]),
    }
}

fn socket_address(addr: SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sluice_core::config::ControlConfigSpec;
    use sluice_core::spec::FailureMode;
    use sluice_rules_file::{RulesFormat, parse_rules};

    use super::*;
    use crate::output::FAIL_OPEN_COMMENT;

    const WASM: &str = "/opt/sluice/sluice_filter.wasm";

    fn options(upstream: Upstream) -> EnvoyConfigOptions {
        EnvoyConfigOptions::new("127.0.0.1:10000".parse().unwrap(), upstream, WASM)
    }

    fn example_rules() -> FilterConfigSpec {
        let rules = parse_rules(
            r#"[{"name":"api-per-key","match":{"path_prefix":"/api/"},"key":{"header":"x-api-key"},
                 "limits":[{"requests":5,"period":"second","burst":10},{"requests":100,"period":"minute"}],
                 "mode":"enforce"}]"#,
            RulesFormat::Json,
            Path::new("rules.json"),
        )
        .unwrap();
        FilterConfigSpec {
            rules,
            ..FilterConfigSpec::default()
        }
    }

    /// Parses the YAML back the way Envoy will see it.
    fn parse(yaml: &str) -> Value {
        serde_norway::from_str(yaml).unwrap()
    }

    fn wasm_config(config: &Value) -> &Value {
        let filters = config
            .pointer(
                "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
            )
            .unwrap();
        assert_eq!(filters[0]["name"], WASM_FILTER);
        assert_eq!(filters[1]["name"], "envoy.filters.http.router");
        &filters[0]["typed_config"]["config"]
    }

    #[test]
    fn rendered_yaml_parses_back_to_the_built_config() {
        let mut opts = options(Upstream::Cluster("127.0.0.1:8081".parse().unwrap()));
        opts.plugin = PluginConfig::Spec(example_rules());
        let bootstrap = build(&opts).unwrap();
        let yaml = bootstrap.to_yaml().unwrap();
        assert_eq!(parse(&yaml), bootstrap.config);
    }

    #[test]
    fn the_plugin_configuration_is_embedded_as_a_json_string() {
        let mut opts = options(Upstream::Direct);
        let spec = FilterConfigSpec {
            slots: 1024,
            failure_mode: FailureMode::Closed,
            ..example_rules()
        };
        opts.plugin = PluginConfig::Spec(spec.clone());
        let config = parse(&render(&opts).unwrap());
        let wasm = wasm_config(&config);
        assert_eq!(
            wasm["configuration"]["@type"],
            "type.googleapis.com/google.protobuf.StringValue"
        );
        let embedded = wasm["configuration"]["value"].as_str().unwrap();
        let round_trip: FilterConfigSpec = serde_json::from_str(embedded).unwrap();
        assert_eq!(round_trip, spec);
        // The filter parses exactly these bytes at start-up.
        let parsed = FilterConfig::from_json(embedded.as_bytes()).unwrap();
        assert_eq!(parsed.table.slots(), 1024);
        assert_eq!(wasm["failure_policy"], "FAIL_OPEN");
        assert_eq!(wasm["root_id"], PLUGIN_NAME);
        assert_eq!(wasm["vm_config"]["vm_id"], PLUGIN_NAME);
        assert_eq!(wasm["vm_config"]["runtime"], "envoy.wasm.runtime.v8");
    }

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
    fn the_filter_is_loaded_from_the_absolute_path() {
        let config = parse(&render(&options(Upstream::Direct)).unwrap());
        assert_eq!(
            wasm_config(&config)["vm_config"]["code"]["local"]["filename"],
            WASM
        );
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
        let cluster = &config["static_resources"]["clusters"][0];
        assert_eq!(cluster["name"], UPSTREAM_CLUSTER);
        assert_eq!(cluster["type"], "STATIC");
        assert_eq!(cluster["connect_timeout"], "1s");
        let endpoint = cluster
            .pointer("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
            .unwrap();
        assert_eq!(endpoint["address"], "127.0.0.1");
        assert_eq!(endpoint["port_value"], 8081);
        let route = config
            .pointer("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes/0")
            .unwrap();
        assert_eq!(route["route"]["cluster"], UPSTREAM_CLUSTER);
        assert!(route.get("direct_response").is_none());
    }

    #[test]
    fn a_direct_upstream_answers_from_envoy_without_a_cluster() {
        let config = parse(&render(&options(Upstream::Direct)).unwrap());
        assert!(config["static_resources"].get("clusters").is_none());
        let route = config
            .pointer("/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/route_config/virtual_hosts/0/routes/0")
            .unwrap();
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

    #[test]
    fn the_header_gives_the_run_command() {
        let mut opts = options(Upstream::Direct);
        opts.concurrency = NonZeroU32::new(4);
        opts.config_path = Some(PathBuf::from("/tmp/my envoy.yaml"));
        let yaml = render(&opts).unwrap();
        assert!(yaml.starts_with("# Envoy bootstrap for Sluice"), "{yaml}");
        assert!(
            yaml.contains("\n#   envoy -c '/tmp/my envoy.yaml' --concurrency 4\n"),
            "{yaml}"
        );

        let yaml = render(&options(Upstream::Direct)).unwrap();
        assert!(yaml.contains("\n#   envoy -c envoy.yaml\n"), "{yaml}");
    }

    #[test]
    fn fail_open_is_explained_where_it_is_set() {
        let yaml = render(&options(Upstream::Direct)).unwrap();
        let lines: Vec<&str> = yaml.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim() == "failure_policy: FAIL_OPEN")
            .unwrap();
        assert!(lines[at - 1].trim_start().starts_with('#'), "{yaml}");
        assert!(
            lines[at - FAIL_OPEN_COMMENT.len()].contains("FAIL_OPEN"),
            "{yaml}"
        );
        let indent = |l: &str| l.len() - l.trim_start().len();
        assert_eq!(indent(lines[at - 1]), indent(lines[at]));
    }

    #[test]
    fn names_lead_each_object() {
        let yaml = render(&options(Upstream::Cluster(
            "127.0.0.1:8081".parse().unwrap(),
        )))
        .unwrap();
        assert!(yaml.contains("\n  - name: sluice_ingress\n"), "{yaml}");
        assert!(yaml.contains("\n  - name: sluice_upstream\n"), "{yaml}");
    }

    #[test]
    fn invalid_rules_are_refused_with_every_field_named() {
        let rules = parse_rules(
            "
- name: a
  key: global
  limits: [{requests: 0, period: second}]
- name: b
  key: global
  limits: [{requests: 1, period: 0}]
- name: c
  key: global
  limits: [{requests: 1, period: minute}]
- name: c
  key: {header: x-api-key}
  limits: [{requests: 1, period: minute}]
",
            RulesFormat::Yaml,
            Path::new("bad.yaml"),
        )
        .unwrap();
        let mut opts = options(Upstream::Direct);
        opts.plugin = PluginConfig::Spec(FilterConfigSpec {
            rules,
            slots: 3,
            ..FilterConfigSpec::default()
        });
        let Err(EnvoyConfigError::InvalidFilterConfig(errors)) = render(&opts) else {
            panic!("invalid rules were accepted");
        };
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "slots",
                "rules[0].limits[0].requests",
                "rules[1].limits[0].period",
                "rules[3].name",
                "rules[3].id"
            ]
        );
    }

    #[test]
    fn a_raw_plugin_configuration_is_embedded_unchecked() {
        let mut opts = options(Upstream::Direct);
        opts.plugin = PluginConfig::Raw("{not json".to_string());
        let config = parse(&render(&opts).unwrap());
        assert_eq!(wasm_config(&config)["configuration"]["value"], "{not json");
    }

    #[test]
    fn the_filter_chain_can_be_edited() {
        let mut bootstrap = build(&options(Upstream::Direct)).unwrap();
        bootstrap
            .http_filters_mut()
            .unwrap()
            .retain(|f| f["name"] != WASM_FILTER);
        let config = parse(&bootstrap.to_yaml().unwrap());
        let filters = config
            .pointer(
                "/static_resources/listeners/0/filter_chains/0/filters/0/typed_config/http_filters",
            )
            .unwrap();
        assert_eq!(filters.as_array().unwrap().len(), 1);
    }

    #[test]
    fn replicas_are_endpoints_of_one_health_checked_cluster() {
        let mut opts = with_admin("http://127.0.0.1:8080");
        let admin = opts.admin.as_mut().unwrap();
        admin.replicas = vec![
            "http://127.0.0.1:8090".parse().unwrap(),
            "http://localhost:8091".parse().unwrap(),
        ];
        let config = build(&opts).unwrap().config;
        let clusters = config["static_resources"]["clusters"].as_array().unwrap();
        let cluster = clusters
            .iter()
            .find(|c| c["name"] == ADMIN_CLUSTER)
            .unwrap();
        // A name among them makes it STRICT_DNS (an address resolves to itself).
        assert_eq!(cluster["type"], "STRICT_DNS");
        let endpoints = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
            .as_array()
            .unwrap();
        let ports: Vec<u64> = endpoints
            .iter()
            .map(|e| {
                e["endpoint"]["address"]["socket_address"]["port_value"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ports, [8080, 8090, 8091]);
        assert_eq!(
            cluster["health_checks"][0]["http_health_check"]["path"],
            "/readyz"
        );
        assert_eq!(
            cluster["outlier_detection"]["consecutive_local_origin_failure"],
            1
        );
        // One admin API needs neither.
        let single = build(&with_admin("http://127.0.0.1:8080")).unwrap().config;
        let single = single["static_resources"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == ADMIN_CLUSTER)
            .unwrap()
            .clone();
        assert!(single.get("health_checks").is_none());
        assert_eq!(single["type"], "STATIC");
    }

    #[test]
    fn every_replica_is_held_to_the_transport_rules() {
        let with_replica = |first: &str, replica: &str, insecure: bool| {
            let mut opts = with_admin(first);
            let admin = opts.admin.as_mut().unwrap();
            admin.replicas = vec![replica.parse().unwrap()];
            admin.insecure = insecure;
            build(&opts)
        };
        assert!(matches!(
            with_replica("http://127.0.0.1:8080", "http://10.0.0.2:8080", false),
            Err(EnvoyConfigError::PlainHttpToRemote(url)) if url == "http://10.0.0.2:8080"
        ));
        assert!(with_replica("http://127.0.0.1:8080", "http://10.0.0.2:8080", true).is_ok());
        assert!(matches!(
            with_replica("http://127.0.0.1:8080", "https://127.0.0.1:8443", false),
            Err(EnvoyConfigError::MixedAdminSchemes(..))
        ));
    }

    fn with_admin(url: &str) -> EnvoyConfigOptions {
        let mut opts = options(Upstream::Cluster("127.0.0.1:8081".parse().unwrap()));
        let mut admin = AdminConnection::new(url.parse().unwrap(), "slc_proxy_token");
        admin.proxy_id = Some("envoy-1".to_string());
        opts.admin = Some(admin);
        opts
    }

    #[test]
    fn an_admin_url_adds_the_control_service_and_its_cluster() {
        let config = parse(&render(&with_admin("http://127.0.0.1:8080")).unwrap());
        let clusters = config["static_resources"]["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2);
        let admin = &clusters[1];
        assert_eq!(admin["name"], ADMIN_CLUSTER);
        assert_eq!(admin["type"], "STATIC");
        assert_eq!(admin["connect_timeout"], "1s");
        let address = admin
            .pointer("/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address")
            .unwrap();
        assert_eq!(address["address"], "127.0.0.1");
        assert_eq!(address["port_value"], 8080);

        let extension = &config["bootstrap_extensions"][0];
        assert_eq!(extension["name"], "envoy.bootstrap.wasm");
        let service = &extension["typed_config"];
        assert_eq!(
            service["@type"],
            "type.googleapis.com/envoy.extensions.wasm.v3.WasmService"
        );
        assert_eq!(service["singleton"], true);
        let control = &service["config"];
        assert_eq!(control["name"], CONTROL_ROOT_ID);
        assert_eq!(control["root_id"], CONTROL_ROOT_ID);
        // The same VM as the filter: same vm_id, runtime and module.
        assert_eq!(control["vm_config"], wasm_config(&config)["vm_config"]);
        assert_eq!(
            control["configuration"]["@type"],
            "type.googleapis.com/google.protobuf.StringValue"
        );
        let embedded = control["configuration"]["value"].as_str().unwrap();
        let spec = ControlConfigSpec::from_json(embedded.as_bytes()).unwrap();
        assert_eq!(spec.admin_cluster, ADMIN_CLUSTER);
        assert_eq!(spec.admin_authority, "127.0.0.1:8080");
        assert_eq!(spec.token, "slc_proxy_token");
        assert_eq!(spec.proxy_id.as_deref(), Some("envoy-1"));
        assert_eq!(spec.poll_timeout_seconds, 30);
        assert_eq!(spec.sync_interval_ms, 250, "the control service's default");

        let yaml = render(&with_admin("http://127.0.0.1:8080")).unwrap();
        assert!(yaml.contains("# Rules: long-polled from the admin API at http://127.0.0.1:8080"));
        // Without --admin-url there is no control service.
        assert!(
            parse(&render(&options(Upstream::Direct)).unwrap())
                .get("bootstrap_extensions")
                .is_none()
        );
    }

    #[test]
    fn worker_mode_puts_the_control_section_in_the_plugin_configuration_and_no_singleton() {
        let mut opts = with_admin("http://127.0.0.1:8080");
        opts.plugin = PluginConfig::Spec(example_rules());
        opts.control_mode = ControlMode::Worker;
        let yaml = render(&opts).unwrap();
        let config = parse(&yaml);
        assert!(
            config.get("bootstrap_extensions").is_none(),
            "no bootstrap extension: {yaml}"
        );
        // The admin API's cluster stays, as a control plane would provide it.
        let clusters = config["static_resources"]["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2);
        assert_eq!(clusters[1]["name"], ADMIN_CLUSTER);
        // The filter parses exactly these bytes: rules and the control section.
        let embedded = wasm_config(&config)["configuration"]["value"]
            .as_str()
            .unwrap()
            .to_string();
        let parsed = FilterConfig::from_json(embedded.as_bytes()).unwrap();
        assert_eq!(parsed.ruleset.rules().len(), 1);
        let control = parsed.control.unwrap();
        assert_eq!(control.admin_cluster, ADMIN_CLUSTER);
        assert_eq!(control.admin_authority, "127.0.0.1:8080");
        assert_eq!(control.token, "slc_proxy_token");
        assert_eq!(control.proxy_id.as_deref(), Some("envoy-1"));
        assert_eq!(plugin_configuration(&opts).unwrap(), embedded);
        assert!(
            yaml.contains("# Control service: run by one worker elected"),
            "{yaml}"
        );

        // The default is today's singleton, with no control section in the filter's.
        opts.control_mode = ControlMode::default();
        let config = parse(&render(&opts).unwrap());
        assert_eq!(
            config["bootstrap_extensions"][0]["name"],
            "envoy.bootstrap.wasm"
        );
        let embedded = wasm_config(&config)["configuration"]["value"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            FilterConfig::from_json(embedded.as_bytes())
                .unwrap()
                .control
                .is_none()
        );
    }

    #[test]
    fn worker_mode_names_the_platforms_cluster_and_checks_the_connection() {
        let istio = "outbound|8080||sluice-admin.sluice.svc.cluster.local";
        let mut opts = with_admin("http://127.0.0.1:8080");
        opts.control_mode = ControlMode::Worker;
        opts.admin.as_mut().unwrap().cluster = istio.to_string();
        let json = plugin_configuration(&opts).unwrap();
        let spec: FilterConfigSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(spec.control.unwrap().admin_cluster, istio);
        let config = build(&opts).unwrap().config;
        assert_eq!(config["static_resources"]["clusters"][1]["name"], istio);

        // What the control service would refuse is refused here.
        opts.admin.as_mut().unwrap().token.clear();
        let Err(EnvoyConfigError::InvalidControlConfig(errors)) = plugin_configuration(&opts)
        else {
            panic!("an empty token was accepted");
        };
        assert_eq!(errors.0[0].field, "token");
        // And so are the transport rules.
        let mut remote = with_admin("http://10.0.0.9:8080");
        remote.control_mode = ControlMode::Worker;
        assert!(matches!(
            build(&remote),
            Err(EnvoyConfigError::PlainHttpToRemote(_))
        ));
        // Without an admin API worker mode changes nothing; a raw configuration is the
        // caller's own.
        let mut plain = options(Upstream::Direct);
        plain.control_mode = ControlMode::Worker;
        assert!(!plugin_configuration(&plain).unwrap().contains("control"));
        let mut raw = with_admin("http://127.0.0.1:8080");
        raw.control_mode = ControlMode::Worker;
        raw.plugin = PluginConfig::Raw("{}".to_string());
        assert_eq!(plugin_configuration(&raw).unwrap(), "{}");
    }

    #[test]
    fn a_named_admin_host_gets_a_dns_cluster() {
        // Plain HTTP to a remote host needs --insecure (see the clear-text test below).
        let mut opts = with_admin("http://admin.internal:9000/");
        if let Some(admin) = opts.admin.as_mut() {
            admin.insecure = true;
        }
        let config = parse(&render(&opts).unwrap());
        let admin = &config["static_resources"]["clusters"][1];
        assert_eq!(admin["type"], "STRICT_DNS");
        let control = config["bootstrap_extensions"][0]["typed_config"]["config"]["configuration"]
            ["value"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            control.contains(r#""admin_authority":"admin.internal:9000""#),
            "{control}"
        );
    }

    #[test]
    fn admin_urls() {
        let url = |s: &str| s.parse::<AdminUrl>();
        assert_eq!(
            url("http://127.0.0.1:8080").unwrap(),
            AdminUrl {
                scheme: Scheme::Http,
                host: "127.0.0.1".into(),
                port: 8080
            }
        );
        assert_eq!(url("http://[::1]:81/").unwrap().authority(), "[::1]:81");
        assert_eq!(url("http://admin").unwrap().port, 80);
        let https = url("https://admin.internal").unwrap();
        assert_eq!((https.scheme, https.port), (Scheme::Https, 443));
        assert_eq!(https.url(), "https://admin.internal:443");
        for (loopback, yes) in [
            ("http://127.0.0.1:1", true),
            ("http://127.8.9.10:1", true),
            ("http://[::1]:1", true),
            ("http://LocalHost:1", true),
            ("http://10.0.0.1:1", false),
            ("http://[::2]:1", false),
            ("http://admin.internal:1", false),
            ("http://localhost.example:1", false),
        ] {
            assert_eq!(url(loopback).unwrap().is_loopback(), yes, "{loopback}");
        }
        for bad in [
            "127.0.0.1:8080",
            "ftp://a:1",
            "https://",
            "http://",
            "http://a:x",
            "http://a:1/path",
        ] {
            assert!(url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_sync_interval_is_passed_to_the_control_service_and_checked() {
        let control_spec = |ms: u32| {
            let mut opts = with_admin("http://127.0.0.1:8080");
            if let Some(admin) = opts.admin.as_mut() {
                admin.sync_interval_ms = Some(ms);
            }
            render(&opts).map(|yaml| {
                let config = parse(&yaml);
                let value = config["bootstrap_extensions"][0]["typed_config"]["config"]
                    ["configuration"]["value"]
                    .as_str()
                    .unwrap()
                    .to_string();
                ControlConfigSpec::from_json(value.as_bytes()).unwrap()
            })
        };
        assert_eq!(control_spec(500).unwrap().sync_interval_ms, 500);
        let Err(EnvoyConfigError::InvalidControlConfig(errors)) = control_spec(10) else {
            panic!("accepted a 10 ms interval");
        };
        assert_eq!(errors.0[0].field, "sync_interval_ms");
    }

    #[test]
    fn an_empty_proxy_token_is_refused() {
        let mut opts = with_admin("http://127.0.0.1:8080");
        if let Some(admin) = opts.admin.as_mut() {
            admin.token.clear();
        }
        let Err(EnvoyConfigError::InvalidControlConfig(errors)) = render(&opts) else {
            panic!("accepted");
        };
        assert_eq!(errors.0[0].field, "token");
    }

    fn with_tls_admin(url: &str, tls: AdminTls) -> Result<Value, EnvoyConfigError> {
        let mut opts = with_admin(url);
        if let Some(admin) = opts.admin.as_mut() {
            admin.tls = Some(tls);
        }
        render(&opts).map(|yaml| parse(&yaml))
    }

    fn tls_context(config: &Value) -> &Value {
        let cluster = &config["static_resources"]["clusters"][1];
        assert_eq!(cluster["name"], ADMIN_CLUSTER);
        let socket = &cluster["transport_socket"];
        assert_eq!(socket["name"], "envoy.transport_sockets.tls");
        let context = &socket["typed_config"];
        assert_eq!(
            context["@type"],
            "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
        );
        context
    }

    #[test]
    fn an_https_admin_url_gets_an_upstream_tls_context_that_checks_the_name() {
        // A DNS name: sent as SNI and required as a DNS SAN.
        let config = with_tls_admin(
            "https://admin.internal:8443",
            AdminTls::new("/etc/sluice/ca.pem"),
        )
        .unwrap();
        let context = tls_context(&config);
        assert_eq!(context["sni"], "admin.internal");
        let validation = &context["common_tls_context"]["validation_context"];
        assert_eq!(validation["trusted_ca"]["filename"], "/etc/sluice/ca.pem");
        assert_eq!(
            validation["match_typed_subject_alt_names"],
            json!([{"san_type": "DNS", "matcher": {"exact": "admin.internal"}}])
        );
        assert!(
            context["common_tls_context"]
                .get("tls_certificates")
                .is_none()
        );
        let yaml = render(&{
            let mut opts = with_admin("https://admin.internal:8443");
            if let Some(admin) = opts.admin.as_mut() {
                admin.tls = Some(AdminTls::new("/etc/sluice/ca.pem"));
            }
            opts
        })
        .unwrap();
        assert!(
            yaml.contains("# Rules: long-polled from the admin API at https://admin.internal:8443"),
            "{yaml}"
        );
        assert!(
            yaml.contains("checked against /etc/sluice/ca.pem"),
            "{yaml}"
        );

        // An IP address: no SNI (it carries names only), an IP SAN.
        let config = with_tls_admin("https://127.0.0.1:8443", AdminTls::new("/ca.pem")).unwrap();
        let context = tls_context(&config);
        assert!(context.get("sni").is_none(), "{context}");
        assert_eq!(
            context["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"],
            json!([{"san_type": "IP_ADDRESS", "matcher": {"exact": "127.0.0.1"}}])
        );

        // --admin-sni names the certificate whatever the address.
        let mut tls = AdminTls::new("/ca.pem");
        tls.sni = Some("sluice.example".to_string());
        tls.client_cert = Some(("/client.pem".into(), "/client.key".into()));
        let config = with_tls_admin("https://127.0.0.1:8443", tls).unwrap();
        let context = tls_context(&config);
        assert_eq!(context["sni"], "sluice.example");
        assert_eq!(
            context["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"],
            json!([{"san_type": "DNS", "matcher": {"exact": "sluice.example"}}])
        );
        assert_eq!(
            context["common_tls_context"]["tls_certificates"],
            json!([{"certificate_chain": {"filename": "/client.pem"}, "private_key": {"filename": "/client.key"}}])
        );
        // The authority the control service sends is the URL's, whatever the SNI.
        let control = config["bootstrap_extensions"][0]["typed_config"]["config"]["configuration"]
            ["value"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            control.contains(r#""admin_authority":"127.0.0.1:8443""#),
            "{control}"
        );
    }

    #[test]
    fn plain_http_admin_urls_get_no_tls_context() {
        let config = parse(&render(&with_admin("http://127.0.0.1:8080")).unwrap());
        assert!(
            config["static_resources"]["clusters"][1]
                .get("transport_socket")
                .is_none()
        );
    }

    #[test]
    fn the_proxy_token_is_not_sent_in_clear_text_or_unchecked() {
        for remote in [
            "http://10.1.2.3:8080",
            "http://admin.internal:8080",
            "http://[2001:db8::1]:80",
        ] {
            let Err(err) = render(&with_admin(remote)) else {
                panic!("{remote} was accepted without --insecure");
            };
            assert!(
                matches!(err, EnvoyConfigError::PlainHttpToRemote(_)),
                "{err}"
            );
            assert!(err.to_string().contains("--insecure"), "{err}");
            let mut opts = with_admin(remote);
            if let Some(admin) = opts.admin.as_mut() {
                admin.insecure = true;
            }
            let yaml = render(&opts).unwrap();
            assert!(
                yaml.contains("# WARNING: plain HTTP (--insecure)"),
                "{yaml}"
            );
        }
        for local in [
            "http://127.0.0.1:8080",
            "http://localhost:8080",
            "http://[::1]:8080",
        ] {
            let yaml = render(&with_admin(local)).unwrap();
            assert!(!yaml.contains("WARNING"), "{yaml}");
        }

        let Err(err) = render(&with_admin("https://admin.internal")) else {
            panic!("https without a CA was accepted");
        };
        assert!(matches!(err, EnvoyConfigError::AdminCaMissing(_)), "{err}");
        assert!(err.to_string().contains("--admin-ca"), "{err}");

        let Err(err) = with_tls_admin("http://127.0.0.1:8080", AdminTls::new("/ca.pem")) else {
            panic!("TLS settings for a plain URL were accepted");
        };
        assert!(
            matches!(err, EnvoyConfigError::AdminTlsWithoutHttps(_)),
            "{err}"
        );

        let Err(err) = with_tls_admin("https://127.0.0.1:8443", AdminTls::new("ca.pem")) else {
            panic!("a relative CA path was accepted");
        };
        assert!(matches!(err, EnvoyConfigError::RelativeTlsPath(_)), "{err}");
    }

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
