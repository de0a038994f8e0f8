//! `sluice render`: what users apply on their platforms, as YAML.
//!
//! * [`istio`]: a `WasmPlugin` (`extensions.istio.io/v1alpha1`) whose plugin configuration
//!   carries the `control` section, so the workers elect one of themselves to follow the
//!   admin API through Istio's own outbound cluster for it; for an admin API outside the
//!   mesh, the `ServiceEntry` (and, over https, the `DestinationRule`) that makes that
//!   cluster exist.
//! * [`envoy_gateway`]: an `EnvoyExtensionPolicy` (`gateway.envoyproxy.io/v1alpha1`) with
//!   the filter as a `wasm` entry, and an `EnvoyPatchPolicy` that adds the admin API's
//!   cluster, since Envoy Gateway names no cluster a wasm module could call otherwise.
//! * [`envoy`]: the `http_filters` entry and the admin cluster, for users who write their
//!   own Envoy configuration; both are what [`crate::build`] puts in a full bootstrap.
//! * [`kubernetes`]: the admin API's own manifests (Deployment, Service, storage), the
//!   kustomize base committed in `deploy/kubernetes/`.
//!
//! Pure, like the rest of the crate: the CLI reads rules, token and module files and
//! passes their contents in. Secrets are never invented: the proxy token is the caller's
//! or [`TOKEN_PLACEHOLDER`], and the admin API's manifests only name the Secrets the
//! operator creates.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde_json::{Map, Value, json};
use sluice_core::config::{ControlConfigSpec, FilterConfig, FilterConfigSpec};
use sluice_core::validation::ValidationErrors;

use crate::admin::admin_cluster;
use crate::error::field_errors;
use crate::{
    ADMIN_CLUSTER, AdminConnection, AdminUrl, Bootstrap, EnvoyConfigError, EnvoyConfigOptions,
    PLUGIN_NAME, PluginConfig, Scheme, Upstream, build,
};

/// Stands in for the proxy token when none is given: `envsubst` (or any template step)
/// replaces it with the real one before the resources are applied.
pub const TOKEN_PLACEHOLDER: &str = "${SLUICE_PROXY_TOKEN}";
/// The admin API's Service, Deployment and ServiceAccount name.
pub const ADMIN_SERVICE: &str = "sluice-admin";
/// The namespace the admin API runs in by default.
pub const ADMIN_NAMESPACE: &str = "sluice";
/// The port the admin API listens on (and its Service exposes), named [`ADMIN_PORT_NAME`].
pub const ADMIN_PORT: u16 = 8080;
/// The name of that port: Istio reads the protocol from a `http` prefix, and the
/// ServiceMonitor scrapes it by name.
pub const ADMIN_PORT_NAME: &str = "http";
/// The Secret holding the bootstrap admin token (key [`SECRET_KEY_TOKEN`]).
pub const ADMIN_TOKEN_SECRET: &str = "sluice-admin-token";
pub const SECRET_KEY_TOKEN: &str = "token";
/// The Secret holding the PostgreSQL URL (key [`SECRET_KEY_URL`]).
pub const DATABASE_SECRET: &str = "sluice-database";
/// The Secret holding the Redis URL for global buckets shared by replicas.
pub const REDIS_SECRET: &str = "sluice-redis";
pub const SECRET_KEY_URL: &str = "url";
/// Where the SQLite database lives in the container: the one writable volume.
pub const DATA_DIR: &str = "/var/lib/sluice";
/// The unprivileged user and group the admin API runs as (the usual "nonroot" id).
pub const RUN_AS: u64 = 65532;

/// A registry on the machine that pushes the images (`docker-registry`, a kind or k3d
/// cluster's registry): the documented default until an image is pushed elsewhere.
const DEFAULT_REGISTRY: &str = "localhost:5000/sluice";

/// The default filter image, `oci://localhost:5000/sluice/sluice-filter:VERSION`.
pub fn default_filter_image() -> String {
    format!(
        "oci://{DEFAULT_REGISTRY}/sluice-filter:{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// The default admin API image, `localhost:5000/sluice/sluice:VERSION`.
pub fn default_admin_image() -> String {
    format!("{DEFAULT_REGISTRY}/sluice:{}", env!("CARGO_PKG_VERSION"))
}

/// Why nothing was rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Envoy(#[from] EnvoyConfigError),
    #[error("the filter configuration is invalid: {0}")]
    InvalidFilterConfig(ValidationErrors),
    #[error("{0}: `{1}` is not a SHA-256 digest (64 lowercase hex digits)")]
    Sha256(&'static str, String),
    #[error("{0}: `{1}` is not a Kubernetes name (lowercase letters, digits and '-', at most 63)")]
    Name(&'static str, String),
    #[error("{0}")]
    Conflict(String),
    #[error("cannot serialise the resources: {0}")]
    Serialise(String),
}

/// The admin API as a Kubernetes Service, as seen from inside the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminService {
    pub name: String,
    pub namespace: String,
    pub port: u16,
    /// The cluster's DNS domain (`cluster.local` unless the cluster was set up otherwise).
    pub cluster_domain: String,
}

impl Default for AdminService {
    fn default() -> Self {
        AdminService {
            name: ADMIN_SERVICE.to_string(),
            namespace: ADMIN_NAMESPACE.to_string(),
            port: ADMIN_PORT,
            cluster_domain: "cluster.local".to_string(),
        }
    }
}

impl AdminService {
    /// `NAME.NAMESPACE.svc.DOMAIN`.
    pub fn host(&self) -> String {
        format!(
            "{}.{}.svc.{}",
            self.name, self.namespace, self.cluster_domain
        )
    }

    /// `http://NAME.NAMESPACE.svc.DOMAIN:PORT`.
    pub fn url(&self) -> AdminUrl {
        AdminUrl {
            scheme: Scheme::Http,
            host: self.host(),
            port: self.port,
        }
    }

    fn check(&self) -> Result<(), RenderError> {
        check_name("admin service name", &self.name)?;
        check_name("admin service namespace", &self.namespace)
    }
}

/// The proxy token (a `proxy`-role API token) embedded in the plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ProxyToken {
    /// [`TOKEN_PLACEHOLDER`], to be substituted before applying.
    #[default]
    Placeholder,
    /// The real token, from a file the operator named.
    Given(String),
}

impl ProxyToken {
    fn as_str(&self) -> &str {
        match self {
            ProxyToken::Placeholder => TOKEN_PLACEHOLDER,
            ProxyToken::Given(token) => token,
        }
    }

    fn header(&self) -> Option<String> {
        match self {
            ProxyToken::Placeholder => Some(format!(
                "The proxy token is the placeholder {TOKEN_PLACEHOLDER}: substitute a token of \
                 the proxy role before applying, e.g. `SLUICE_PROXY_TOKEN=$(cat proxy-token) \
                 envsubst '$SLUICE_PROXY_TOKEN' < FILE | kubectl apply -f -`, or render with \
                 --proxy-token-file."
            )),
            ProxyToken::Given(_) => Some(
                "This file contains a proxy token (control.token): treat it as a secret."
                    .to_string(),
            ),
        }
    }
}

/// How the elected worker follows the admin API, apart from where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Follow {
    pub token: ProxyToken,
    /// How each proxy names itself; by default Envoy's node id (one per pod under Istio
    /// and Envoy Gateway).
    pub proxy_id: Option<String>,
    /// How often fleet-wide buckets are synced; `None` for the control service's default.
    pub sync_interval_ms: Option<u32>,
}

