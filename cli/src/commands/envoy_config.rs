//! `sluice envoy-config`: flags to [`EnvoyConfigOptions`], rules and TLS files read and
//! checked here, the bootstrap rendered by [`sluice_envoy_config`] and written out.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sluice_core::config::DEFAULT_SLOTS;
use sluice_envoy_config::{
    AdminConnection, AdminTls, AdminUrl, ControlMode, DEFAULT_ENVOY_ADMIN, EnvoyConfigError,
    EnvoyConfigOptions, PluginConfig, Upstream, UpstreamProtocol,
};

use super::rls_args::{RlsArgs, tls_files};
use super::{Failure, FailureModeArg, filter_spec, write_output};

#[derive(Debug, clap::Args)]
pub struct EnvoyConfigArgs {
    /// Address Envoy listens on for client traffic (port 0: any free port).
    #[arg(long, value_name = "IP:PORT")]
    listen: SocketAddr,

    /// Where allowed requests go: IP:PORT of the upstream, or `direct` for Envoy to answer
    /// 200 "ok" itself (benchmarks, memory tests).
    #[arg(long, value_name = "IP:PORT|direct")]
    upstream: Upstream,

    /// What Envoy speaks to the upstream: `http2` for a gRPC upstream, `downstream` for the
    /// client's own protocol (gRPC and plain HTTP side by side).
    #[arg(long, value_enum, default_value_t = UpstreamProtocol::Http1)]
    upstream_protocol: UpstreamProtocol,

    /// The built filter (sluice_filter.wasm); written into the config as an absolute path.
    /// Not with --rls or --rlqs.
    #[arg(
        long,
        value_name = "PATH.wasm",
        required_unless_present_any = ["rls", "rlqs"],
        conflicts_with_all = ["rls", "rlqs"]
    )]
    filter: Option<PathBuf>,

    /// Rules enforced from start-up: a JSON or YAML list of rules (or `{rules: [...]}`).
    /// With --rls: the rules the route's descriptors are made for (each distinct list of
    /// a `descriptor` rule's entries in the domain is one descriptor).
    #[arg(long, value_name = "FILE.json|.yaml|.yml")]
    rules: Option<PathBuf>,

    /// Envoy worker threads, for the run command at the top of the output (Envoy takes
    /// it as a flag, not from the config).
    #[arg(long, value_name = "N")]
    concurrency: Option<NonZeroU32>,

    /// Address of Envoy's admin interface.
    #[arg(long, value_name = "IP:PORT", default_value_t = DEFAULT_ENVOY_ADMIN)]
    envoy_admin: SocketAddr,

    /// Bucket slots shared by all workers: bounds the filter's memory in Envoy
    /// (about 114 bytes each, measured: tools/bench/results/2026-11-25.md).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SLOTS)]
    slots: u32,

    /// What rules without their own failure mode do when they cannot be evaluated.
    #[arg(long, value_enum, default_value_t = FailureModeArg::Open)]
    failure_mode: FailureModeArg,

    /// Write the config to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Take rules from the admin API at this address: adds the control service (a
    /// singleton that long-polls the API) and a `sluice_admin` cluster. Needs
    /// --proxy-token; https:// needs --admin-ca; http:// to anything but a loopback
    /// address needs --insecure. Replicas of one admin API (sharing a PostgreSQL
    /// database): repeat the flag or separate URLs with commas; Envoy health-checks them
    /// and fails over between them.
    #[arg(
        long,
        value_name = "https://HOST:PORT",
        requires = "proxy_token",
        value_delimiter = ',',
        conflicts_with_all = ["rls", "rlqs"]
    )]
    admin_url: Vec<AdminUrl>,

    /// PEM CA certificates that the admin API's certificate must chain to (https://).
    #[arg(long, value_name = "FILE", requires = "admin_url")]
    admin_ca: Option<PathBuf>,

    /// The name the admin API's certificate must carry, sent as SNI (default: the URL's
    /// host; an IP address is then matched as an IP address and not sent).
    #[arg(long, value_name = "NAME", requires = "admin_ca")]
    admin_sni: Option<String>,

    /// A PEM client certificate Envoy presents to the admin API (or to a proxy in front of
    /// it that asks for one). Needs --admin-client-key.
    #[arg(long, value_name = "FILE", requires_all = ["admin_ca", "admin_client_key"])]
    admin_client_cert: Option<PathBuf>,

    /// The PEM private key of --admin-client-cert.
    #[arg(long, value_name = "FILE", requires = "admin_client_cert")]
    admin_client_key: Option<PathBuf>,

    /// Allow an http:// --admin-url to a non-loopback address: the proxy token then
    /// crosses the network in clear text.
    #[arg(long, requires = "admin_url")]
    insecure: bool,

    /// A token with the `proxy` role for the control service
    /// (`sluice token create --role proxy --name ...`).
    #[arg(long, value_name = "TOKEN", requires = "admin_url")]
    proxy_token: Option<String>,

    /// How this Envoy names itself to the admin API (default: Envoy's node id).
    #[arg(long, value_name = "ID", requires = "admin_url")]
    proxy_id: Option<String>,

    /// How often the control service syncs fleet-wide buckets with the admin API, 50 to
    /// 10,000 ms (default 250). Longer halves the coordinator's work per doubling, and the
    /// fleet then runs further behind its limit (about half an interval of the rate).
    #[arg(long, value_name = "MS", requires = "admin_url")]
    sync_interval_ms: Option<u32>,

    /// Where the control service runs [default: singleton]. `worker`: no bootstrap
    /// extension; the admin API's settings go in the filter's plugin configuration and
    /// one worker, elected through shared data, runs the service (what Istio and Envoy
    /// Gateway allow). The admin API's cluster is written either way.
    #[arg(long, value_enum, value_name = "MODE", requires = "admin_url")]
    control: Option<ControlMode>,
    #[command(flatten)]
    services: RlsArgs,
}

