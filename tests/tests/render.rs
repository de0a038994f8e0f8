//! `sluice render`'s output, checked by the tools that will read it: every core
//! Kubernetes resource by `kubernetes-validate --strict` against a pinned Kubernetes
//! version (unknown fields fail), every custom resource (Istio, Envoy Gateway, Prometheus
//! Operator) by `check-jsonschema` against our schemas in `deploy/schemas/`, and the filter
//! snippet for one's own Envoy by `envoy --mode validate` inside a minimal bootstrap.
//!
//! `cargo xtask test` provisions both validators in `.venv/` and passes their paths; so
//! that a validator that accepts anything cannot pass for a working one, each is also
//! shown documents it must refuse.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde::Deserialize as _;
use serde_json::{Value, json};
use sluice_harness::{CHECK_JSONSCHEMA_ENV, KUBERNETES_VALIDATE_ENV};
use sluice_tests::{Artifacts, workspace_root};

/// The Kubernetes release the core resources are checked against.
const KUBERNETES_VERSION: &str = "1.33.0";

/// `sluice render envoy-gateway` for the gateway `eg` in `default`, over plain HTTP.
const ENVOY_GATEWAY: &[&str] = &[
    "envoy-gateway",
    "--namespace",
    "default",
    "--gateway",
    "eg",
    "--insecure",
];

/// Kinds that are not Kubernetes' own, each checked against `deploy/schemas/KIND.schema.json`.
const CUSTOM_KINDS: [&str; 6] = [
    "WasmPlugin",
    "ServiceEntry",
    "DestinationRule",
    "EnvoyExtensionPolicy",
    "EnvoyPatchPolicy",
    "ServiceMonitor",
];

/// A validator from `cargo xtask test` (`var`), or the one it installed in `.venv/bin`.
fn validator(var: &str, command: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".venv/bin").join(command));
    assert!(
        path.is_file(),
        "{command} is missing at {}: run this test with `cargo xtask test` (it installs it \
         into .venv), or set {var}",
        path.display()
    );
    path
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `sluice render ARGS`, its standard output.
fn render(args: &[&str]) -> String {
    let output = run(Command::new(Artifacts::from_env().sluice_bin())
        .arg("render")
        .args(args));
    assert!(
        output.status.success(),
        "sluice render {args:?}: {}",
        text(&output)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).unwrap())
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Checks one resource with the validator its kind calls for; `Err` with the validator's
/// words when it refuses.
fn validate(dir: &Path, resource: &Value) -> Result<(), String> {
    let kind = resource["kind"]
        .as_str()
        .expect("a resource without a kind");
    let name = resource["metadata"]["name"].as_str().unwrap_or("unnamed");
    // JSON is YAML: both validators read it as such.
    let file = dir.join(format!("{kind}-{name}.json"));
    std::fs::write(&file, resource.to_string()).unwrap();
    let output = if CUSTOM_KINDS.contains(&kind) {
        let schema = workspace_root()
            .join("deploy/schemas")
            .join(format!("{kind}.schema.json"));
        run(
            Command::new(validator(CHECK_JSONSCHEMA_ENV, "check-jsonschema"))
                .arg("--schemafile")
                .arg(schema)
                .arg(&file),
        )
    } else {
        let output = run(
            Command::new(validator(KUBERNETES_VALIDATE_ENV, "kubernetes-validate"))
                .args(["--strict", "-k", KUBERNETES_VERSION])
                .arg(&file),
        );
        // A kind it has no schema for only earns a warning: that must not pass as valid.
        let said = text(&output);
        if output.status.success() && !said.contains("passed for resource") {
            return Err(format!("kubernetes-validate did not check {kind}: {said}"));
        }
        output
    };
    if output.status.success() {
        Ok(())
    } else {
        Err(text(&output))
    }
}