impl Default for Follow {
    fn default() -> Self {
        Follow {
            token: ProxyToken::Placeholder,
            proxy_id: None,
            sync_interval_ms: None,
        }
    }
}

/// The plugin configuration with its `control` section naming `cluster` and `authority`,
/// checked as the filter will check it, as JSON.
fn plugin_config(
    filter: &FilterConfigSpec,
    follow: &Follow,
    cluster: &str,
    authority: &str,
) -> Result<(FilterConfigSpec, Value), RenderError> {
    let mut control = ControlConfigSpec::new(cluster, authority, follow.token.as_str());
    control.proxy_id = follow.proxy_id.clone();
    if let Some(ms) = follow.sync_interval_ms {
        control.sync_interval_ms = ms;
    }
    let control = control.checked().map_err(|e| {
        let mut errors = field_errors(e);
        for error in &mut errors.0 {
            error.field = format!("control.{}", error.field);
        }
        RenderError::InvalidFilterConfig(errors)
    })?;
    let spec = FilterConfigSpec {
        control: Some(control),
        ..filter.clone()
    };
    FilterConfig::try_from(spec.clone())
        .map_err(|e| RenderError::InvalidFilterConfig(field_errors(e)))?;
    let value = serde_json::to_value(&spec).map_err(|e| RenderError::Serialise(e.to_string()))?;
    Ok((spec, value))
}

/// A policy's target (`--target-ref KIND/NAME`), its API group known from its kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetRef {
    pub group: &'static str,
    pub kind: String,
    pub name: String,
}

const GATEWAY_API: &str = "gateway.networking.k8s.io";

impl TargetRef {
    pub fn gateway(name: &str) -> TargetRef {
        TargetRef {
            group: GATEWAY_API,
            kind: "Gateway".to_string(),
            name: name.to_string(),
        }
    }

    fn to_json(&self) -> Value {
        json!({ "group": self.group, "kind": self.kind, "name": self.name })
    }
}

impl FromStr for TargetRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, name) = s
            .split_once('/')
            .filter(|(_, name)| is_name(name))
            .ok_or_else(|| format!("`{s}` is not KIND/NAME, e.g. Gateway/eg"))?;
        let group = match kind {
            "Gateway" | "GatewayClass" | "HTTPRoute" | "GRPCRoute" => GATEWAY_API,
            "Service" => "",
            "ServiceEntry" => "networking.istio.io",
            _ => {
                return Err(format!(
                    "`{kind}` is not a kind Sluice can target: Gateway, GatewayClass, HTTPRoute, \
                     GRPCRoute, Service or ServiceEntry"
                ));
            }
        };
        Ok(TargetRef {
            group,
            kind: kind.to_string(),
            name: name.to_string(),
        })
    }
}

impl fmt::Display for TargetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// Where in Istio's filter chain the plugin goes (`phase`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum IstioPhase {
    /// Before Istio's authentication: unauthenticated floods are limited too, but keys
    /// cannot come from what authentication adds.
    Authn,
    /// After authentication, before authorization.
    Authz,
    /// After authorization, before Istio's stats: requests the mesh refuses spend no
    /// tokens, and throttled answers show in Istio's metrics.
    #[default]
    Stats,
    /// Where Istio chooses (just before the router).
    Unspecified,
}

impl IstioPhase {
    fn as_str(self) -> &'static str {
        match self {
            IstioPhase::Authn => "AUTHN",
            IstioPhase::Authz => "AUTHZ",
            IstioPhase::Stats => "STATS",
            IstioPhase::Unspecified => "UNSPECIFIED_PHASE",
        }
    }
}

/// Where the admin API is, for Istio.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IstioAdmin {
    /// A Service in the mesh: Istio already has its outbound cluster, and mutual TLS
    /// protects the token when the admin API has a sidecar. Nothing else to render.
    Service(AdminService),
    /// Outside the mesh (another cluster, a VM): a `ServiceEntry` makes the outbound
    /// cluster, and for `https://` a `DestinationRule` originates TLS, checked against the
    /// proxies' system CAs and the URL's host name.
    External {
        url: AdminUrl,
        /// Accept plain `http://`: the token then crosses the network in clear text.
        insecure: bool,
    },
}

/// `sluice render istio`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IstioOptions {
    pub name: String,
    pub namespace: String,
    /// `oci://...`, `https://...` or `file://...`.
    pub url: String,
    /// For `oci://`, the image's manifest digest; for `http(s)://` and `file://`, the
    /// module's own SHA-256 (this is what Istio checks each against).
    pub sha256: Option<String>,
    pub image_pull_secret: Option<String>,
    pub phase: IstioPhase,
    /// `selector.matchLabels`; at most one of this and `target_refs`.
    pub selector: Vec<(String, String)>,
    pub target_refs: Vec<TargetRef>,
    pub filter: FilterConfigSpec,
    pub follow: Follow,
    pub admin: IstioAdmin,
}

