//! The admin API connection (`--admin-url` and the flags beside it): where the admin API
//! is, how its certificate is checked, the `sluice_admin` cluster that reaches its
//! replicas, and the control service that long-polls it from inside Envoy: a singleton
//! bootstrap extension, or (`--control worker`) a `control` section in the filter's
//! plugin configuration, for one elected worker to run.

use std::path::PathBuf;
use std::str::FromStr;

use serde_json::{Value, json};
use sluice_core::config::ControlConfigSpec;
use sluice_core::listening::Scheme;

use crate::error::{EnvoyConfigError, field_errors};

/// The cluster through which the control service reaches the admin API.
pub const ADMIN_CLUSTER: &str = "sluice_admin";
/// Plugin name and root id of the control service: the singleton inside Envoy that
/// long-polls the admin API and publishes rulesets to the filter's shared data.
pub const CONTROL_ROOT_ID: &str = "sluice_control";

/// Where the admin API is: `--admin-url http://HOST:PORT` or `https://HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminUrl {
    /// `https`: the cluster gets an upstream TLS context ([`AdminTls`]).
    pub scheme: Scheme,
    /// An IP address (a STATIC cluster) or a DNS name (a STRICT_DNS cluster).
    pub host: String,
    pub port: u16,
}

impl AdminUrl {
    /// `SCHEME://HOST:PORT`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme.as_str(), self.authority())
    }

    /// A loopback address, or `localhost`: traffic that never leaves the host.
    pub fn is_loopback(&self) -> bool {
        self.ip().is_some_and(|ip| ip.is_loopback()) || self.host.eq_ignore_ascii_case("localhost")
    }

    /// `HOST:PORT`, the `:authority` the control service sends.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn ip(&self) -> Option<std::net::IpAddr> {
        self.host.parse().ok()
    }
}

impl FromStr for AdminUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "`{s}` is not http://HOST:PORT or https://HOST:PORT (e.g. https://127.0.0.1:8443)"
            )
        };
        let (scheme, rest) = if let Some(rest) = s.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else {
            (Scheme::Http, s.strip_prefix("http://").ok_or_else(bad)?)
        };
        let authority = rest.trim_end_matches('/');
        if authority.contains('/') || authority.is_empty() {
            return Err(bad());
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, port) = v6.split_once(']').ok_or_else(bad)?;
            (host, port.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        let port = match (port, scheme) {
            (Some(p), _) => p.parse().map_err(|_| bad())?,
            (None, Scheme::Http) => 80,
            (None, Scheme::Https) => 443,
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(AdminUrl {
            scheme,
            host: host.to_string(),
            port,
        })
    }
}

/// How Envoy checks the admin API's certificate for an `https://` admin URL
/// (`--admin-ca`, `--admin-sni`, `--admin-client-cert`/`--admin-client-key`).
///
/// Paths are absolute: Envoy reads them at start-up relative to its own working directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminTls {
    /// PEM certificates of the CAs the admin API's certificate must chain to. Required:
    /// without a validation context Envoy accepts any certificate at all.
    pub ca: PathBuf,
    /// The server name sent in the handshake and required in the certificate's subject
    /// alternative names; by default the URL's host (for an IP address: no SNI, and the
    /// certificate must name that IP).
    pub sni: Option<String>,
    /// A client certificate for an admin API (or a proxy in front of it) that asks for
    /// one: PEM certificate chain and private key.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl AdminTls {
    pub fn new(ca: impl Into<PathBuf>) -> AdminTls {
        AdminTls {
            ca: ca.into(),
            sni: None,
            client_cert: None,
        }
    }

    pub(crate) fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.ca).chain(self.client_cert.iter().flat_map(|(c, k)| [c, k]))
    }
}

/// How the proxy reaches the admin API for its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminConnection {
    pub url: AdminUrl,
    /// The Envoy cluster the control service calls: [`ADMIN_CLUSTER`], which this crate
    /// defines, unless the platform provides its own (Istio's
    /// `outbound|8080||sluice-admin.sluice.svc.cluster.local`).
    pub cluster: String,
    /// Further replicas of the same admin API (`sluice serve` processes sharing one
    /// PostgreSQL database): the control service's cluster spreads its requests over all
    /// of them, health-checks them, and leaves out one that stops answering.
    pub replicas: Vec<AdminUrl>,
    /// A token with the `proxy` role.
    pub token: String,
    /// How the proxy names itself; the control service defaults to Envoy's node id.
    pub proxy_id: Option<String>,
    /// How long the admin API may hold a poll (1 to 60 s).
    pub poll_timeout_seconds: u32,
    /// How often fleet-wide buckets are synced; `None` for the control service's default.
    pub sync_interval_ms: Option<u32>,
    /// Certificate checks for an `https://` URL (required there, refused for `http://`).
    pub tls: Option<AdminTls>,
    /// Allows an `http://` URL that is not loopback (`--insecure`): the proxy token then
    /// crosses the network in clear text.
    pub insecure: bool,
}