fn validate_all(yaml: &str, what: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let resources = documents(yaml);
    assert!(!resources.is_empty(), "{what}: no resources");
    for resource in &resources {
        if let Err(why) = validate(dir.path(), resource) {
            panic!("{what}: {} refused:\n{why}\n{resource:#}", resource["kind"]);
        }
    }
    resources
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn every_rendered_resource_passes_its_schema() {
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "slc_example_proxy_token\n").unwrap();
    let token = token_file.path().to_str().unwrap();
    let digest = "0123456789abcdef".repeat(4);

    let mut kinds = Vec::new();
    kinds.extend(validate_all(
        &render(&["kubernetes"]),
        "kubernetes (SQLite)",
    ));
    kinds.extend(validate_all(
        &render(&[
            "kubernetes",
            "--database",
            "postgres",
            "--replicas",
            "3",
            "--service-monitor",
            "--storage-class",
            "fast",
        ]),
        "kubernetes (PostgreSQL)",
    ));
    kinds.extend(validate_all(
        &render(&[
            "istio",
            "--namespace",
            "shop",
            "--selector",
            "app=storefront",
        ]),
        "istio (mesh Service)",
    ));
    kinds.extend(validate_all(
        &render(&[
            "istio",
            "--namespace",
            "istio-ingress",
            "--target-ref",
            "Gateway/public",
            "--admin-url",
            "https://sluice.example.com",
            "--sha256",
            &digest,
            "--proxy-token-file",
            token,
            "--phase",
            "authz",
        ]),
        "istio (external admin API)",
    ));
    kinds.extend(validate_all(
        &render(
            &[
                ENVOY_GATEWAY,
                &["--sha256", &digest, "--target-ref", "HTTPRoute/api"],
            ]
            .concat(),
        ),
        "envoy-gateway",
    ));
    for kind in [
        "Namespace",
        "ServiceAccount",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
    ]
    .into_iter()
    .chain(CUSTOM_KINDS)
    {
        assert!(
            kinds.iter().any(|k| k == kind),
            "no {kind} was rendered and checked"
        );
    }

    // The committed kustomize base, file by file, as users apply it.
    let base = workspace_root().join("deploy/kubernetes");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&base).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
            continue;
        }
        for resource in documents(&std::fs::read_to_string(&path).unwrap()) {
            if let Err(why) = validate(dir.path(), &resource) {
                panic!("{}: refused:\n{why}", path.display());
            }
        }
    }
}

#[test]
fn the_validators_refuse_wrong_renders() {
    let dir = tempfile::tempdir().unwrap();
    let resources = documents(&render(&["kubernetes", "--service-monitor"]));
    let plugin = documents(&render(&["istio", "--namespace", "shop"])).remove(0);
    let policies = documents(&render(ENVOY_GATEWAY));
    let of_kind = |kind: &str| {
        resources
            .iter()
            .chain(&policies)
            .find(|r| r["kind"] == kind)
            .unwrap()
            .clone()
    };

    let mut wrong = Vec::new();
    let mut deployment = of_kind("Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFs"] = json!(true);
    wrong.push(("an unknown Deployment field", deployment));
    let mut service = of_kind("Service");
    service["spec"]["ports"][0]["port"] = json!("http");
    wrong.push(("a Service port that is not a number", service));
    let mut bad_plugin = plugin.clone();
    bad_plugin["spec"]["failStrategy"] = json!("FAIL_SOMETIMES");
    wrong.push(("a WasmPlugin failStrategy Istio does not have", bad_plugin));
    let mut bad_plugin = plugin.clone();
    bad_plugin["spec"]["failOpen"] = json!(true);
    wrong.push(("an unknown WasmPlugin field", bad_plugin));
    let mut bad_plugin = plugin;
    bad_plugin["spec"]["sha256"] = json!("sha256:abc");
    wrong.push(("a WasmPlugin sha256 that is not 64 hex digits", bad_plugin));
    let mut extension = of_kind("EnvoyExtensionPolicy");
    extension["spec"]["wasm"][0]["failopen"] = extension["spec"]["wasm"][0]["failOpen"].take();
    wrong.push(("a misspelt EnvoyExtensionPolicy field", extension));
    let mut extension = of_kind("EnvoyExtensionPolicy");
    extension["spec"]["wasm"][0]["code"]["type"] = json!("HTTP");
    wrong.push(("an HTTP code source with an image", extension));
    let mut patch = of_kind("EnvoyPatchPolicy");
    patch["spec"]["jsonPatches"][0]["operation"]["op"] = json!("upsert");
    wrong.push(("a JSON patch operation RFC 6902 does not have", patch));
    let mut monitor = of_kind("ServiceMonitor");
    monitor["spec"]["endpoints"][0]["interval"] = json!("half a minute");
    wrong.push(("a ServiceMonitor interval that is not a duration", monitor));

    for (what, resource) in wrong {
        assert!(
            validate(dir.path(), &resource).is_err(),
            "{what} was accepted:\n{resource:#}"
        );
    }
}

