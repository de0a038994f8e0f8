//! `sluice render istio`: a `WasmPlugin` whose plugin configuration carries the `control`
//! section, and for an admin API outside the mesh the `ServiceEntry` (and over https the
//! `DestinationRule`) that gives Istio its outbound cluster.

use serde_json::{Map, Value, json};
use sluice_core::config::FilterConfigSpec;
use sluice_core::listening::Scheme;

use super::follow::{Follow, plugin_config};
use super::kubernetes::AdminService;
use super::resources::{
    RenderError, Rendered, TargetRef, check_name, check_sha256, default_filter_image, metadata,
};
use crate::admin::AdminUrl;
use crate::error::EnvoyConfigError;
use crate::plugin::PLUGIN_NAME;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::{ProxyToken, TOKEN_PLACEHOLDER};
    use crate::testing::{example_rules, filter_reads, of_kind};

    #[test]
    fn istio_follows_a_mesh_service_through_its_outbound_cluster() {
        let mut options = IstioOptions::new("shop");
        options.filter = example_rules();
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
}
