//! `sluice envoy-config`: flags to [`EnvoyConfigOptions`], rules and TLS files read and
//! checked here, the bootstrap rendered by [`sluice_envoy_config`] and written out.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sluice_core::config::DEFAULT_SLOTS;
use sluice_envoy_config::{
    AdminConnection, AdminTls, AdminUrl, ControlMode, DEFAULT_ENVOY_ADMIN, EnvoyConfigError,
    EnvoyConfigOptions, KeyHeader, PluginConfig, RlqsService, RlsAction, RlsCredentials,
    RlsService, Upstream, UpstreamProtocol, descriptors_for_rules, rls_domains,
};

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
        value_delimiter = ','
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
    /// Instead of the wasm filter, Envoy's native rate limit filter
    /// (envoy.filters.http.ratelimit) asking Sluice's rate limit service at this address
    /// (`sluice serve --rls-listen`), with X-RateLimit headers, failing open.
    #[arg(long, value_name = "IP:PORT", conflicts_with = "admin_url")]
    rls: Option<SocketAddr>,
    /// The descriptor domain the native filter sends (rules' `descriptor.domain`)
    /// [default: the one domain of the --rules' descriptors, else `sluice`].
    #[arg(long, value_name = "DOMAIN", requires = "rls")]
    rls_domain: Option<String>,
    /// With --rules: the request header a descriptor key is read from (repeat the flag;
    /// a pseudo-header such as `:path` too) [default: the key with `_` as `-`].
    #[arg(long, value_name = "KEY=HEADER", requires = "rules")]
    rls_key_header: Vec<KeyHeader>,
    /// One entry of the descriptor each request sends, in order: remote_address,
    /// header:NAME=KEY or generic:KEY=VALUE (repeat the flag) [default: remote_address].
    #[arg(long, value_name = "ACTION", requires = "rls")]
    rls_action: Vec<RlsAction>,
    /// One more descriptor each request sends, its actions comma-separated in order
    /// (`generic:route=slow,header:x-api-key=api_key`); repeat for several. The
    /// `--rls-action`s, when given, are the first descriptor.
    #[arg(long, value_name = "ACTION,...", requires = "rls", value_parser = RlsAction::parse_list)]
    rls_descriptor: Vec<Vec<RlsAction>>,
    /// How long Envoy waits for the rate limit service before letting the request through.
    #[arg(long, value_name = "MS", default_value_t = 100, requires = "rls")]
    rls_timeout_ms: u32,
    /// Refuse requests when the rate limit service does not answer in time.
    #[arg(long, requires = "rls")]
    rls_fail_closed: bool,
    /// Instead of the wasm filter (or besides --rls), Envoy's quota filter
    /// (envoy.filters.http.rate_limit_quota, experimental in Envoy) asking Sluice's quota
    /// service at this address (`sluice serve --rls-listen`), failing open.
    #[arg(long, value_name = "IP:PORT", conflicts_with_all = ["admin_url", "rules"])]
    rlqs: Option<SocketAddr>,
    /// The domain the quota filter reports (rules' `descriptor.domain`).
    #[arg(
        long,
        value_name = "DOMAIN",
        default_value = "sluice",
        requires = "rlqs"
    )]
    rlqs_domain: String,
    /// One entry of each request's quota bucket id: header:NAME=KEY or
    /// generic:KEY=VALUE (repeat the flag; at least one header). A request without
    /// every header is in no bucket and not limited.
    #[arg(long, value_name = "ACTION", requires = "rlqs")]
    rlqs_bucket: Vec<RlsAction>,
    /// How often Envoy reports usage to the quota service and renews its assignments.
    #[arg(long, value_name = "MS", default_value_t = 1_000, requires = "rlqs")]
    rlqs_reporting_interval_ms: u32,
    /// Deny a quota bucket's requests until the quota service has assigned it a quota.
    #[arg(long, requires = "rlqs")]
    rlqs_fail_closed: bool,
    /// With --rls/--rlqs: a token with the `proxy` role (`sluice token create --role
    /// proxy`) that Envoy sends in every call (`sluice serve --rls-auth token`).
    #[arg(long, value_name = "TOKEN")]
    rls_token: Option<String>,
    /// With --rls/--rlqs: speak TLS to the service (`sluice serve --tls-cert`), checking
    /// its certificate against these PEM CA certificates.
    #[arg(long, value_name = "FILE")]
    rls_ca: Option<PathBuf>,
    /// The name the service's certificate must carry, sent as SNI (default: its IP
    /// address, matched as an IP address).
    #[arg(long, value_name = "NAME", requires = "rls_ca")]
    rls_sni: Option<String>,
    /// A PEM client certificate Envoy presents to the service (`sluice serve
    /// --rls-client-ca`). Needs --rls-client-key.
    #[arg(long, value_name = "FILE", requires_all = ["rls_ca", "rls_client_key"])]
    rls_client_cert: Option<PathBuf>,
    /// The PEM private key of --rls-client-cert.
    #[arg(long, value_name = "FILE", requires = "rls_client_cert")]
    rls_client_key: Option<PathBuf>,
}