#[test]
fn envoy_accepts_the_rendered_filter_snippet() {
    let artifacts = Artifacts::from_env();
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("proxy-token");
    std::fs::write(&token_file, "slc_example_proxy_token").unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "- {name: per-key, key: {header: x-api-key}, limits: [{requests: 5, period: second}]}\n",
    )
    .unwrap();
    let filter = artifacts.filter_wasm().to_str().unwrap().to_string();
    // Static rules alone; the admin API by address (a STATIC cluster) and by name (STRICT_DNS).
    for admin in [
        None,
        Some("http://127.0.0.1:8080"),
        Some("http://localhost:8080"),
    ] {
        let mut args = vec!["envoy", "--filter-wasm", &filter, "--rules"];
        args.push(rules.to_str().unwrap());
        if let Some(url) = admin {
            args.extend(["--admin-url", url, "--proxy-token-file"]);
            args.push(token_file.to_str().unwrap());
        }
        let snippet = documents(&render(&args)).remove(0);
        let mut http_filters = snippet["http_filters"].as_array().unwrap().clone();
        http_filters.push(json!({
            "name": "envoy.filters.http.router",
            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
        }));
        let clusters = snippet.get("clusters").cloned().unwrap_or(json!([]));
        assert_eq!(
            clusters.as_array().unwrap().len(),
            usize::from(admin.is_some())
        );
        // The smallest bootstrap a user's own could be: one listener, one route.
        let bootstrap = json!({
            "static_resources": {
                "listeners": [{
                    "name": "ingress",
                    "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } },
                    "filter_chains": [{ "filters": [{
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                            "stat_prefix": "ingress",
                            "route_config": { "virtual_hosts": [{
                                "name": "all",
                                "domains": ["*"],
                                "routes": [{ "match": { "prefix": "/" }, "direct_response": { "status": 200 } }],
                            }] },
                            "http_filters": http_filters,
                        },
                    }] }],
                }],
                "clusters": clusters,
            },
        });
        let config = dir.path().join("envoy.json");
        std::fs::write(&config, bootstrap.to_string()).unwrap();
        let output = run(Command::new(artifacts.envoy())
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(&config));
        assert!(
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("OK"),
            "{admin:?}: envoy refused the snippet:\n{}\n{bootstrap:#}",
            text(&output)
        );
    }
}

/// `sluice render ratelimit` (no wasm): the native rate limit and quota filters with a
/// proxy token, their cluster and the route's `rate_limits`, put into the smallest
/// bootstrap a user's own could be, pass `envoy --mode validate`.
#[test]
fn envoy_accepts_the_rendered_ratelimit_snippet() {
    let artifacts = Artifacts::from_env();
    let dir = tempfile::tempdir().unwrap();
    let snippet = documents(&render(&[
        "ratelimit",
        "--rls",
        "127.0.0.1:8081",
        "--rls-domain",
        "edge",
        "--rls-action",
        "header:x-api-key=api_key",
        "--rls-descriptor",
        "generic:route=login,remote_address",
        "--rlqs",
        "127.0.0.1:8081",
        "--rlqs-domain",
        "edge",
        "--rlqs-bucket",
        "header:x-api-key=api_key",
        "--rls-token",
        "slc_example_proxy_token",
    ]))
    .remove(0);
    let mut http_filters = snippet["http_filters"].as_array().unwrap().clone();
    assert_eq!(http_filters.len(), 2, "{snippet:#}");
    http_filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" },
    }));
    let mut clusters = snippet["clusters"].as_array().unwrap().clone();
    clusters.push(json!({
        "name": "upstream",
        "type": "STATIC",
        "load_assignment": { "cluster_name": "upstream", "endpoints": [{ "lb_endpoints": [{
            "endpoint": { "address": { "socket_address": { "address": "127.0.0.1", "port_value": 8000 } } },
        }] }] },
    }));
    let bootstrap = json!({
        "static_resources": {
            "listeners": [{
                "name": "ingress",
                "address": { "socket_address": { "address": "127.0.0.1", "port_value": 0 } },
                "filter_chains": [{ "filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "ingress",
                        "route_config": { "virtual_hosts": [{
                            "name": "all",
                            "domains": ["*"],
                            "routes": [{ "match": { "prefix": "/" }, "route": {
                                "cluster": "upstream",
                                "rate_limits": snippet["rate_limits"],
                            } }],
                        }] },
                        "http_filters": http_filters,
                    },
                }] }],
            }],
            "clusters": clusters,
        },
    });
    let config = dir.path().join("envoy.json");
    std::fs::write(&config, bootstrap.to_string()).unwrap();
    let output = run(Command::new(artifacts.envoy())
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(&config));
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("OK"),
        "envoy refused the snippet:\n{}\n{bootstrap:#}",
        text(&output)
    );
}