impl AdminConnection {
    pub fn new(url: AdminUrl, token: impl Into<String>) -> Self {
        AdminConnection {
            url,
            cluster: ADMIN_CLUSTER.to_string(),
            replicas: Vec::new(),
            token: token.into(),
            proxy_id: None,
            poll_timeout_seconds: 30,
            sync_interval_ms: None,
            tls: None,
            insecure: false,
        }
    }

    /// Every admin URL: the first, then the replicas.
    pub fn urls(&self) -> impl Iterator<Item = &AdminUrl> {
        std::iter::once(&self.url).chain(&self.replicas)
    }

    /// Refuses what would send the proxy token in clear text, or over TLS unchecked.
    pub(crate) fn check_transport(&self) -> Result<(), EnvoyConfigError> {
        if let Some(other) = self.replicas.iter().find(|r| r.scheme != self.url.scheme) {
            return Err(EnvoyConfigError::MixedAdminSchemes(
                self.url.url(),
                other.url(),
            ));
        }
        if let Some(remote) = self.urls().find(|u| !u.is_loopback())
            && self.url.scheme == Scheme::Http
            && self.tls.is_none()
            && !self.insecure
        {
            return Err(EnvoyConfigError::PlainHttpToRemote(remote.url()));
        }
        match (self.url.scheme, &self.tls) {
            (Scheme::Https, None) => Err(EnvoyConfigError::AdminCaMissing(self.url.url())),
            (Scheme::Http, Some(_)) => Err(EnvoyConfigError::AdminTlsWithoutHttps(self.url.url())),
            (Scheme::Https, Some(tls)) => match tls.paths().find(|p| !p.is_absolute()) {
                Some(relative) => Err(EnvoyConfigError::RelativeTlsPath(relative.clone())),
                None => Ok(()),
            },
            (Scheme::Http, None) => Ok(()),
        }
    }

    /// The control service's configuration, checked as the control service checks it:
    /// the singleton's whole configuration, or the `control` section of the filter's
    /// plugin configuration in worker mode.
    pub fn control_spec(&self) -> Result<ControlConfigSpec, EnvoyConfigError> {
        let mut spec = ControlConfigSpec::new(&self.cluster, &self.url.authority(), &self.token);
        spec.poll_timeout_seconds = self.poll_timeout_seconds;
        spec.proxy_id = self.proxy_id.clone();
        if let Some(ms) = self.sync_interval_ms {
            spec.sync_interval_ms = ms;
        }
        spec.checked()
            .map_err(|e| EnvoyConfigError::InvalidControlConfig(field_errors(e)))
    }
}

/// The cluster that reaches the admin API, one endpoint per admin URL: STATIC when every
/// host is an IP address, STRICT_DNS otherwise (a name with several addresses is several
/// endpoints too); with TLS, checked against its CA.
///
/// With more than one endpoint, Envoy fails over between them: it health-checks each
/// replica's `/readyz` every second (two failures mark it down, one success up again),
/// and a replica that refuses a connection or answers 5xx is ejected at once (outlier
/// detection), so the control service's next poll, a second later, reaches a live one.
pub(crate) fn admin_cluster(admin: &AdminConnection) -> Value {
    let urls: Vec<&AdminUrl> = admin.urls().collect();
    let endpoints: Vec<Value> = urls
        .iter()
        .map(|url| {
            json!({ "endpoint": { "address": {
                "socket_address": { "address": url.host, "port_value": url.port },
            } } })
        })
        .collect();
    let all_ips = urls.iter().all(|url| url.ip().is_some());
    let mut cluster = json!({
        "name": admin.cluster,
        "type": if all_ips { "STATIC" } else { "STRICT_DNS" },
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": admin.cluster,
            "endpoints": [{ "lb_endpoints": endpoints }],
        },
    });
    if urls.len() > 1 {
        cluster["health_checks"] = json!([{
            "timeout": "1s",
            "interval": "1s",
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            "http_health_check": { "path": "/readyz" },
        }]);
        cluster["outlier_detection"] = json!({
            "consecutive_5xx": 1,
            "consecutive_local_origin_failure": 1,
            "split_external_local_origin_errors": true,
            "interval": "1s",
            "base_ejection_time": "5s",
            "max_ejection_percent": 100,
        });
    }
    if let Some(tls) = &admin.tls {
        let hosts: Vec<&str> = urls.iter().map(|url| url.host.as_str()).collect();
        cluster["transport_socket"] = upstream_tls(&hosts, tls);
    }
    cluster
}