impl IstioOptions {
    pub fn new(namespace: &str) -> IstioOptions {
        IstioOptions {
            name: PLUGIN_NAME.to_string(),
            namespace: namespace.to_string(),
            url: default_filter_image(),
            sha256: None,
            image_pull_secret: None,
            phase: IstioPhase::default(),
            selector: Vec::new(),
            target_refs: Vec::new(),
            filter: FilterConfigSpec::default(),
            follow: Follow::default(),
            admin: IstioAdmin::Service(AdminService::default()),
        }
    }
}

/// Istio's name for the outbound cluster of `host:port`.
pub fn istio_cluster(host: &str, port: u16) -> String {
    format!("outbound|{port}||{host}")
}

/// Rendered resources: YAML documents under a comment header.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// Comment lines without the `# ` marker.
    pub header: Vec<String>,
    pub resources: Vec<Value>,
}

impl Rendered {
    /// The resources as one multi-document YAML stream.
    pub fn to_yaml(&self) -> Result<String, RenderError> {
        let mut out = comment(&self.header);
        for (i, resource) in self.resources.iter().enumerate() {
            if i > 0 || !out.is_empty() {
                out.push_str("---\n");
            }
            out.push_str(&yaml(resource)?);
        }
        Ok(out)
    }
}

fn comment(lines: &[String]) -> String {
    let mut out = String::new();
    for line in wrap(lines) {
        out.push_str(if line.is_empty() { "#" } else { "# " });
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Comment lines broken between words at [`COMMENT_WIDTH`] columns, so a header reads
/// in a terminal; continuation lines are indented.
fn wrap(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for line in lines {
        let mut current = String::new();
        for word in line.split(' ') {
            if !current.trim().is_empty() && current.len() + 1 + word.len() > COMMENT_WIDTH - 2 {
                out.push(std::mem::replace(&mut current, "  ".to_string()));
            } else if !current.trim().is_empty() {
                current.push(' ');
            }
            current.push_str(word);
        }
        out.push(current);
    }
    out
}

/// The width of header comments, `# ` included.
const COMMENT_WIDTH: usize = 88;

fn yaml(value: &Value) -> Result<String, RenderError> {
    serde_norway::to_string(value).map_err(|e| RenderError::Serialise(e.to_string()))
}

/// The labels every resource Sluice renders carries.
fn labels(component: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "sluice",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "sluice",
    })
}

fn metadata(name: &str, namespace: &str, component: &str) -> Value {
    json!({ "name": name, "namespace": namespace, "labels": labels(component) })
}

/// `sluice render istio`: the `WasmPlugin`, and for an admin API outside the mesh its
/// `ServiceEntry` (and `DestinationRule` over https).
pub fn istio(options: &IstioOptions) -> Result<Rendered, RenderError> {
    check_name("--name", &options.name)?;
    check_name("--namespace", &options.namespace)?;
    if let Some(sha) = &options.sha256 {
        check_sha256("--sha256", sha)?;
    }
    if !options.selector.is_empty() && !options.target_refs.is_empty() {
        return Err(RenderError::Conflict(
            "a WasmPlugin takes a workload selector or target references, not both".to_string(),
        ));
    }
    let (host, port) = match &options.admin {
        IstioAdmin::Service(service) => {
            service.check()?;
            (service.host(), service.port)
        }
        IstioAdmin::External { url, insecure } => {
            if url.scheme == Scheme::Http && !insecure && !url.is_loopback() {
                return Err(EnvoyConfigError::PlainHttpToRemote(url.url()).into());
            }
            (url.host.clone(), url.port)
        }
    };
    let cluster = istio_cluster(&host, port);
    let (_, plugin_config) = plugin_config(
        &options.filter,
        &options.follow,
        &cluster,
        &format!("{host}:{port}"),
    )?;

    let mut spec = json!({
        "url": options.url,
        "pluginName": PLUGIN_NAME,
        "phase": options.phase.as_str(),
        // A filter that cannot be fetched or fails must not take traffic down with it.
        "failStrategy": "FAIL_OPEN",
        "imagePullPolicy": "IfNotPresent",
        "type": "HTTP",
        "pluginConfig": plugin_config,
    });
    if let Some(sha) = &options.sha256 {
        spec["sha256"] = json!(sha);
    }
    if let Some(secret) = &options.image_pull_secret {
        spec["imagePullSecret"] = json!(secret);
    }
    if !options.selector.is_empty() {
        let labels: Map<String, Value> = options
            .selector
            .iter()
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        spec["selector"] = json!({ "matchLabels": labels });
    }
    if !options.target_refs.is_empty() {
        spec["targetRefs"] = options.target_refs.iter().map(TargetRef::to_json).collect();
    }
    let mut resources = vec![json!({
        "apiVersion": "extensions.istio.io/v1alpha1",
        "kind": "WasmPlugin",
        "metadata": metadata(&options.name, &options.namespace, "filter"),
        "spec": spec,
    })];

    let mut header = vec![
        "Sluice for Istio, generated by `sluice render istio`.".to_string(),
        format!(
            "The filter follows the admin API through Istio's cluster {cluster}: the workers \
             elect one of themselves to long-poll it."
        ),
    ];
    match &options.admin {
        IstioAdmin::Service(_) => header.push(
            "The admin API is a Service in the mesh: Istio already has that cluster (unless a \
             Sidecar resource hides its namespace), so nothing else is needed."
                .to_string(),
        ),
        IstioAdmin::External { url, .. } => {
            let is_ip = url.host.parse::<std::net::IpAddr>().is_ok();
            let mut entry = json!({
                "hosts": [url.host],
                "location": "MESH_EXTERNAL",
                "resolution": if is_ip { "STATIC" } else { "DNS" },
                // HTTP even for https: the sidecar sees the filter's plain request and the
                // DestinationRule below encrypts it.
                "ports": [{ "number": url.port, "name": "http-sluice-admin", "protocol": "HTTP" }],
            });
            if is_ip {
                entry["endpoints"] = json!([{ "address": url.host }]);
            }
            resources.push(json!({
                "apiVersion": "networking.istio.io/v1",
                "kind": "ServiceEntry",
                "metadata": metadata(&format!("{}-admin", options.name), &options.namespace, "admin-api"),
                "spec": entry,
            }));
            if url.scheme == Scheme::Https {
                // The filter speaks plain HTTP to the cluster; the sidecar originates TLS
                // and checks the certificate against its system CAs and the host name.
                resources.push(json!({
                    "apiVersion": "networking.istio.io/v1",
                    "kind": "DestinationRule",
                    "metadata": metadata(&format!("{}-admin", options.name), &options.namespace, "admin-api"),
                    "spec": {
                        "host": url.host,
                        "trafficPolicy": { "tls": { "mode": "SIMPLE", "sni": url.host } },
                    },
                }));
            }
            header.push(format!(
                "The admin API at {} is outside the mesh: the ServiceEntry below makes that \
                 cluster{}.",
                url.url(),
                if url.scheme == Scheme::Https {
                    ", and the DestinationRule originates TLS to it"
                } else {
                    " (plain HTTP: the token crosses the network in clear text)"
                }
            ));
        }
    }
    header.extend(options.follow.token.header());
    Ok(Rendered { header, resources })
}

