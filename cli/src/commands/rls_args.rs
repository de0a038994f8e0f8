//! The flags that point Envoy's native rate limit filter (`--rls`) and quota filter
//! (`--rlqs`) at Sluice's gRPC listener, and what they make: the same for `sluice
//! envoy-config` (a whole bootstrap) and `sluice render ratelimit` (its pieces), so the
//! two cannot drift.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sluice_envoy_config::{
    AdminTls, KeyHeader, RlqsService, RlsAction, RlsCredentials, RlsService, descriptors_for_rules,
    rls_domains,
};

use super::Failure;

#[derive(Debug, clap::Args)]
pub struct RlsArgs {
    /// Envoy's native rate limit filter
    /// (envoy.filters.http.ratelimit) asking Sluice's rate limit service at this address
    /// (`sluice serve --rls-listen`), with X-RateLimit headers, failing open.
    #[arg(long, value_name = "IP:PORT")]
    pub rls: Option<SocketAddr>,
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
    /// Envoy's quota filter (besides --rls, or alone)
    /// (envoy.filters.http.rate_limit_quota, experimental in Envoy) asking Sluice's quota
    /// service at this address (`sluice serve --rls-listen`), failing open.
    #[arg(long, value_name = "IP:PORT", conflicts_with = "rules")]
    pub rlqs: Option<SocketAddr>,
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
    pub rls_token: Option<String>,
    /// With --rls-token and without --rls-ca: allow a service address that is not
    /// loopback, the token crossing the network in clear text (a network you trust, or
    /// one a service mesh encrypts). Refused without it.
    #[arg(long)]
    pub rls_insecure: bool,
    /// With --rls/--rlqs: speak TLS to the service (`sluice serve --tls-cert`), checking
    /// its certificate against these PEM CA certificates.
    #[arg(long, value_name = "FILE")]
    pub rls_ca: Option<PathBuf>,
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

impl RlsArgs {
    /// The rate limit and quota filters' settings and what both show the listener, with
    /// the route's descriptors made from the rules file at `rules` when given.
    pub fn services(
        &self,
        rules: Option<&Path>,
    ) -> Result<(Option<RlsService>, Option<RlqsService>, RlsCredentials), Failure> {
        let rlqs = self.rlqs.map(|addr| RlqsService {
            addr,
            domain: self.rlqs_domain.clone(),
            bucket: self.rlqs_bucket.clone(),
            reporting_interval_ms: self.rlqs_reporting_interval_ms,
            fail_closed: self.rlqs_fail_closed,
        });
        if let Some(rlqs) = &rlqs {
            rlqs.check().map_err(Failure::BadInput)?;
        }
        let credentials = RlsCredentials {
            token: self.rls_token.clone(),
            insecure: self.rls_insecure,
            tls: tls_files(
                "rls",
                self.rls_ca.as_deref(),
                self.rls_sni.as_ref(),
                self.rls_client_cert
                    .as_deref()
                    .zip(self.rls_client_key.as_deref()),
            )?,
        };
        let Some(addr) = self.rls else {
            return Ok((None, rlqs, credentials));
        };
        let (domain, mut descriptors) = match rules {
            Some(path) => rule_descriptors(path, self)?,
            None => (
                self.rls_domain.clone().unwrap_or_else(|| "sluice".into()),
                Vec::new(),
            ),
        };
        if !self.rls_action.is_empty() {
            descriptors.insert(0, self.rls_action.clone());
        }
        descriptors.extend(self.rls_descriptor.iter().cloned());
        if descriptors.is_empty() {
            descriptors.push(vec![RlsAction::RemoteAddress]);
        }
        let rls = RlsService {
            addr,
            domain,
            descriptors,
            timeout_ms: self.rls_timeout_ms,
            fail_closed: self.rls_fail_closed,
        };
        Ok((Some(rls), rlqs, credentials))
    }
}

/// The domain and the descriptors made for the `descriptor` rules of the rules file at
/// `path` (`--rls` with `--rules`).
fn rule_descriptors(path: &Path, args: &RlsArgs) -> Result<(String, Vec<Vec<RlsAction>>), Failure> {
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

/// `--PREFIX-ca` and the flags beside it (`admin` or `rls`), with absolute paths (Envoy
/// resolves relative ones against its own working directory). Files that cannot be read
/// here are refused: they are usually on the machine Envoy runs on, and a typo is best
/// caught now.
pub(super) fn tls_files(
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