/// Envoy's `UpstreamTlsContext` for a cluster whose endpoints are `hosts` (names or IP
/// addresses): the admin API's, or the rate limit service's. A trusted CA alone checks
/// only the chain: the expected name is matched against the certificate's subject
/// alternative names explicitly, or any certificate from that CA would do.
pub(crate) fn upstream_tls(hosts: &[&str], tls: &AdminTls) -> Value {
    let file = |path: &PathBuf| json!({ "filename": path.to_string_lossy() });
    let ip = |host: &str| host.parse::<std::net::IpAddr>().ok();
    let san = |host: &str| match ip(host) {
        Some(ip) => json!({ "san_type": "IP_ADDRESS", "matcher": { "exact": ip.to_string() } }),
        None => json!({ "san_type": "DNS", "matcher": { "exact": host } }),
    };
    // SNI carries host names only (RFC 6066): an IP address is matched as an IP SAN and
    // not sent. The cluster sends one SNI, the first URL's; a certificate naming any of
    // the admin URLs' hosts passes.
    let (sni, sans) = match &tls.sni {
        Some(name) => (
            Some(name.as_str()),
            vec![json!({ "san_type": "DNS", "matcher": { "exact": name } })],
        ),
        None => (
            hosts.first().copied().filter(|host| ip(host).is_none()),
            hosts.iter().map(|host| san(host)).collect(),
        ),
    };
    let mut common = json!({
        "validation_context": {
            "trusted_ca": file(&tls.ca),
            "match_typed_subject_alt_names": sans,
        },
    });
    if let Some((cert, key)) = &tls.client_cert {
        common["tls_certificates"] =
            json!([{ "certificate_chain": file(cert), "private_key": file(key) }]);
    }
    let mut context = json!({
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
        "common_tls_context": common,
    });
    if let Some(sni) = sni {
        context["sni"] = json!(sni);
    }
    json!({ "name": "envoy.transport_sockets.tls", "typed_config": context })
}

/// The control service: a singleton on Envoy's main thread, in the filter's VM, that
/// long-polls the admin API and publishes each new ruleset to shared data.
pub(crate) fn control_service(
    admin: &AdminConnection,
    vm_config: Value,
) -> Result<Value, EnvoyConfigError> {
    // Checked here as the control service will check it, so a bad value is refused now.
    let control_json = serde_json::to_string(&admin.control_spec()?)
        .map_err(|e| EnvoyConfigError::Serialise(e.to_string()))?;
    Ok(json!({
        "name": "envoy.bootstrap.wasm",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.wasm.v3.WasmService",
            "singleton": true,
            "config": {
                "name": CONTROL_ROOT_ID,
                "root_id": CONTROL_ROOT_ID,
                "vm_config": vm_config,
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": control_json,
                },
            },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use crate::{Upstream, build, render};

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

    #[test]
    fn an_admin_url_adds_the_control_service_and_its_cluster() {
        let config = parse(&render(&with_admin("http://127.0.0.1:8080")).unwrap());
        let clusters = config["static_resources"]["clusters"].as_array().unwrap();
        assert_eq!(clusters.len(), 2);
        assert_loopback_cluster(&clusters[1], ADMIN_CLUSTER, 8080);

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
    fn a_named_admin_host_gets_a_dns_cluster() {
        // Plain HTTP to a remote host needs --insecure (see the clear-text test below).
        let mut opts = with_admin("http://admin.internal:9000/");
        if let Some(admin) = opts.admin.as_mut() {
            admin.insecure = true;
        }
        let config = parse(&render(&opts).unwrap());
        let admin = &config["static_resources"]["clusters"][1];
        assert_eq!(admin["type"], "STRICT_DNS");
        let control = embedded_control(&config);
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
                let value = embedded_control(&parse(&yaml));
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
        let control = embedded_control(&config);
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
}
