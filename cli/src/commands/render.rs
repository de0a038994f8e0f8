//! `sluice render istio|envoy-gateway|envoy|kubernetes|ratelimit`: flags to
//! [`sluice_envoy_config::render`]'s options; the rules, proxy token and module files read
//! here; the YAML written out. Needs no server.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};
use sluice_core::config::{DEFAULT_SLOTS, FilterConfigSpec};
use sluice_envoy_config::render::{
    self, AdminService, Database, EnvoyGatewayOptions, EnvoyOptions, Follow, IstioAdmin,
    IstioOptions, IstioPhase, KubernetesOptions, ProxyToken, RatelimitOptions, RenderError,
    Rendered, TargetRef,
};
use sluice_envoy_config::{AdminConnection, AdminTls, AdminUrl};

use super::rls_args::RlsArgs;
use super::{Failure, FailureModeArg, filter_spec, write_output};

#[derive(Debug, clap::Subcommand)]
pub enum RenderCommand {
    /// An Istio WasmPlugin running the filter, following the admin API through the mesh
    /// (and a ServiceEntry for an admin API outside it).
    Istio(IstioArgs),
    /// An Envoy Gateway EnvoyExtensionPolicy running the filter, and the EnvoyPatchPolicy
    /// that adds its admin API cluster.
    EnvoyGateway(EnvoyGatewayArgs),
    /// The filter's http_filters entry and the admin API cluster, for your own Envoy
    /// configuration.
    Envoy(EnvoyArgs),
    /// The admin API's own manifests: Namespace, ServiceAccount, storage, Deployment,
    /// Service (the kustomize base in deploy/kubernetes/).
    Kubernetes(KubernetesArgs),
    /// No wasm: Envoy's native rate limit filter (--rls) and/or quota filter (--rlqs)
    /// asking `sluice serve --rls-listen`, its cluster and the route's rate_limits, for
    /// your own Envoy configuration (what `sluice envoy-config --rls` puts in a bootstrap).
    Ratelimit(RatelimitArgs),
}

#[derive(Debug, clap::Args)]
pub struct RatelimitArgs {
    /// With --rls: the rules the route's descriptors are made for (each distinct list of
    /// a `descriptor` rule's entries in the domain is one descriptor).
    #[arg(long, value_name = "FILE.json|.yaml|.yml")]
    rules: Option<PathBuf>,

    #[command(flatten)]
    services: RlsArgs,

    /// Write the YAML to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// The plugin configuration's own settings.
#[derive(Debug, clap::Args)]
struct FilterArgs {
    /// Rules enforced until the admin API's ruleset arrives: a JSON or YAML rules file.
    #[arg(long, value_name = "FILE.json|.yaml|.yml")]
    rules: Option<PathBuf>,

    /// Bucket slots shared by a proxy's workers (about 114 bytes of Envoy memory each,
    /// measured: tools/bench/results/2026-11-25.md).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SLOTS)]
    slots: u32,

    /// What rules without their own failure mode do when they cannot be evaluated.
    #[arg(long, value_enum, default_value_t = FailureModeArg::Open)]
    failure_mode: FailureModeArg,
}

impl FilterArgs {
    fn spec(&self) -> Result<FilterConfigSpec, Failure> {
        filter_spec(self.rules.as_deref(), self.slots, self.failure_mode)
    }
}

/// How the elected worker follows the admin API.
#[derive(Debug, clap::Args)]
struct FollowArgs {
    /// A file holding a token of the proxy role (`sluice token create --role proxy`).
    /// Without it the output carries the placeholder ${SLUICE_PROXY_TOKEN}, for
    /// `envsubst` to replace before applying.
    #[arg(long, value_name = "FILE")]
    proxy_token_file: Option<PathBuf>,

    /// How each proxy names itself to the admin API (default: Envoy's node id, one per
    /// pod).
    #[arg(long, value_name = "ID")]
    proxy_id: Option<String>,