/// `sluice render envoy-gateway`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyGatewayOptions {
    pub name: String,
    /// The Gateway's namespace: both policies must be in it.
    pub namespace: String,
    /// The Gateway whose Envoys get the admin cluster.
    pub gateway: String,
    /// What the extension policy attaches to; empty: the Gateway.
    pub target_refs: Vec<TargetRef>,
    /// `REGISTRY/IMAGE:TAG` or `oci://...`.
    pub image: String,
    /// The image's manifest digest (what Envoy Gateway checks an image against).
    pub sha256: Option<String>,
    pub filter: FilterConfigSpec,
    pub follow: Follow,
    /// Where the admin API is: its URL and, for `https://`, how Envoy checks it (paths
    /// inside the Envoy container). The token and proxy id are taken from `follow`.
    pub admin: AdminConnection,
}

impl EnvoyGatewayOptions {
    pub fn new(namespace: &str, gateway: &str) -> EnvoyGatewayOptions {
        EnvoyGatewayOptions {
            name: PLUGIN_NAME.to_string(),
            namespace: namespace.to_string(),
            gateway: gateway.to_string(),
            target_refs: Vec::new(),
            image: default_filter_image(),
            sha256: None,
            filter: FilterConfigSpec::default(),
            follow: Follow::default(),
            admin: AdminConnection::new(AdminService::default().url(), TOKEN_PLACEHOLDER),
        }
    }
}

/// `sluice render envoy-gateway`: an `EnvoyExtensionPolicy` running the filter, and an
/// `EnvoyPatchPolicy` adding the cluster it reaches the admin API through.
///
/// Envoy Gateway gives a wasm module no stable cluster of its own: its clusters are
/// named after the routes that use them, and a `Backend` becomes a cluster only behind a
/// route, which would also expose the admin API through the Gateway. The patch policy
/// adds a cluster of Sluice's own, exactly the one `sluice envoy-config` builds.
pub fn envoy_gateway(options: &EnvoyGatewayOptions) -> Result<Rendered, RenderError> {
    check_name("--name", &options.name)?;
    check_name("--namespace", &options.namespace)?;
    check_name("--gateway", &options.gateway)?;
    if let Some(sha) = &options.sha256 {
        check_sha256("--sha256", sha)?;
    }
    options.admin.check_transport()?;
    let (_, config) = plugin_config(
        &options.filter,
        &options.follow,
        ADMIN_CLUSTER,
        &options.admin.url.authority(),
    )?;
    let targets = if options.target_refs.is_empty() {
        vec![TargetRef::gateway(&options.gateway)]
    } else {
        options.target_refs.clone()
    };
    if let Some(other) = targets.iter().find(|t| t.group != GATEWAY_API) {
        return Err(RenderError::Conflict(format!(
            "an EnvoyExtensionPolicy attaches to Gateway API resources only, not {other}"
        )));
    }
    let mut image = json!({ "url": options.image });
    if let Some(sha) = &options.sha256 {
        image["sha256"] = json!(sha);
    }
    let extension = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyExtensionPolicy",
        "metadata": metadata(&options.name, &options.namespace, "filter"),
        "spec": {
            "targetRefs": targets.iter().map(TargetRef::to_json).collect::<Vec<_>>(),
            "wasm": [{
                "name": PLUGIN_NAME,
                "rootID": PLUGIN_NAME,
                "code": { "type": "Image", "image": image },
                "config": config,
                // A filter that cannot be fetched or fails must not take traffic down.
                "failOpen": true,
            }],
        },
    });
    let patch = json!({
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyPatchPolicy",
        "metadata": metadata(&format!("{}-admin-cluster", options.name), &options.namespace, "admin-api"),
        "spec": {
            "type": "JSONPatch",
            "targetRef": TargetRef::gateway(&options.gateway).to_json(),
            "jsonPatches": [{
                "type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "name": ADMIN_CLUSTER,
                // `add` with no path adds the value as a whole new resource.
                "operation": { "op": "add", "path": "", "value": admin_cluster(&options.admin) },
            }],
        },
    });
    let mut header = vec![
        "Sluice for Envoy Gateway, generated by `sluice render envoy-gateway`.".to_string(),
        format!(
            "The EnvoyPatchPolicy adds the cluster {ADMIN_CLUSTER} (to {}) to Gateway {}'s \
             Envoys; Envoy Gateway applies it only with extensionApis.enableEnvoyPatchPolicy: \
             true in its configuration.",
            options.admin.url.url(),
            options.gateway
        ),
    ];
    if options.admin.url.scheme == Scheme::Http && options.admin.insecure {
        header.push(
            "WARNING: plain HTTP (--insecure): the proxy token crosses the cluster network in \
             clear text; restrict who can reach the admin API with a NetworkPolicy."
                .to_string(),
        );
    }
    header.extend(options.follow.token.header());
    Ok(Rendered {
        header,
        resources: vec![extension, patch],
    })
}

/// `sluice render envoy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyOptions {
    /// Absolute path of the module on the Envoy host.
    pub filter_wasm: PathBuf,
    pub filter: FilterConfigSpec,
    /// The admin API and the proxy token (the `control` section); `None`: static rules.
    pub admin: Option<AdminConnection>,
}