/// Renders the bootstrap to `--output` or standard output. Wrong rules, flags or files
/// are [`Failure::BadInput`], each named where it must be fixed.
pub fn run(args: &EnvoyConfigArgs) -> Result<(), Failure> {
    let services = &args.services;
    if services.rls.is_some() || services.rlqs.is_some() {
        if services.rls.is_some() && args.upstream == Upstream::Direct {
            // Its route would carry no `rate_limits`: the service would never be asked.
            return Err(Failure::BadInput(
                "--rls needs an --upstream address: Envoy's ratelimit filter skips routes \
                 that answer themselves (direct)"
                    .into(),
            ));
        }
        let mut options = EnvoyConfigOptions::new(args.listen, args.upstream, PathBuf::new());
        options.concurrency = args.concurrency;
        options.upstream_protocol = args.upstream_protocol;
        options.envoy_admin = args.envoy_admin;
        options.config_path = args.output.clone();
        (options.rls, options.rlqs, options.rls_credentials) =
            services.services(args.rules.as_deref())?;
        let yaml = sluice_envoy_config::render(&options).map_err(|err| match err {
            EnvoyConfigError::PlainRlsTokenToRemote(_) => Failure::BadInput(err.to_string()),
            other => Failure::Other(other.into()),
        })?;
        return write_output(args.output.as_deref(), &yaml);
    }
    let Some(filter) = &args.filter else {
        return Err(Failure::BadInput(
            "--filter is required without --rls or --rlqs".into(),
        ));
    };
    if services.rls_token.is_some() || services.rls_ca.is_some() || services.rls_insecure {
        return Err(Failure::BadInput(
            "--rls-token, --rls-ca and --rls-insecure apply only with --rls or --rlqs".into(),
        ));
    }
    let filter = std::path::absolute(filter)
        .with_context(|| format!("resolving the filter path {}", filter.display()))?;
    if !filter.is_file() {
        eprintln!(
            "warning: {} does not exist yet; Envoy will fail to load the filter until it does \
             (build it with `cargo xtask build`)",
            filter.display()
        );
    }

    let spec = filter_spec(args.rules.as_deref(), args.slots, args.failure_mode)?;

    let mut options = EnvoyConfigOptions::new(args.listen, args.upstream, filter);
    options.plugin = PluginConfig::Spec(spec);
    options.concurrency = args.concurrency;
    options.upstream_protocol = args.upstream_protocol;
    options.envoy_admin = args.envoy_admin;
    options.config_path = args.output.clone();
    options.control_mode = args.control.unwrap_or_default();
    if let (Some((url, replicas)), Some(token)) = (args.admin_url.split_first(), &args.proxy_token)
    {
        let mut admin = AdminConnection::new(url.clone(), token.clone());
        admin.replicas = replicas.to_vec();
        admin.proxy_id = args.proxy_id.clone();
        admin.sync_interval_ms = args.sync_interval_ms;
        admin.insecure = args.insecure;
        admin.tls = admin_tls(args)?;
        options.admin = Some(admin);
    }

    let yaml = sluice_envoy_config::render(&options).map_err(|err| match err {
        EnvoyConfigError::InvalidFilterConfig(errors) => {
            let mut message = String::from("the filter configuration is invalid:");
            for problem in &errors.0 {
                message.push_str("\n  ");
                message.push_str(&blame(&problem.field, args.rules.as_deref()));
                message.push_str(": ");
                message.push_str(&problem.message);
            }
            Failure::BadInput(message)
        }
        EnvoyConfigError::InvalidControlConfig(errors) => {
            Failure::BadInput(format!("--admin-url/--proxy-token/--proxy-id: {errors}"))
        }
        EnvoyConfigError::PlainHttpToRemote(_)
        | EnvoyConfigError::MixedAdminSchemes(..)
        | EnvoyConfigError::AdminCaMissing(_)
        | EnvoyConfigError::AdminTlsWithoutHttps(_) => Failure::BadInput(err.to_string()),
        other => Failure::Other(other.into()),
    })?;

    write_output(args.output.as_deref(), &yaml)
}

/// `--admin-ca` and the flags beside it.
fn admin_tls(args: &EnvoyConfigArgs) -> Result<Option<AdminTls>, Failure> {
    tls_files(
        "admin",
        args.admin_ca.as_deref(),
        args.admin_sni.as_ref(),
        args.admin_client_cert
            .as_deref()
            .zip(args.admin_client_key.as_deref()),
    )
}

/// Names where a problem must be fixed: the rules file and the rule's field, or the flag.
fn blame(field: &str, rules_file: Option<&Path>) -> String {
    match field {
        "slots" => "--slots".to_string(),
        "failure_mode" => "--failure-mode".to_string(),
        _ if field.starts_with("rules") => match rules_file {
            Some(path) => format!("{}: {field}", path.display()),
            None => field.to_string(),
        },
        _ => field.to_string(),
    }
}