    /// How often fleet-wide buckets are synced with the admin API, 50 to 10,000 ms
    /// (default 250).
    #[arg(long, value_name = "MS")]
    sync_interval_ms: Option<u32>,
}

impl FollowArgs {
    fn follow(&self) -> Result<Follow, Failure> {
        let token = match &self.proxy_token_file {
            None => ProxyToken::Placeholder,
            Some(path) => {
                let token = std::fs::read_to_string(path)
                    .map_err(|e| {
                        Failure::BadInput(format!("--proxy-token-file {}: {e}", path.display()))
                    })?
                    .trim()
                    .to_string();
                if token.is_empty() {
                    return Err(Failure::BadInput(format!(
                        "--proxy-token-file {}: the file is empty",
                        path.display()
                    )));
                }
                ProxyToken::Given(token)
            }
        };
        Ok(Follow {
            token,
            proxy_id: self.proxy_id.clone(),
            sync_interval_ms: self.sync_interval_ms,
        })
    }
}

/// What the filter's platforms (Istio, Envoy Gateway, your own Envoy) share: the plugin
/// configuration, how the elected worker follows the admin API, and where the YAML goes.
#[derive(Debug, clap::Args)]
struct PluginArgs {
    #[command(flatten)]
    filter: FilterArgs,

    #[command(flatten)]
    follow: FollowArgs,

    /// Write to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// The admin API as a Service of the cluster.
#[derive(Debug, clap::Args)]
struct ServiceArgs {
    /// The admin API's Service.
    #[arg(long, value_name = "NAME", default_value = render::ADMIN_SERVICE)]
    admin_service: String,

    /// The admin API's namespace.
    #[arg(long, value_name = "NAMESPACE", default_value = render::ADMIN_NAMESPACE)]
    admin_namespace: String,

    /// The admin API Service's port.
    #[arg(long, value_name = "PORT", default_value_t = render::ADMIN_PORT)]
    admin_port: u16,