/// `sluice render envoy`: the `envoy.filters.http.wasm` entry for an `http_filters` list
/// (before the router) and, with an admin API, the `sluice_admin` cluster, as one YAML
/// document with the keys `http_filters` and `clusters`.
///
/// Both come from [`crate::build`]'s bootstrap, so they cannot drift from it; the one
/// difference is the `control` section in the plugin configuration, which lets the
/// filter follow the admin API without the bootstrap's singleton service.
pub fn envoy(options: &EnvoyOptions) -> Result<Bootstrap, RenderError> {
    let mut spec = options.filter.clone();
    let mut header = vec![
        "The Sluice filter for your own Envoy configuration, generated by `sluice render envoy`."
            .to_string(),
        "http_filters: add the entry to your HttpConnectionManager's http_filters, before \
         envoy.filters.http.router."
            .to_string(),
    ];
    let mut clusters = None;
    if let Some(admin) = &options.admin {
        admin.check_transport()?;
        let follow = Follow {
            token: if admin.token == TOKEN_PLACEHOLDER {
                ProxyToken::Placeholder
            } else {
                ProxyToken::Given(admin.token.clone())
            },
            proxy_id: admin.proxy_id.clone(),
            sync_interval_ms: admin.sync_interval_ms,
        };
        spec = plugin_config(&spec, &follow, ADMIN_CLUSTER, &admin.url.authority())?.0;
        clusters = Some(json!([admin_cluster(admin)]));
        header.push(format!(
            "clusters: add {ADMIN_CLUSTER} to static_resources.clusters; the workers elect one \
             of themselves to follow the admin API at {} through it.",
            admin.url.url()
        ));
        header.extend(follow.token.header());
    }
    let mut bootstrap_options = EnvoyConfigOptions::new(
        ([127, 0, 0, 1], 0).into(),
        Upstream::Direct,
        options.filter_wasm.clone(),
    );
    bootstrap_options.plugin = PluginConfig::Spec(spec);
    let mut bootstrap = build(&bootstrap_options)?;
    let filter = bootstrap
        .http_filters_mut()
        .and_then(|filters| filters.first().cloned())
        .ok_or_else(|| RenderError::Serialise("the bootstrap has no HTTP filter".to_string()))?;
    let mut config = json!({ "http_filters": [filter] });
    if let Some(clusters) = clusters {
        config["clusters"] = clusters;
    }
    Ok(Bootstrap {
        header: wrap(&header),
        config,
    })
}

/// Where the admin API keeps its data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Database {
    /// A SQLite file on a PersistentVolumeClaim: one replica.
    #[default]
    Sqlite,
    /// PostgreSQL by URL from the Secret [`DATABASE_SECRET`]: any number of replicas,
    /// sharing global buckets through Redis from [`REDIS_SECRET`] when it exists.
    Postgres,
}

/// `sluice render kubernetes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesOptions {
    pub service: AdminService,
    pub image: String,
    pub database: Database,
    /// Replicas: 1 with SQLite (the only choice), any number with PostgreSQL.
    pub replicas: u32,
    /// The SQLite volume's size.
    pub storage: String,
    pub storage_class: Option<String>,
    /// Also render a Prometheus Operator `ServiceMonitor`.
    pub service_monitor: bool,
}

impl Default for KubernetesOptions {
    fn default() -> Self {
        KubernetesOptions {
            service: AdminService::default(),
            image: default_admin_image(),
            database: Database::Sqlite,
            replicas: 1,
            storage: "1Gi".to_string(),
            storage_class: None,
            service_monitor: false,
        }
    }
}

/// The admin API's manifests, one file each (`(file name, YAML)`), and a
/// `kustomization.yaml` listing them: the kustomize base in `deploy/kubernetes/`.
pub fn kubernetes(options: &KubernetesOptions) -> Result<Vec<(String, String)>, RenderError> {
    let resources = kubernetes_resources(options)?;
    let mut files = Vec::new();
    for (file, resource) in &resources {
        let header = [
            format!(
                "Sluice admin API: {}, generated by `sluice render kubernetes`.",
                resource["kind"].as_str().unwrap_or("resource")
            ),
            "Regenerate with `cargo run -p sluice-admin -- render kubernetes --output-dir \
             deploy/kubernetes`."
                .to_string(),
        ];
        files.push((file.to_string(), comment(&header) + &yaml(resource)?));
    }
    let names: Vec<&str> = resources.iter().map(|(file, _)| *file).collect();
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": names,
    });
    let header = [
        "The Sluice admin API's kustomize base: `kubectl apply -k deploy/kubernetes` after \
         creating the Secret sluice-admin-token (see docs/kubernetes.md)."
            .to_string(),
    ];
    files.push((
        "kustomization.yaml".to_string(),
        comment(&header) + &yaml(&kustomization)?,
    ));
    Ok(files)
}

/// The same resources as one multi-document stream (no kustomization).
pub fn kubernetes_stream(options: &KubernetesOptions) -> Result<Rendered, RenderError> {
    Ok(Rendered {
        header: vec![
            "The Sluice admin API, generated by `sluice render kubernetes`.".to_string(),
            format!(
                "Create the Secret {ADMIN_TOKEN_SECRET} (key {SECRET_KEY_TOKEN}) first; see \
                 docs/kubernetes.md."
            ),
        ],
        resources: kubernetes_resources(options)?
            .into_iter()
            .map(|(_, resource)| resource)
            .collect(),
    })
}

