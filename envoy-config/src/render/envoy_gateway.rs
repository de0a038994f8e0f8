//! `sluice render envoy-gateway`: an `EnvoyExtensionPolicy` running the filter, and the
//! `EnvoyPatchPolicy` that adds the admin API's cluster to the Gateway's Envoys.

use serde_json::json;
use sluice_core::config::FilterConfigSpec;
use sluice_core::listening::Scheme;

use super::follow::{Follow, TOKEN_PLACEHOLDER, plugin_config};
use super::kubernetes::AdminService;
use super::resources::{
    GATEWAY_API, RenderError, Rendered, TargetRef, check_name, check_sha256, default_filter_image,
    metadata,
};
use crate::admin::{ADMIN_CLUSTER, AdminConnection, admin_cluster};
use crate::plugin::PLUGIN_NAME;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{example_rules, filter_reads, of_kind};
    use crate::{EnvoyConfigOptions, Upstream, build};

    #[test]
    fn envoy_gateway_adds_the_cluster_the_bootstrap_would_have() {
        let mut options = EnvoyGatewayOptions::new("default", "eg");
        options.admin.insecure = true;
        options.filter = example_rules();
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
}