    /// The cluster's DNS domain.
    #[arg(long, value_name = "DOMAIN", default_value = "cluster.local")]
    cluster_domain: String,
}

impl ServiceArgs {
    fn service(&self) -> AdminService {
        AdminService {
            name: self.admin_service.clone(),
            namespace: self.admin_namespace.clone(),
            port: self.admin_port,
            cluster_domain: self.cluster_domain.clone(),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct IstioArgs {
    /// The namespace of the WasmPlugin: the workloads it applies to (with --selector or
    /// --target-ref, some of them; the root namespace, usually istio-system: every one).
    #[arg(long, value_name = "NAMESPACE")]
    namespace: String,

    /// The WasmPlugin's name.
    #[arg(long, value_name = "NAME", default_value = sluice_envoy_config::PLUGIN_NAME)]
    name: String,

    /// Where Istio fetches the module: oci://REGISTRY/IMAGE:TAG (default
    /// oci://localhost:5000/sluice/sluice-filter:VERSION), https://.../sluice_filter.wasm or
    /// file:///PATH in the proxy container.
    #[arg(long, value_name = "URL")]
    url: Option<String>,

    /// The digest Istio checks: for oci://, the image's manifest digest (`skopeo inspect
    /// --format '{{.Digest}}'`, without `sha256:`); for https:// and file://, the module's.
    #[arg(long, value_name = "HEX", conflicts_with = "wasm")]
    sha256: Option<String>,

    /// The module file served at an https:// or file:// --url: its SHA-256 becomes
    /// `sha256`.
    #[arg(long, value_name = "FILE.wasm")]
    wasm: Option<PathBuf>,

    /// A docker-registry Secret in the namespace for pulling the image.
    #[arg(long, value_name = "SECRET")]
    image_pull_secret: Option<String>,

    /// Where in Istio's filter chain the filter runs.
    #[arg(long, value_enum, default_value_t = IstioPhase::Stats)]
    phase: IstioPhase,

    /// Only workloads with this label (repeat for several): KEY=VALUE.
    #[arg(long, value_name = "KEY=VALUE", value_parser = key_value, conflicts_with = "target_ref")]
    selector: Vec<(String, String)>,

    /// Only this resource's workloads (repeat for several): Gateway/NAME,
    /// GatewayClass/NAME, Service/NAME (waypoints) or ServiceEntry/NAME.
    #[arg(long, value_name = "KIND/NAME")]
    target_ref: Vec<TargetRef>,

    /// An admin API outside the mesh (another cluster, a VM): adds a ServiceEntry (and for
    /// https:// a DestinationRule originating TLS). Default: the Service below.
    #[arg(long, value_name = "https://HOST:PORT")]
    admin_url: Option<AdminUrl>,

    /// Allow an http:// --admin-url: the proxy token then crosses the network in clear
    /// text.
    #[arg(long, requires = "admin_url")]
    insecure: bool,

    #[command(flatten)]
    service: ServiceArgs,

    #[command(flatten)]
    plugin: PluginArgs,
}

#[derive(Debug, clap::Args)]
pub struct EnvoyGatewayArgs {
    /// The Gateway's namespace (both policies go there).
    #[arg(long, value_name = "NAMESPACE")]
    namespace: String,

    /// The Gateway whose Envoys get the admin API cluster.
    #[arg(long, value_name = "NAME")]
    gateway: String,

    /// What the extension policy attaches to (repeat for several): Gateway/NAME,
    /// HTTPRoute/NAME, GRPCRoute/NAME. Default: the Gateway.
    #[arg(long, value_name = "KIND/NAME")]
    target_ref: Vec<TargetRef>,

    /// The name of the EnvoyExtensionPolicy (the patch policy adds `-admin-cluster`).
    #[arg(long, value_name = "NAME", default_value = sluice_envoy_config::PLUGIN_NAME)]
    name: String,

    /// The filter image, REGISTRY/IMAGE:TAG (default
    /// oci://localhost:5000/sluice/sluice-filter:VERSION).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,

    /// The image's manifest digest, which Envoy Gateway checks the pulled image against
    /// (`skopeo inspect --format '{{.Digest}}'`, without `sha256:`).
    #[arg(long, value_name = "HEX")]
    sha256: Option<String>,

    /// The admin API, when it is not the Service below (e.g. https:// with --admin-ca).
    #[arg(long, value_name = "URL")]
    admin_url: Option<AdminUrl>,

    /// PEM CA certificates for an https:// --admin-url: a path inside the Envoy
    /// container (e.g. /etc/ssl/certs/ca-certificates.crt).
    #[arg(long, value_name = "PATH", requires = "admin_url")]
    admin_ca: Option<PathBuf>,

    /// Allow plain http:// to the admin API (the default Service URL included): the
    /// proxy token then crosses the cluster network in clear text.
    #[arg(long)]
    insecure: bool,

    #[command(flatten)]
    service: ServiceArgs,

    #[command(flatten)]
    plugin: PluginArgs,
}

#[derive(Debug, clap::Args)]
pub struct EnvoyArgs {
    /// The module on the Envoy host (sluice_filter.wasm); written as an absolute path.
    #[arg(long, value_name = "PATH.wasm")]
    filter_wasm: PathBuf,

    /// The admin API to follow: adds the control section and the sluice_admin cluster.
    /// https:// needs --admin-ca; http:// beyond loopback needs --insecure.
    #[arg(long, value_name = "https://HOST:PORT")]
    admin_url: Option<AdminUrl>,

    /// PEM CA certificates the admin API's certificate must chain to (absolute path on
    /// the Envoy host).
    #[arg(long, value_name = "PATH", requires = "admin_url")]
    admin_ca: Option<PathBuf>,

    /// Allow an http:// --admin-url beyond loopback.
    #[arg(long, requires = "admin_url")]
    insecure: bool,

    #[command(flatten)]
    plugin: PluginArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DatabaseArg {
    /// A SQLite file on a PersistentVolumeClaim; one replica.
    Sqlite,
    /// PostgreSQL, its URL from the Secret sluice-database (key `url`); any number of
    /// replicas, sharing global buckets through Redis from the Secret sluice-redis.
    Postgres,
}

#[derive(Debug, clap::Args)]
pub struct KubernetesArgs {
    /// The namespace (created by the output).
    #[arg(long, value_name = "NAMESPACE", default_value = render::ADMIN_NAMESPACE)]
    namespace: String,

    /// The Deployment's, Service's and ServiceAccount's name.
    #[arg(long, value_name = "NAME", default_value = render::ADMIN_SERVICE)]
    name: String,

    /// The port the admin API listens on and its Service exposes.
    #[arg(long, value_name = "PORT", default_value_t = render::ADMIN_PORT)]
    port: u16,

    /// The `sluice` image (default localhost:5000/sluice/sluice:VERSION).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,

    #[arg(long, value_enum, default_value_t = DatabaseArg::Sqlite)]
    database: DatabaseArg,

    /// Replicas (PostgreSQL only: SQLite takes one).
    #[arg(long, value_name = "N", default_value_t = 1)]
    replicas: u32,

    /// The SQLite volume's size.
    #[arg(long, value_name = "SIZE", default_value = "1Gi")]
    storage: String,

    /// The SQLite volume's StorageClass (default: the cluster's default class).
    #[arg(long, value_name = "CLASS")]
    storage_class: Option<String>,

    /// Also render a Prometheus Operator ServiceMonitor for /metrics.
    #[arg(long)]
    service_monitor: bool,

    /// Write one file per resource and a kustomization.yaml into this folder (the
    /// committed base: `--output-dir deploy/kubernetes`).
    #[arg(long, value_name = "DIR", conflicts_with = "output")]
    output_dir: Option<PathBuf>,

    /// Write all resources to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

fn bad(err: RenderError) -> Failure {
    match err {
        RenderError::Serialise(_) => Failure::Other(err.into()),
        other => Failure::BadInput(other.to_string()),
    }
}

/// Writes rendered resources as YAML, or says why there are none.
fn write_rendered(
    output: Option<&Path>,
    rendered: Result<Rendered, RenderError>,
) -> Result<(), Failure> {
    let yaml = rendered.and_then(|r| r.to_yaml()).map_err(bad)?;
    write_output(output, &yaml)
}

/// The module's SHA-256, hex.
fn module_sha256(path: &Path) -> Result<String, Failure> {
    let bytes = std::fs::read(path)
        .map_err(|e| Failure::BadInput(format!("--wasm {}: {e}", path.display())))?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

pub fn run(command: &RenderCommand) -> Result<(), Failure> {
    match command {
        RenderCommand::Istio(args) => istio(args),
        RenderCommand::EnvoyGateway(args) => envoy_gateway(args),
        RenderCommand::Envoy(args) => envoy(args),
        RenderCommand::Kubernetes(args) => kubernetes(args),
        RenderCommand::Ratelimit(args) => ratelimit(args),
    }
}

fn ratelimit(args: &RatelimitArgs) -> Result<(), Failure> {
    let (rls, rlqs, credentials) = args.services.services(args.rules.as_deref())?;
    let options = RatelimitOptions {
        rls,
        rlqs,
        credentials,
    };
    let yaml = render::ratelimit(&options)
        .map_err(bad)?
        .to_yaml()
        .map_err(|e| Failure::Other(e.into()))?;
    write_output(args.output.as_deref(), &yaml)
}

fn istio(args: &IstioArgs) -> Result<(), Failure> {
    let mut options = IstioOptions::new(&args.namespace);
    options.name = args.name.clone();
    if let Some(url) = &args.url {
        options.url = url.clone();
    }
    options.sha256 = match &args.wasm {
        Some(_) if options.url.starts_with("oci://") || !options.url.contains("://") => {
            return Err(Failure::BadInput(
                "--wasm: Istio checks an oci:// image against its manifest digest, not the \
                 module's: pass --sha256 with the digest `skopeo inspect` prints instead"
                    .to_string(),
            ));
        }
        Some(path) => Some(module_sha256(path)?),
        None => args.sha256.clone(),
    };
    options.image_pull_secret = args.image_pull_secret.clone();
    options.phase = args.phase;
    options.selector = args.selector.clone();
    options.target_refs = args.target_ref.clone();
    options.filter = args.plugin.filter.spec()?;
    options.follow = args.plugin.follow.follow()?;
    options.admin = match &args.admin_url {
        Some(url) => IstioAdmin::External {
            url: url.clone(),
            insecure: args.insecure,
        },
        None => IstioAdmin::Service(args.service.service()),
    };
    write_rendered(args.plugin.output.as_deref(), render::istio(&options))
}

fn envoy_gateway(args: &EnvoyGatewayArgs) -> Result<(), Failure> {
    let mut options = EnvoyGatewayOptions::new(&args.namespace, &args.gateway);
    options.name = args.name.clone();
    if let Some(image) = &args.image {
        options.image = image.clone();
    }
    options.sha256 = args.sha256.clone();
    options.target_refs = args.target_ref.clone();
    options.filter = args.plugin.filter.spec()?;
    options.follow = args.plugin.follow.follow()?;
    let url = args
        .admin_url
        .clone()
        .unwrap_or_else(|| args.service.service().url());
    let mut admin = AdminConnection::new(url, render::TOKEN_PLACEHOLDER);
    admin.insecure = args.insecure;
    admin.tls = args.admin_ca.as_ref().map(AdminTls::new);
    options.admin = admin;
    write_rendered(
        args.plugin.output.as_deref(),
        render::envoy_gateway(&options),
    )
}

fn envoy(args: &EnvoyArgs) -> Result<(), Failure> {
    let filter_wasm = std::path::absolute(&args.filter_wasm)
        .with_context(|| format!("resolving {}", args.filter_wasm.display()))?;
    let admin = match &args.admin_url {
        None => None,
        Some(url) => {
            let follow = args.plugin.follow.follow()?;
            let token = match &follow.token {
                ProxyToken::Given(token) => token.clone(),
                ProxyToken::Placeholder => render::TOKEN_PLACEHOLDER.to_string(),
            };
            let mut admin = AdminConnection::new(url.clone(), token);
            admin.proxy_id = follow.proxy_id;
            admin.sync_interval_ms = follow.sync_interval_ms;
            admin.insecure = args.insecure;
            admin.tls = args.admin_ca.as_ref().map(AdminTls::new);
            Some(admin)
        }
    };
    let options = EnvoyOptions {
        filter_wasm,
        filter: args.plugin.filter.spec()?,
        admin,
    };
    let yaml = render::envoy(&options)
        .map_err(bad)?
        .to_yaml()
        .map_err(|e| Failure::Other(e.into()))?;
    write_output(args.plugin.output.as_deref(), &yaml)
}

fn kubernetes(args: &KubernetesArgs) -> Result<(), Failure> {
    let options = KubernetesOptions {
        service: AdminService {
            name: args.name.clone(),
            namespace: args.namespace.clone(),
            port: args.port,
            ..AdminService::default()
        },
        image: args
            .image
            .clone()
            .unwrap_or_else(render::default_admin_image),
        database: match args.database {
            DatabaseArg::Sqlite => Database::Sqlite,
            DatabaseArg::Postgres => Database::Postgres,
        },
        replicas: args.replicas,
        storage: args.storage.clone(),
        storage_class: args.storage_class.clone(),
        service_monitor: args.service_monitor,
    };
    match &args.output_dir {
        Some(dir) => {
            let files = render::kubernetes(&options).map_err(bad)?;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, text) in files {
                write_output(Some(&dir.join(name)), &text)?;
            }
            Ok(())
        }
        None => write_rendered(args.output.as_deref(), render::kubernetes_stream(&options)),
    }
}