fn kubernetes_resources(
    options: &KubernetesOptions,
) -> Result<Vec<(&'static str, Value)>, RenderError> {
    let service = &options.service;
    service.check()?;
    if options.database == Database::Sqlite && options.replicas != 1 {
        return Err(RenderError::Conflict(format!(
            "--replicas {}: SQLite is one file that one process writes; use PostgreSQL \
             (--database postgres) for more replicas",
            options.replicas
        )));
    }
    if options.replicas == 0 {
        return Err(RenderError::Conflict(
            "--replicas must be at least 1".to_string(),
        ));
    }
    let name = service.name.as_str();
    let namespace = service.namespace.as_str();
    let component = "admin-api";
    let selector =
        json!({ "app.kubernetes.io/name": "sluice", "app.kubernetes.io/component": component });
    let data_claim = format!("{name}-data");

    let secret_env = |var: &str, secret: &str, key: &str, optional: bool| json!({ "name": var, "valueFrom": { "secretKeyRef": { "name": secret, "key": key, "optional": optional } } });
    let mut env = vec![secret_env(
        "SLUICE_ADMIN_TOKEN",
        ADMIN_TOKEN_SECRET,
        SECRET_KEY_TOKEN,
        false,
    )];
    let mut volumes = vec![json!({ "name": "tmp", "emptyDir": {} })];
    let mut mounts = vec![json!({ "name": "tmp", "mountPath": "/tmp" })];
    match options.database {
        Database::Sqlite => {
            env.push(json!({ "name": "SLUICE_DATABASE", "value": format!("sqlite://{DATA_DIR}/sluice.db") }));
            volumes.push(
                json!({ "name": "data", "persistentVolumeClaim": { "claimName": data_claim } }),
            );
            mounts.push(json!({ "name": "data", "mountPath": DATA_DIR }));
        }
        Database::Postgres => {
            env.push(secret_env(
                "SLUICE_DATABASE",
                DATABASE_SECRET,
                SECRET_KEY_URL,
                false,
            ));
            // Optional: without it, each replica keeps global buckets in memory.
            env.push(secret_env(
                "SLUICE_REDIS",
                REDIS_SECRET,
                SECRET_KEY_URL,
                true,
            ));
        }
    }
    let probe = |path: &str, period: u32, failures: u32| {
        json!({
            "httpGet": { "path": path, "port": ADMIN_PORT_NAME },
            "periodSeconds": period,
            "timeoutSeconds": 3,
            "failureThreshold": failures,
        })
    };
    let container = json!({
        "name": "sluice",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["serve", "--listen", format!("0.0.0.0:{}", service.port)],
        "env": env,
        "ports": [{ "name": ADMIN_PORT_NAME, "containerPort": service.port, "protocol": "TCP" }],
        // Ready: the database answers (within 2 s). Alive: the process answers.
        "readinessProbe": probe("/readyz", 5, 2),
        "livenessProbe": probe("/healthz", 10, 3),
        "startupProbe": probe("/healthz", 2, 30),
        "resources": {
            "requests": { "cpu": "100m", "memory": "128Mi" },
            "limits": { "memory": "512Mi" },
        },
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "capabilities": { "drop": ["ALL"] },
        },
        "volumeMounts": mounts,
    });
    let deployment = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(name, namespace, component),
        "spec": {
            "replicas": options.replicas,
            // SQLite: the old pod lets go of the volume and the file before the new one
            // starts. PostgreSQL: replicas roll one by one.
            "strategy": match options.database {
                Database::Sqlite => json!({ "type": "Recreate" }),
                Database::Postgres => json!({ "type": "RollingUpdate", "rollingUpdate": { "maxUnavailable": 0, "maxSurge": 1 } }),
            },
            "selector": { "matchLabels": selector },
            "template": {
                "metadata": {
                    "labels": labels(component),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": service.port.to_string(),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": false,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": RUN_AS,
                        "runAsGroup": RUN_AS,
                        "fsGroup": RUN_AS,
                        "seccompProfile": { "type": "RuntimeDefault" },
                    },
                    // `sluice serve` stops gracefully on SIGTERM: answers what is in
                    // flight and writes the last reports.
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    });
    let svc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(name, namespace, component),
        "spec": {
            "selector": selector,
            "ports": [{
                "name": ADMIN_PORT_NAME,
                "port": service.port,
                "targetPort": ADMIN_PORT_NAME,
                "protocol": "TCP",
                "appProtocol": "http",
            }],
        },
    });
    let mut resources = vec![
        (
            "namespace.yaml",
            json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace, "labels": labels(component) } }),
        ),
        (
            "serviceaccount.yaml",
            json!({
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": metadata(name, namespace, component),
                "automountServiceAccountToken": false,
            }),
        ),
    ];
    if options.database == Database::Sqlite {
        let mut spec = json!({
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": options.storage } },
        });
        if let Some(class) = &options.storage_class {
            spec["storageClassName"] = json!(class);
        }
        resources.push((
            "persistentvolumeclaim.yaml",
            json!({
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": metadata(&data_claim, namespace, component),
                "spec": spec,
            }),
        ));
    }
    resources.push(("deployment.yaml", deployment));
    resources.push(("service.yaml", svc));
    if options.service_monitor {
        resources.push((
            "servicemonitor.yaml",
            json!({
                "apiVersion": "monitoring.coreos.com/v1",
                "kind": "ServiceMonitor",
                "metadata": metadata(name, namespace, component),
                "spec": {
                    "selector": { "matchLabels": selector },
                    "endpoints": [{ "port": ADMIN_PORT_NAME, "path": "/metrics", "interval": "30s" }],
                },
            }),
        ));
    }
    Ok(resources)
}

/// A DNS-1123 label: what Kubernetes accepts as a name and namespace.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn check_name(what: &'static str, s: &str) -> Result<(), RenderError> {
    if is_name(s) {
        Ok(())
    } else {
        Err(RenderError::Name(what, s.to_string()))
    }
}