/// The domain and the descriptors made for the `descriptor` rules of the rules file at
/// `path` (`--rls` with `--rules`).
fn rule_descriptors(
    path: &Path,
    args: &EnvoyConfigArgs,
) -> Result<(String, Vec<Vec<RlsAction>>), Failure> {
    let read = sluice_rules_file::read_rules_file(path)
        .map_err(|err| Failure::BadInput(format!("{:#}", anyhow::Error::from(err))))?;
    let domains = rls_domains(&read);
    let domain = match (&args.rls_domain, domains.len()) {
        (Some(domain), _) => domain.clone(),
        (None, 1) => domains
            .iter()
            .next()
            .map(|d| d.to_string())
            .unwrap_or_default(),
        (None, _) => {
            return Err(Failure::BadInput(format!(
                "{}: its descriptor rules name the domains {:?}: choose one with --rls-domain",
                path.display(),
                domains
            )));
        }
    };
    let descriptors = descriptors_for_rules(&read, &domain, &args.rls_key_header);
    if descriptors.is_empty() {
        return Err(Failure::BadInput(format!(
            "{}: no rule has a descriptor of domain `{domain}`",
            path.display()
        )));
    }
    Ok((domain, descriptors))
}

/// Renders the bootstrap to `--output` or standard output. Wrong rules, flags or files
/// are [`Failure::BadInput`], each named where it must be fixed.
pub fn run(args: &EnvoyConfigArgs) -> Result<(), Failure> {
    if args.rls.is_some() || args.rlqs.is_some() {
        let mut options = EnvoyConfigOptions::new(args.listen, args.upstream, PathBuf::new());
        options.concurrency = args.concurrency;
        options.upstream_protocol = args.upstream_protocol;
        options.envoy_admin = args.envoy_admin;
        options.config_path = args.output.clone();
        options.rlqs = args.rlqs.map(|addr| RlqsService {
            addr,
            domain: args.rlqs_domain.clone(),
            bucket: args.rlqs_bucket.clone(),
            reporting_interval_ms: args.rlqs_reporting_interval_ms,
            fail_closed: args.rlqs_fail_closed,
        });
        if let Some(rlqs) = &options.rlqs {
            rlqs.check().map_err(Failure::BadInput)?;
        }
        options.rls_credentials = RlsCredentials {
            token: args.rls_token.clone(),
            tls: tls_files(
                "rls",
                args.rls_ca.as_deref(),
                args.rls_sni.as_ref(),
                args.rls_client_cert
                    .as_deref()
                    .zip(args.rls_client_key.as_deref()),
            )?,
        };
        if args.rls.is_some() && args.upstream == Upstream::Direct {
            // Its route would carry no `rate_limits`: the service would never be asked.
            return Err(Failure::BadInput(
                "--rls needs an --upstream address: Envoy's ratelimit filter skips routes \
                 that answer themselves (direct)"
                    .into(),
            ));
        }
        let Some(addr) = args.rls else {
            let yaml = sluice_envoy_config::render(&options).map_err(anyhow::Error::from)?;
            return write_output(args.output.as_deref(), &yaml);
        };
        let (domain, mut descriptors) = match &args.rules {
            Some(path) => rule_descriptors(path, args)?,
            None => (
                args.rls_domain.clone().unwrap_or_else(|| "sluice".into()),
                Vec::new(),
            ),
        };
        if !args.rls_action.is_empty() {
            descriptors.insert(0, args.rls_action.clone());
        }
        descriptors.extend(args.rls_descriptor.iter().cloned());
        if descriptors.is_empty() {
            descriptors.push(vec![RlsAction::RemoteAddress]);
        }
        options.rls = Some(RlsService {
            addr,
            domain,
            descriptors,
            timeout_ms: args.rls_timeout_ms,
            fail_closed: args.rls_fail_closed,
        });
        let yaml = sluice_envoy_config::render(&options).map_err(anyhow::Error::from)?;
        return write_output(args.output.as_deref(), &yaml);
    }
    let Some(filter) = &args.filter else {
        return Err(Failure::BadInput(
            "--filter is required without --rls or --rlqs".into(),
        ));
    };
    if args.rls_token.is_some() || args.rls_ca.is_some() {
        return Err(Failure::BadInput(
            "--rls-token and --rls-ca apply only with --rls or --rlqs".into(),
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

/// `--PREFIX-ca` and the flags beside it (`admin` or `rls`), with absolute paths (Envoy
/// resolves relative ones against its own working directory). Files that cannot be read
/// here are refused: they are usually on the machine Envoy runs on, and a typo is best
/// caught now.
fn tls_files(
    prefix: &str,
    ca: Option<&Path>,
    sni: Option<&String>,
    client: Option<(&Path, &Path)>,
) -> Result<Option<AdminTls>, Failure> {
    let Some(ca) = ca else {
        return Ok(None);
    };
    let file = |flag: &str, path: &Path| -> Result<PathBuf, Failure> {
        let flag = format!("{prefix}-{flag}");
        let absolute = std::path::absolute(path)
            .map_err(|e| Failure::BadInput(format!("--{flag} {}: {e}", path.display())))?;
        std::fs::File::open(&absolute)
            .map_err(|e| Failure::BadInput(format!("--{flag} {}: {e}", path.display())))?;
        Ok(absolute)
    };
    let mut tls = AdminTls::new(file("ca", ca)?);
    tls.sni = sni.cloned();
    if let Some((cert, key)) = client {
        tls.client_cert = Some((file("client-cert", cert)?, file("client-key", key)?));
    }
    Ok(Some(tls))
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