fn check_sha256(what: &'static str, s: &str) -> Result<(), RenderError> {
    if s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(RenderError::Sha256(what, s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use sluice_rules_file::{RulesFormat, parse_rules};

    use super::*;
    use crate::WASM_FILTER;

    fn rules() -> FilterConfigSpec {
        let rules = parse_rules(
            "- {name: per-key, key: {header: x-api-key}, limits: [{requests: 5, period: second}]}\n",
            RulesFormat::Yaml,
            Path::new("rules.yaml"),
        )
        .unwrap();
        FilterConfigSpec {
            rules,
            ..FilterConfigSpec::default()
        }
    }

    /// The plugin configuration as the filter will read it: JSON bytes, parsed and
    /// checked by the core.
    fn filter_reads(config: &Value) -> FilterConfig {
        FilterConfig::from_json(config.to_string().as_bytes()).unwrap()
    }

    fn of_kind<'a>(rendered: &'a Rendered, kind: &str) -> &'a Value {
        rendered
            .resources
            .iter()
            .find(|r| r["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    }

    #[test]
    fn the_committed_kustomize_base_is_what_the_renderer_writes() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
        let files = kubernetes(&KubernetesOptions::default()).unwrap();
        for (name, text) in &files {
            let committed = std::fs::read_to_string(dir.join(name))
                .unwrap_or_else(|e| panic!("deploy/kubernetes/{name}: {e}"));
            assert_eq!(
                &committed, text,
                "deploy/kubernetes/{name} differs from the renderer's: regenerate it with \
                 `cargo run -p sluice-admin -- render kubernetes --output-dir deploy/kubernetes`"
            );
        }
        let mut committed: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        committed.sort();
        let mut rendered: Vec<String> = files.into_iter().map(|(name, _)| name).collect();
        rendered.sort();
        assert_eq!(
            committed, rendered,
            "files in deploy/kubernetes the renderer does not write"
        );
    }

    #[test]
    fn istio_follows_a_mesh_service_through_its_outbound_cluster() {
        let mut options = IstioOptions::new("shop");
        options.filter = rules();
        options.selector = vec![("app".into(), "storefront".into())];
        let rendered = istio(&options).unwrap();
        assert_eq!(
            rendered.resources.len(),
            1,
            "a mesh Service needs no ServiceEntry"
        );
        let plugin = of_kind(&rendered, "WasmPlugin");
        assert_eq!(plugin["apiVersion"], "extensions.istio.io/v1alpha1");
        assert_eq!(plugin["metadata"]["namespace"], "shop");
        let spec = &plugin["spec"];
        assert_eq!(spec["failStrategy"], "FAIL_OPEN");
        assert_eq!(spec["pluginName"], PLUGIN_NAME);
        assert_eq!(spec["url"], default_filter_image());
        assert_eq!(spec["selector"]["matchLabels"]["app"], "storefront");
        assert!(spec.get("sha256").is_none());
        let config = filter_reads(&spec["pluginConfig"]);
        assert_eq!(config.ruleset.rules().len(), 1);
        let control = config.control.unwrap();
        assert_eq!(
            control.admin_cluster,
            "outbound|8080||sluice-admin.sluice.svc.cluster.local"
        );
        assert_eq!(
            control.admin_authority,
            "sluice-admin.sluice.svc.cluster.local:8080"
        );
        assert_eq!(control.token, TOKEN_PLACEHOLDER);
        let yaml = rendered.to_yaml().unwrap();
        assert!(yaml.contains("envsubst"), "{yaml}");
        // What the header promises is what the YAML holds.
        let parsed: Value = serde_norway::from_str(yaml.split("---\n").nth(1).unwrap()).unwrap();
        assert_eq!(&parsed, plugin);
    }

    #[test]
    fn istio_reaches_an_external_admin_api_through_a_service_entry() {
        let mut options = IstioOptions::new("istio-ingress");
        options.target_refs = vec!["Gateway/public".parse().unwrap()];
        options.follow.token = ProxyToken::Given("slc_proxy".into());
        options.sha256 = Some("ab".repeat(32));
        options.admin = IstioAdmin::External {
            url: "https://sluice.example.com".parse().unwrap(),
            insecure: false,
        };
        let rendered = istio(&options).unwrap();
        let plugin = of_kind(&rendered, "WasmPlugin");
        assert_eq!(
            plugin["spec"]["targetRefs"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public"}])
        );
        assert_eq!(plugin["spec"]["sha256"], "ab".repeat(32));
        let control = filter_reads(&plugin["spec"]["pluginConfig"])
            .control
            .unwrap();
        assert_eq!(control.admin_cluster, "outbound|443||sluice.example.com");
        assert_eq!(control.token, "slc_proxy");
        let entry = of_kind(&rendered, "ServiceEntry");
        assert_eq!(entry["spec"]["hosts"], json!(["sluice.example.com"]));
        assert_eq!(entry["spec"]["resolution"], "DNS");
        assert_eq!(entry["spec"]["ports"][0]["number"], 443);
        let rule = of_kind(&rendered, "DestinationRule");
        assert_eq!(rule["spec"]["trafficPolicy"]["tls"]["mode"], "SIMPLE");
        assert_eq!(
            rule["spec"]["trafficPolicy"]["tls"]["sni"],
            "sluice.example.com"
        );

        // Plain HTTP across the network only when asked for, and then without TLS.
        options.admin = IstioAdmin::External {
            url: "http://10.0.0.9:8080".parse().unwrap(),
            insecure: false,
        };
        assert!(matches!(
            istio(&options),
            Err(RenderError::Envoy(EnvoyConfigError::PlainHttpToRemote(_)))
        ));
        options.admin = IstioAdmin::External {
            url: "http://10.0.0.9:8080".parse().unwrap(),
            insecure: true,
        };
        let rendered = istio(&options).unwrap();
        assert_eq!(
            of_kind(&rendered, "ServiceEntry")["spec"]["resolution"],
            "STATIC"
        );
        assert!(
            rendered
                .resources
                .iter()
                .all(|r| r["kind"] != "DestinationRule")
        );
    }

    #[test]
    fn istio_refuses_what_istio_or_the_filter_would() {
        let refused = |change: &dyn Fn(&mut IstioOptions)| {
            let mut options = IstioOptions::new("shop");
            change(&mut options);
            istio(&options).unwrap_err().to_string()
        };
        assert!(refused(&|o| o.sha256 = Some("sha256:abc".into())).contains("SHA-256"));
        assert!(refused(&|o| o.namespace = "Shop".into()).contains("Kubernetes name"));
        assert!(
            refused(&|o| {
                o.selector = vec![("a".into(), "b".into())];
                o.target_refs = vec![TargetRef::gateway("g")];
            })
            .contains("not both")
        );
        assert!(refused(&|o| o.filter.slots = 0).contains("slots"));
        let message = refused(&|o| o.follow.sync_interval_ms = Some(1));
        assert!(message.contains("control.sync_interval_ms"), "{message}");
        assert!("Pod/x".parse::<TargetRef>().is_err());
        assert!("Gateway/".parse::<TargetRef>().is_err());
        assert_eq!("Service/waypoint".parse::<TargetRef>().unwrap().group, "");
    }

    #[test]
    fn envoy_gateway_adds_the_cluster_the_bootstrap_would_have() {
        let mut options = EnvoyGatewayOptions::new("default", "eg");
        options.admin.insecure = true;
        options.filter = rules();
        let rendered = envoy_gateway(&options).unwrap();
        let extension = of_kind(&rendered, "EnvoyExtensionPolicy");
        assert_eq!(
            extension["spec"]["targetRefs"],
            json!([{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "eg"}])
        );
        let wasm = &extension["spec"]["wasm"][0];
        assert_eq!(wasm["failOpen"], true);
        assert_eq!(wasm["rootID"], PLUGIN_NAME);
        assert_eq!(wasm["code"]["type"], "Image");
        assert_eq!(wasm["code"]["image"]["url"], default_filter_image());
        let control = filter_reads(&wasm["config"]).control.unwrap();
        assert_eq!(control.admin_cluster, ADMIN_CLUSTER);
        assert_eq!(
            control.admin_authority,
            "sluice-admin.sluice.svc.cluster.local:8080"
        );

        let patch = of_kind(&rendered, "EnvoyPatchPolicy");
        assert_eq!(patch["spec"]["targetRef"]["name"], "eg");
        let operation = &patch["spec"]["jsonPatches"][0]["operation"];
        assert_eq!(operation["op"], "add");
        // The same cluster `sluice envoy-config --admin-url` puts in a bootstrap.
        let mut bootstrap =
            EnvoyConfigOptions::new(([127, 0, 0, 1], 0).into(), Upstream::Direct, "/sluice.wasm");
        bootstrap.admin = Some(options.admin.clone());
        let config = build(&bootstrap).unwrap().config;
        assert_eq!(
            operation["value"],
            config["static_resources"]["clusters"][0]
        );
        assert_eq!(operation["value"]["type"], "STRICT_DNS");

        // Plain HTTP needs --insecure; targets are Gateway API resources.
        options.admin.insecure = false;
        assert!(envoy_gateway(&options).is_err());
        options.admin.insecure = true;
        options.target_refs = vec!["ServiceEntry/x".parse().unwrap()];
        assert!(matches!(
            envoy_gateway(&options),
            Err(RenderError::Conflict(_))
        ));
    }

    #[test]
    fn the_envoy_snippet_is_the_bootstraps_filter_with_a_control_section() {
        let admin = AdminConnection::new("http://127.0.0.1:8080".parse().unwrap(), "slc_p");
        let options = EnvoyOptions {
            filter_wasm: "/opt/sluice/sluice_filter.wasm".into(),
            filter: rules(),
            admin: Some(admin.clone()),
        };
        let snippet = envoy(&options).unwrap();
        let filter = &snippet.config["http_filters"][0];
        assert_eq!(filter["name"], WASM_FILTER);

        let mut full = EnvoyConfigOptions::new(
            ([127, 0, 0, 1], 0).into(),
            Upstream::Direct,
            "/opt/sluice/sluice_filter.wasm",
        );
        full.plugin = PluginConfig::Spec(rules());
        full.admin = Some(admin);
        let mut bootstrap = build(&full).unwrap();
        let expected_cluster = bootstrap.config["static_resources"]["clusters"][0].clone();
        let expected = bootstrap.http_filters_mut().unwrap()[0].clone();
        let config = |f: &Value| f["typed_config"]["config"].clone();
        for key in ["name", "root_id", "vm_config", "failure_policy"] {
            assert_eq!(config(filter)[key], config(&expected)[key], "{key}");
        }
        assert_eq!(snippet.config["clusters"][0], expected_cluster);
        let embedded = config(filter)["configuration"]["value"]
            .as_str()
            .unwrap()
            .to_string();
        let parsed = FilterConfig::from_json(embedded.as_bytes()).unwrap();
        let control = parsed.control.unwrap();
        assert_eq!(control.admin_cluster, ADMIN_CLUSTER);
        assert_eq!(control.token, "slc_p");
        let yaml = snippet.to_yaml().unwrap();
        assert!(yaml.contains("# FAIL_OPEN"), "{yaml}");

        // Static rules alone: no cluster, no control section.
        let snippet = envoy(&EnvoyOptions {
            admin: None,
            ..options
        })
        .unwrap();
        assert!(snippet.config.get("clusters").is_none());
    }

    fn container(resources: &Rendered) -> &Value {
        &of_kind(resources, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    }

    fn env<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
    }

    #[test]
    fn the_admin_api_runs_on_sqlite_alone_or_on_postgres_in_replicas() {
        let sqlite = kubernetes_stream(&KubernetesOptions::default()).unwrap();
        let deployment = of_kind(&sqlite, "Deployment");
        assert_eq!(deployment["spec"]["replicas"], 1);
        assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        let c = container(&sqlite);
        assert_eq!(
            env(c, "SLUICE_DATABASE").unwrap()["value"],
            "sqlite:///var/lib/sluice/sluice.db"
        );
        assert_eq!(
            env(c, "SLUICE_ADMIN_TOKEN").unwrap()["valueFrom"]["secretKeyRef"]["name"],
            ADMIN_TOKEN_SECRET
        );
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["ports"][0]["name"], ADMIN_PORT_NAME);
        let claim = of_kind(&sqlite, "PersistentVolumeClaim");
        let volumes = &deployment["spec"]["template"]["spec"]["volumes"];
        assert!(
            volumes
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"])
        );
        assert!(
            sqlite
                .resources
                .iter()
                .all(|r| r["kind"] != "ServiceMonitor")
        );

        let postgres = kubernetes_stream(&KubernetesOptions {
            database: Database::Postgres,
            replicas: 3,
            service_monitor: true,
            ..KubernetesOptions::default()
        })
        .unwrap();
        assert_eq!(of_kind(&postgres, "Deployment")["spec"]["replicas"], 3);
        assert!(
            postgres
                .resources
                .iter()
                .all(|r| r["kind"] != "PersistentVolumeClaim")
        );
        let c = container(&postgres);
        assert_eq!(
            env(c, "SLUICE_DATABASE").unwrap()["valueFrom"]["secretKeyRef"]["name"],
            DATABASE_SECRET
        );
        assert_eq!(
            env(c, "SLUICE_REDIS").unwrap()["valueFrom"]["secretKeyRef"]["optional"],
            true
        );
        let monitor = of_kind(&postgres, "ServiceMonitor");
        assert_eq!(monitor["spec"]["endpoints"][0]["port"], ADMIN_PORT_NAME);
        assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
        // The ServiceMonitor and the Deployment select what the Service selects.
        let selector = &of_kind(&postgres, "Service")["spec"]["selector"];
        assert_eq!(&monitor["spec"]["selector"]["matchLabels"], selector);

        let refused = kubernetes_stream(&KubernetesOptions {
            replicas: 2,
            ..KubernetesOptions::default()
        });
        assert!(matches!(refused, Err(RenderError::Conflict(m)) if m.contains("PostgreSQL")));
    }
}
